//! One isolated QuickJS runtime per rollout, built with only the language itself: no module
//! loader (so `import` of anything fails), no `Date` or `performance` (no clock: the same seed
//! must give the same rollout), no file, network or process objects. Limits are enforced by
//! QuickJS's memory and stack limits and by the [`Watchdog`]'s interrupt handler.

use crate::watchdog::{Fatal, Watchdog};
use crate::Limits;
use rquickjs::context::intrinsic::{Eval, Json, MapSet, Promise, Proxy, RegExp, RegExpCompiler, TypedArrays};
use rquickjs::{CaughtError, Context, Ctx, Module, Object, Runtime, Value};
use std::fmt;
use std::rc::Rc;
use std::time::Duration;
use whale_core::{ErrorKind, RolloutError};

/// The file name harness source is compiled under; error locations point into it.
pub const HARNESS_FILE: &str = "harness.js";

/// Most characters of a rollout error's message and of its stack kept in the trajectory (a
/// harness may throw a string of many megabytes).
pub const ERROR_CHARS: usize = 4_096;

/// Native stack for a thread that runs a sandbox: the interpreter's own limit plus room for
/// the host (policy, tools, episode) below it.
pub(crate) fn thread_stack_bytes(limits: &Limits) -> usize {
    limits.stack_bytes + (8 << 20)
}

type Intrinsics = (Eval, RegExpCompiler, RegExp, Json, Proxy, MapSet, TypedArrays, Promise);

/// A context (which owns its runtime) and the watchdog polled by the runtime's interrupt handler.
pub(crate) struct Sandbox {
    pub context: Context,
    pub watchdog: Rc<Watchdog>,
}

impl Sandbox {
    pub fn new(limits: &Limits) -> rquickjs::Result<Self> {
        let runtime = Runtime::new()?;
        runtime.set_memory_limit(limits.memory_bytes);
        runtime.set_max_stack_size(limits.stack_bytes);
        let watchdog = Rc::new(Watchdog::new(Duration::from_millis(limits.compute_ms)));
        let polled = watchdog.clone();
        runtime.set_interrupt_handler(Some(Box::new(move || polled.should_interrupt())));
        let context = Context::custom::<Intrinsics>(&runtime)?;
        Ok(Self { context, watchdog })
    }
}

/// Which step of loading a harness module failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LoadStage {
    Compile,
    Evaluate,
}

/// Compiles and evaluates the harness module (top-level code included) and returns its exports.
pub(crate) fn load_module<'js>(ctx: &Ctx<'js>, source: &str) -> Result<Object<'js>, (LoadStage, rquickjs::Error)> {
    let module = Module::declare(ctx.clone(), HARNESS_FILE, source).map_err(|e| (LoadStage::Compile, e))?;
    let evaluate = || {
        let (module, done) = module.eval()?;
        done.finish::<()>()?;
        module.namespace()
    };
    evaluate().map_err(|e| (LoadStage::Evaluate, e))
}

/// A `line:column` position in the harness source (both 1-based).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SourceLocation {
    pub line: u32,
    pub column: u32,
}

impl SourceLocation {
    /// The innermost `harness.js:L:C` frame of a QuickJS stack trace.
    pub fn find_in(stack: &str) -> Option<Self> {
        let marker = format!("{HARNESS_FILE}:");
        stack.match_indices(&marker).find_map(|(at, _)| {
            let mut numbers = stack[at + marker.len()..].split(':');
            let line = numbers.next()?.parse().ok()?;
            let column: String = numbers.next()?.chars().take_while(char::is_ascii_digit).collect();
            Some(Self { line, column: column.parse().ok()? })
        })
    }
}

impl fmt::Display for SourceLocation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.line, self.column)
    }
}

/// What a failed script evaluation threw, read out of the runtime.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct JsFailure {
    pub kind: ErrorKind,
    /// The error's class (`TypeError`, `SyntaxError`...), or what kind of value was thrown.
    pub name: String,
    pub message: String,
    pub stack: Option<String>,
}

impl JsFailure {
    /// Takes the pending exception behind `error` out of the context.
    pub fn catch(ctx: &Ctx<'_>, error: rquickjs::Error) -> Self {
        match CaughtError::from_error(ctx, error) {
            CaughtError::Exception(exception) => {
                let name = exception.get::<_, Option<String>>("name").ok().flatten().unwrap_or_else(|| "Error".into());
                let message = exception.message().unwrap_or_default();
                let stack = exception.stack().filter(|s| !s.trim().is_empty());
                Self { kind: classify(&name, &message), name, message, stack }
            }
            CaughtError::Value(value) => Self {
                kind: ErrorKind::Exception,
                name: "thrown value".into(),
                message: describe(ctx, &value),
                stack: None,
            },
            CaughtError::Error(rquickjs::Error::Allocation) => Self {
                kind: ErrorKind::OutOfMemory,
                name: "InternalError".into(),
                message: "out of memory".into(),
                stack: None,
            },
            CaughtError::Error(rquickjs::Error::WouldBlock) => Self {
                kind: ErrorKind::Exception,
                name: "Error".into(),
                message: "a promise the harness awaits can never settle".into(),
                stack: None,
            },
            CaughtError::Error(other) => {
                Self { kind: ErrorKind::Exception, name: "Error".into(), message: other.to_string(), stack: None }
            }
        }
    }

    pub fn location(&self) -> Option<SourceLocation> {
        self.stack.as_deref().and_then(SourceLocation::find_in)
    }

    /// `TypeError: x is not a function (harness.js:3:7)`.
    pub fn summary(&self) -> String {
        match self.location() {
            Some(at) => format!("{}: {} ({HARNESS_FILE}:{at})", self.name, self.message),
            None => format!("{}: {}", self.name, self.message),
        }
    }

    /// The rollout error: a fatal error recorded by the host takes precedence over what the
    /// script saw (an interrupted script only sees "interrupted").
    pub fn into_rollout_error(self, fatal: Option<Fatal>) -> RolloutError {
        match fatal {
            Some(fatal) => fatal.into_rollout_error(self.stack),
            None => clipped(RolloutError { kind: self.kind, message: self.summary(), stack: self.stack }),
        }
    }
}

impl Fatal {
    /// The error with where it happened: the stack the host saw, else `stack_when_stopped`.
    pub fn into_rollout_error(self, stack_when_stopped: Option<String>) -> RolloutError {
        let stack = self.stack.or(stack_when_stopped);
        let message = match stack.as_deref().and_then(SourceLocation::find_in) {
            Some(at) => format!("{} ({HARNESS_FILE}:{at})", self.message),
            None => self.message,
        };
        clipped(RolloutError { kind: self.kind, message, stack })
    }
}

/// `error` with its message and stack cut to [`ERROR_CHARS`] characters each.
fn clipped(mut error: RolloutError) -> RolloutError {
    fn clip(text: &mut String) {
        if let Some((cut, _)) = text.char_indices().nth(ERROR_CHARS) {
            let dropped = text[cut..].chars().count();
            text.truncate(cut);
            text.push_str(&format!(" [{dropped} more characters]"));
        }
    }
    clip(&mut error.message);
    if let Some(stack) = error.stack.as_mut() {
        clip(stack);
    }
    error
}

/// QuickJS reports its own limits as ordinary (catchable) errors; these two are recognised.
fn classify(name: &str, message: &str) -> ErrorKind {
    match (name, message) {
        ("InternalError", "out of memory") => ErrorKind::OutOfMemory,
        ("RangeError", "Maximum call stack size exceeded") => ErrorKind::StackOverflow,
        _ => ErrorKind::Exception,
    }
}

/// A thrown non-Error value, as text: `throw 42` -> `42`, `throw {a: 1}` -> `{"a":1}`.
fn describe<'js>(ctx: &Ctx<'js>, value: &Value<'js>) -> String {
    if let Some(text) = value.as_string().and_then(|s| s.to_string().ok()) {
        return text;
    }
    match ctx.json_stringify(value.clone()) {
        Ok(Some(json)) => json.to_string().unwrap_or_else(|_| value.type_name().to_string()),
        _ => value.type_name().to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_innermost_harness_frame_is_the_location() {
        let stack = "    at chat (whale-ctx.js:12:9)\n    at solve (harness.js:3:11)\n    at harness.js:9:1\n";
        assert_eq!(SourceLocation::find_in(stack), Some(SourceLocation { line: 3, column: 11 }));
        assert_eq!(SourceLocation::find_in("    at f (other.js:1:2)\n"), None);
        assert_eq!(SourceLocation { line: 3, column: 11 }.to_string(), "3:11");
    }

    #[test]
    fn quickjs_limit_errors_are_recognised_by_class_and_message() {
        assert_eq!(classify("InternalError", "out of memory"), ErrorKind::OutOfMemory);
        assert_eq!(classify("RangeError", "Maximum call stack size exceeded"), ErrorKind::StackOverflow);
        assert_eq!(classify("Error", "out of memory"), ErrorKind::Exception);
    }

    #[test]
    fn long_messages_and_stacks_are_clipped() {
        let error =
            RolloutError { kind: ErrorKind::Exception, message: "é".repeat(5000), stack: Some("s".repeat(10)) };
        let error = clipped(error);
        assert_eq!(error.message, format!("{} [904 more characters]", "é".repeat(ERROR_CHARS)));
        assert_eq!(error.stack.as_deref(), Some("ssssssssss"));
    }
}
