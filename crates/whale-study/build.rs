//! Records the git commit whale-study is built from as `WHALE_COMMIT`, which a study's result
//! files carry; nothing outside a git checkout. Rebuilt when `HEAD` or a branch moves.

use std::path::Path;
use std::process::Command;

fn main() {
    if let Some(dir) = git(&["rev-parse", "--git-dir"]) {
        println!("cargo:rerun-if-changed={dir}/HEAD");
    }
    if let Some(common) = git(&["rev-parse", "--git-common-dir"]) {
        for moved in ["refs/heads", "packed-refs"] {
            let path = Path::new(&common).join(moved);
            if path.exists() {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
    }
    if let Some(commit) = git(&["rev-parse", "HEAD"]) {
        println!("cargo:rustc-env=WHALE_COMMIT={commit}");
    }
}

/// The trimmed output of a git command that succeeded.
fn git(args: &[&str]) -> Option<String> {
    let output = Command::new("git").args(args).output().ok().filter(|output| output.status.success())?;
    Some(String::from_utf8(output.stdout).ok()?.trim().to_string())
}
