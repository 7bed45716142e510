//! `validate`: what a candidate harness must get right before it is worth a rollout.

use serde_json::json;
use whale_core::ErrorKind;
use whale_harness::{content_hash, validate, HarnessError, Limits, SourceLocation};

fn check(source: &str) -> Result<whale_harness::HarnessInfo, HarnessError> {
    validate(source, &Limits { compute_ms: 200, ..Limits::default() })
}

#[test]
fn a_good_harness_reports_its_meta_and_hash() {
    let source = "export const meta = { name: 'cot', hypothesis: 'think first', k: 2 };\nexport async function solve(task, ctx) { return '1'; }";
    let info = check(source).unwrap();
    assert_eq!(info.meta, Some(json!({"name": "cot", "hypothesis": "think first", "k": 2})));
    assert_eq!(info.hash, content_hash(source));
    assert_eq!(info.hash.len(), 64);
    assert_eq!(check("export function solve() {}").unwrap().meta, None);
}

#[test]
fn a_syntax_error_carries_its_line_and_column() {
    let err = check("export function solve(task, ctx) {\n  const x = 1;\n  return x +* 2;\n}").unwrap_err();
    let HarnessError::Compile { location: Some(SourceLocation { line, column }), ref message } = err else {
        panic!("{err:?}")
    };
    assert_eq!(line, 3);
    assert!(column > 1);
    assert!(message.starts_with("SyntaxError"), "{message}");
    assert!(err.to_string().contains(&format!("at line 3, column {column}")), "{err}");
}

#[test]
fn solve_must_be_an_exported_function() {
    assert_eq!(check("export const meta = {};"), Err(HarnessError::MissingSolve));
    assert_eq!(check("function solve() {}"), Err(HarnessError::MissingSolve));
    assert_eq!(check("export const solve = 42;"), Err(HarnessError::SolveNotAFunction { found: "int".into() }));
}

#[test]
fn meta_must_be_a_json_object() {
    for meta in ["() => 1", "[1, 2]", "'cot'", "{ n: 1n }"] {
        let err = check(&format!("export const meta = {meta};\nexport function solve() {{}}")).unwrap_err();
        assert!(matches!(err, HarnessError::BadMeta { .. }), "{meta}: {err:?}");
    }
}

#[test]
fn top_level_code_runs_under_the_limits() {
    let err = check("const x = null;\nx.y = 1;\nexport function solve() {}").unwrap_err();
    assert!(
        matches!(
            err,
            HarnessError::Evaluate { kind: ErrorKind::Exception, location: Some(SourceLocation { line: 2, .. }), .. }
        ),
        "{err:?}"
    );
    let err = check("while (true) {}\nexport function solve() {}").unwrap_err();
    assert!(matches!(err, HarnessError::Evaluate { kind: ErrorKind::Timeout, .. }), "{err:?}");
    let err = check("const a = [];\nwhile (true) a.push(new Array(100000).fill(0));\nexport function solve() {}")
        .unwrap_err();
    assert!(matches!(err, HarnessError::Evaluate { kind: ErrorKind::OutOfMemory, .. }), "{err:?}");
}

#[test]
fn imports_of_any_module_fail() {
    let err = check("import fs from 'fs';\nexport function solve() {}").unwrap_err();
    assert!(err.to_string().contains("could not load module 'fs'"), "{err}");
    let err = check("import { x } from './helper.js';\nexport function solve() {}").unwrap_err();
    assert!(err.to_string().contains("could not load module"), "{err}");
}
