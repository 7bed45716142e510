//! The bridge between the script and [`HostState`]: host functions that convert JavaScript
//! values to JSON before touching the host (a getter or `toJSON` in the script may run during
//! conversion, and must not find the host borrowed), turn host failures into JavaScript errors,
//! and record fatal ones with the watchdog so the script cannot swallow them.

use crate::host::{ActionKind, HostFailure, HostState};
use crate::watchdog::Watchdog;
use crate::Limits;
use rquickjs::context::EvalOptions;
use rquickjs::prelude::Func;
use rquickjs::{Coerced, Ctx, Exception, Function, Object, Value};
use std::cell::RefCell;
use std::rc::Rc;
use whale_core::ErrorKind;

const CTX_SOURCE: &str = include_str!("ctx.js");

type Shared = Rc<RefCell<HostState>>;

/// Builds the `ctx` argument of `solve` (and replaces `Math.random` and `console`).
pub(crate) fn build_ctx<'js>(ctx: &Ctx<'js>, host: &Shared, watchdog: &Rc<Watchdog>) -> rquickjs::Result<Value<'js>> {
    let primitives = Object::new(ctx.clone())?;
    primitives.set("chat", chat_function(ctx, host, watchdog)?)?;
    primitives.set("tool", tool_function(ctx, host, watchdog)?)?;
    primitives.set("act", act_function(ctx, host, watchdog)?)?;
    let state = host.clone();
    primitives.set("random", Func::from(move || state.borrow_mut().random()))?;
    let state = host.clone();
    primitives.set("log", Func::from(move |line: String| state.borrow_mut().log(line)))?;
    let state = host.clone();
    primitives.set("observation", Func::from(move || state.borrow().observation()))?;
    let state = host.clone();
    primitives.set("done", Func::from(move || state.borrow().is_done()))?;
    let specs =
        serde_json::to_value(host.borrow().tool_specs()).map_err(|e| Exception::throw_internal(ctx, &e.to_string()))?;
    let builder: Function = ctx.eval_with_options(CTX_SOURCE, ctx_eval_options())?;
    builder.call((primitives, to_js(ctx, &specs)?))
}

fn ctx_eval_options() -> EvalOptions {
    let mut options = EvalOptions::default();
    options.filename = Some("whale-ctx.js".into());
    options
}

/// After a fatal error no host call does any work: it throws again.
fn ensure_alive(ctx: &Ctx<'_>, watchdog: &Watchdog) -> rquickjs::Result<()> {
    match watchdog.fatal() {
        Some(fatal) => Err(Exception::throw_internal(ctx, &fatal.message)),
        None => Ok(()),
    }
}

fn chat_function<'js>(ctx: &Ctx<'js>, host: &Shared, watchdog: &Rc<Watchdog>) -> rquickjs::Result<Function<'js>> {
    let (host, dog) = (host.clone(), watchdog.clone());
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, messages: Value<'js>, options: Value<'js>| {
        ensure_alive(&ctx, &dog)?;
        let most = chat_json_chars(&host.borrow().limits);
        let messages = to_json(&ctx, messages, most, "ctx.llm.chat: `messages`")?;
        let options = to_json(&ctx, options, most, "ctx.llm.chat: `opts`")?;
        let result = host.borrow_mut().chat(&messages, &options);
        reply(&ctx, &dog, result)
    })
}

fn tool_function<'js>(ctx: &Ctx<'js>, host: &Shared, watchdog: &Rc<Watchdog>) -> rquickjs::Result<Function<'js>> {
    let (host, dog) = (host.clone(), watchdog.clone());
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, name: String, args: Value<'js>| {
        ensure_alive(&ctx, &dog)?;
        let most = host.borrow().limits.answer_chars;
        let args = match to_json(&ctx, args, most, &format!("ctx.tools.{name}: the argument list"))? {
            serde_json::Value::Array(args) => args,
            other => vec![other],
        };
        let result = host.borrow_mut().call_tool(&name, args);
        reply(&ctx, &dog, result)
    })
}

fn act_function<'js>(ctx: &Ctx<'js>, host: &Shared, watchdog: &Rc<Watchdog>) -> rquickjs::Result<Function<'js>> {
    let (host, dog) = (host.clone(), watchdog.clone());
    Function::new(ctx.clone(), move |ctx: Ctx<'js>, kind: String, action: Value<'js>| {
        ensure_alive(&ctx, &dog)?;
        let kind = if kind == "play" { ActionKind::Play } else { ActionKind::Submit };
        let result = match answer_text(&action) {
            Ok(text) => host.borrow_mut().act(kind, text),
            Err(found) => Err(HostFailure::Fatal(
                ErrorKind::BadAnswer,
                format!("ctx.env.{}() takes a string or a number, got {found}", kind.method()),
            )),
        };
        reply(&ctx, &dog, result)
    })
}

/// Submits `solve`'s return value as the answer: strings as they are, numbers as JavaScript
/// prints them; anything else is a `bad_answer`.
pub(crate) fn submit_returned<'js>(
    ctx: &Ctx<'js>,
    host: &Shared,
    watchdog: &Watchdog,
    value: Value<'js>,
) -> rquickjs::Result<()> {
    let result = match answer_text(&value) {
        Ok(text) => host.borrow_mut().act(ActionKind::Submit, text),
        Err(found) => Err(HostFailure::Fatal(
            ErrorKind::BadAnswer,
            format!("solve returned {found}; return a string or a number, or answer with ctx.env.submit()"),
        )),
    };
    reply(ctx, watchdog, result).map(drop)
}

/// A string or a number as answer text; otherwise what was found instead.
fn answer_text(value: &Value<'_>) -> Result<String, String> {
    if let Some(text) = value.as_string() {
        return text.to_string().map_err(|e| format!("an unreadable string ({e})"));
    }
    if value.is_number() {
        return value.get::<Coerced<String>>().map(|text| text.0).map_err(|e| e.to_string());
    }
    Err(if value.is_null() { "null".into() } else { format!("a value of type {}", value.type_name()) })
}

fn reply<'js>(
    ctx: &Ctx<'js>,
    watchdog: &Watchdog,
    result: Result<serde_json::Value, HostFailure>,
) -> rquickjs::Result<Value<'js>> {
    match result {
        Ok(value) => to_js(ctx, &value),
        Err(HostFailure::Catchable(message)) => Err(Exception::throw_message(ctx, &message)),
        Err(HostFailure::Fatal(kind, message)) => {
            let error = Exception::from_message(ctx.clone(), &message)?;
            watchdog.fail_at(kind, message, error.stack());
            Err(error.throw())
        }
    }
}

/// Most characters of JSON that `ctx.llm.chat`'s `messages` or `opts` may take: room for a
/// whole `prompt_chars` budget of escaped text, and at least 1 MiB.
fn chat_json_chars(limits: &Limits) -> usize {
    limits.prompt_chars.saturating_mul(8).max(1 << 20)
}

/// A JavaScript value as JSON (`undefined` and functions become `null`). JSON text of more than
/// `most` characters throws a catchable `RangeError` naming `what`, before the host parses it:
/// the text lies in the script's heap, under its limit, but its parsed form would not (a few
/// characters like `[],` become tens of bytes each), nor would a trajectory recording it.
fn to_json<'js>(ctx: &Ctx<'js>, value: Value<'js>, most: usize, what: &str) -> rquickjs::Result<serde_json::Value> {
    if value.is_undefined() {
        return Ok(serde_json::Value::Null);
    }
    let Some(json) = ctx.json_stringify(value)? else { return Ok(serde_json::Value::Null) };
    let text = json.to_cstring()?;
    let text = text.as_str();
    if text.len() > most && text.chars().count() > most {
        return Err(Exception::throw_range(ctx, &format!("{what} is more than {most} characters as JSON")));
    }
    serde_json::from_str(text).map_err(|e| Exception::throw_type(ctx, &e.to_string()))
}

fn to_js<'js>(ctx: &Ctx<'js>, value: &serde_json::Value) -> rquickjs::Result<Value<'js>> {
    let json = serde_json::to_string(value).map_err(|e| Exception::throw_internal(ctx, &e.to_string()))?;
    ctx.json_parse(json)
}
