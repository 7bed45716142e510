//! Harness programs as values: source plus identity, and the check a candidate must pass
//! before it is worth a rollout (it compiles, its top level runs within the limits, it exports a
//! `solve` function and, optionally, a JSON `meta` object).

use crate::sandbox::{load_module, thread_stack_bytes, JsFailure, LoadStage, Sandbox, SourceLocation};
use crate::Limits;
use rquickjs::{Object, Value};
use sha2::{Digest, Sha256};
use whale_core::ErrorKind;

/// A harness program: an ES module exporting `solve(task, ctx)` (see `docs/harness-api.md`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Harness {
    /// Recorded in every trajectory as `harness_id`.
    pub id: String,
    pub source: String,
}

impl Harness {
    pub fn new(id: impl Into<String>, source: impl Into<String>) -> Self {
        Self { id: id.into(), source: source.into() }
    }

    /// A harness identified by its content hash, so that results are keyed by content, not name.
    pub fn from_source(source: impl Into<String>) -> Self {
        let source = source.into();
        Self { id: content_hash(&source), source }
    }
}

/// SHA-256 of the source, as lowercase hex.
pub fn content_hash(source: &str) -> String {
    Sha256::digest(source.as_bytes()).iter().map(|byte| format!("{byte:02x}")).collect()
}

/// What [`validate`] learned about a harness.
#[derive(Debug, Clone, PartialEq)]
pub struct HarnessInfo {
    /// [`content_hash`] of the source.
    pub hash: String,
    /// The exported `meta` object, if any.
    pub meta: Option<serde_json::Value>,
}

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum HarnessError {
    #[error("the harness does not compile: {message}{}", at(location))]
    Compile { message: String, location: Option<SourceLocation> },
    #[error("the harness's top-level code failed ({kind:?}): {message}{}", at(location))]
    Evaluate { kind: ErrorKind, message: String, location: Option<SourceLocation> },
    #[error("the harness does not export a `solve` function")]
    MissingSolve,
    #[error("the harness exports `solve` as a {found}, not a function")]
    SolveNotAFunction { found: String },
    #[error("the harness's `meta` export must be a JSON object: {reason}")]
    BadMeta { reason: String },
    #[error("cannot start a JavaScript runtime: {0}")]
    Runtime(String),
}

fn at(location: &Option<SourceLocation>) -> String {
    location.map(|l| format!(" at line {}, column {}", l.line, l.column)).unwrap_or_default()
}

/// Compiles the harness and runs its top-level code under `limits` (without a `ctx`), on a
/// thread of its own so that the interpreter's stack limit holds whatever the caller's stack is.
pub fn validate(source: &str, limits: &Limits) -> Result<HarnessInfo, HarnessError> {
    std::thread::scope(|scope| {
        std::thread::Builder::new()
            .name("harness-validate".into())
            .stack_size(thread_stack_bytes(limits))
            .spawn_scoped(scope, || validate_here(source, limits))
            .map_err(|e| HarnessError::Runtime(e.to_string()))?
            .join()
            .map_err(|_| HarnessError::Runtime("the validation thread panicked".into()))?
    })
}

fn validate_here(source: &str, limits: &Limits) -> Result<HarnessInfo, HarnessError> {
    let sandbox = Sandbox::new(limits).map_err(|e| HarnessError::Runtime(e.to_string()))?;
    sandbox.watchdog.resume();
    let meta = sandbox.context.with(|ctx| {
        let exports = load_module(&ctx, source).map_err(|(stage, error)| {
            let failure = JsFailure::catch(&ctx, error);
            let location = failure.location();
            match stage {
                LoadStage::Compile => HarnessError::Compile { message: failure.summary(), location },
                LoadStage::Evaluate => {
                    let error = failure.into_rollout_error(sandbox.watchdog.fatal());
                    HarnessError::Evaluate { kind: error.kind, message: error.message, location }
                }
            }
        })?;
        check_solve(&exports)?;
        read_meta(&ctx, &exports)
    })?;
    Ok(HarnessInfo { hash: content_hash(source), meta })
}

fn check_solve(exports: &Object<'_>) -> Result<(), HarnessError> {
    let solve: Value = exports.get("solve").map_err(|e| HarnessError::Runtime(e.to_string()))?;
    if solve.is_undefined() {
        return Err(HarnessError::MissingSolve);
    }
    if !solve.is_function() {
        return Err(HarnessError::SolveNotAFunction { found: solve.type_name().to_string() });
    }
    Ok(())
}

fn read_meta<'js>(ctx: &rquickjs::Ctx<'js>, exports: &Object<'js>) -> Result<Option<serde_json::Value>, HarnessError> {
    let meta: Value = exports.get("meta").map_err(|e| HarnessError::Runtime(e.to_string()))?;
    if meta.is_undefined() {
        return Ok(None);
    }
    if !meta.is_object() || meta.is_array() || meta.is_function() {
        return Err(HarnessError::BadMeta { reason: format!("it is a {}", meta.type_name()) });
    }
    let json = match ctx.json_stringify(meta) {
        Ok(Some(json)) => json.to_string().map_err(|e| HarnessError::BadMeta { reason: e.to_string() })?,
        Ok(None) => return Err(HarnessError::BadMeta { reason: "it has no JSON form".into() }),
        Err(error) => return Err(HarnessError::BadMeta { reason: JsFailure::catch(ctx, error).summary() }),
    };
    serde_json::from_str(&json).map(Some).map_err(|e| HarnessError::BadMeta { reason: e.to_string() })
}
