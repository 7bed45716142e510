//! The reason this crate exists: a harness author compiles no tensor library. The normal
//! dependency graphs of the policy vocabulary, the tokenizer and chat template (whale-text), the
//! harness runtime and the search must not reach candle; whale-lm's must, so the check is seen to find it where it is.

use std::process::Command;

/// The packages in the normal (not dev, not build) dependency graph of `package`, on this host.
fn normal_dependencies(package: &str) -> Vec<String> {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "--edges", "normal", "--prefix", "none", "--format", "{p}", "--package", package])
        .args(["--manifest-path", concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml")])
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo tree -p {package}: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout)
        .expect("utf-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_policy_the_text_the_harness_and_the_search_compile_without_candle() {
    for package in ["whale-policy", "whale-text", "whale-harness", "whale-search"] {
        let dependencies = normal_dependencies(package);
        assert!(dependencies.iter().any(|name| name == "whale-core"), "{package}: {dependencies:?}");
        let candle: Vec<_> = dependencies.iter().filter(|name| name.starts_with("candle")).collect();
        assert!(candle.is_empty(), "{package} depends on {candle:?}");
    }
    assert!(normal_dependencies("whale-lm").iter().any(|name| name == "candle-core"));
}
