//! One rollout: a harness, one episode and the shared policy in a fresh sandbox, from the
//! module's first line to the verdict, recorded as a [`Trajectory`].

use crate::bindings::{build_ctx, submit_returned};
use crate::harness::Harness;
use crate::host::{HostState, Trace};
use crate::sandbox::{load_module, JsFailure, Sandbox};
use crate::watchdog::Watchdog;
use crate::Limits;
use rquickjs::{Ctx, Exception, Value};
use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;
use whale_core::{ErrorKind, RolloutError, Trajectory, Verdict, WallTime};
use whale_policy::{Policy, SamplingParams};
use whale_tasks::Episode;

/// Where a rollout's episode comes from: built already, or built on the worker thread when the
/// rollout starts (so that a large batch holds only the episodes that are running).
pub enum EpisodeSource {
    Ready(Box<dyn Episode>),
    Factory(Box<dyn FnOnce() -> Box<dyn Episode> + Send>),
}

impl EpisodeSource {
    fn build(self) -> Box<dyn Episode> {
        match self {
            EpisodeSource::Ready(episode) => episode,
            EpisodeSource::Factory(make) => make(),
        }
    }
}

/// One rollout to run.
pub struct RolloutJob {
    pub task_id: String,
    /// The task as the harness may see it (no gold answer): `solve`'s first argument.
    pub task_view: serde_json::Value,
    pub episode: EpisodeSource,
    /// Seeds `ctx.random`, `Math.random` and every model call's sampling.
    pub seed: u64,
    pub harness: Arc<Harness>,
    /// Recorded in the trajectory (results are keyed by harness and weights).
    pub weights_version: u64,
}

type Shared = Rc<RefCell<HostState>>;

/// Runs `job` on the calling thread, which must have [`crate::sandbox::thread_stack_bytes`] of stack.
pub(crate) fn run_rollout(
    job: RolloutJob,
    policy: Arc<dyn Policy>,
    limits: &Limits,
    sampling: &SamplingParams,
) -> Trajectory {
    let started = Instant::now();
    let RolloutJob { task_id, task_view, episode, seed, harness, weights_version } = job;
    let header = Header { task_id, harness_id: harness.id.clone(), weights_version, seed };
    let episode = episode.build();
    let sandbox = match Sandbox::new(limits) {
        Ok(sandbox) => sandbox,
        Err(error) => return header.finish(Trace::default(), Err(startup_error(error)), started),
    };
    let watchdog = sandbox.watchdog.clone();
    let host = Rc::new(RefCell::new(HostState::new(episode, policy, limits, sampling, seed, watchdog.clone())));
    watchdog.resume();
    let outcome = sandbox.context.with(|ctx| drive(&ctx, &harness.source, &task_view, &host, &watchdog));
    watchdog.stop();
    drop(sandbox);
    let mut state = host.borrow_mut();
    let outcome = outcome.map(|()| state.verdict());
    header.finish(std::mem::take(&mut state.trace), outcome, started)
}

/// Loads the harness, calls `solve(task, ctx)`, settles its promise and submits its return value.
fn drive<'js>(
    ctx: &Ctx<'js>,
    source: &str,
    task_view: &serde_json::Value,
    host: &Shared,
    watchdog: &Rc<Watchdog>,
) -> Result<(), RolloutError> {
    let attempt = || -> rquickjs::Result<()> {
        // Built first: it replaces Math.random before any harness code runs.
        let harness_ctx = build_ctx(ctx, host, watchdog)?;
        let exports = load_module(ctx, source).map_err(|(_, error)| error)?;
        let Some(solve) = exports.get::<_, Value>("solve")?.into_function() else {
            return Err(Exception::throw_type(ctx, "the harness does not export a `solve` function"));
        };
        let task = ctx.json_parse(task_view.to_string())?;
        let mut returned: Value = solve.call((task, harness_ctx))?;
        if let Some(promise) = returned.as_promise() {
            returned = promise.finish()?;
        }
        watchdog.check_spent_at_end();
        if !returned.is_undefined() && !host.borrow().has_acted() && watchdog.fatal().is_none() {
            submit_returned(ctx, host, watchdog, returned)?;
        }
        Ok(())
    };
    match attempt() {
        Ok(()) => watchdog.fatal().map_or(Ok(()), |fatal| Err(fatal.into_rollout_error(None))),
        Err(error) => {
            // Reading what was thrown may run the script (a getter, a proxy) into a limit.
            let failure = JsFailure::catch(ctx, error);
            Err(failure.into_rollout_error(watchdog.fatal()))
        }
    }
}

fn startup_error(error: rquickjs::Error) -> RolloutError {
    let kind = match error {
        rquickjs::Error::Allocation => ErrorKind::OutOfMemory,
        _ => ErrorKind::Exception,
    };
    RolloutError { kind, message: format!("cannot start the JavaScript runtime: {error}"), stack: None }
}

/// The fields of a trajectory known before the rollout runs.
struct Header {
    task_id: String,
    harness_id: String,
    weights_version: u64,
    seed: u64,
}

impl Header {
    fn finish(self, trace: Trace, outcome: Result<Verdict, RolloutError>, started: Instant) -> Trajectory {
        let total_ms = started.elapsed().as_secs_f64() * 1e3;
        let wall = WallTime {
            model_ms: trace.model_ms,
            tools_ms: trace.tools_ms,
            harness_ms: (total_ms - trace.model_ms - trace.tools_ms).max(0.0),
        };
        let (reward, success, verdict_detail, error) = match outcome {
            Ok(verdict) => (verdict.reward, verdict.success, verdict.detail, None),
            Err(error) => (0.0, false, String::new(), Some(error)),
        };
        Trajectory {
            task_id: self.task_id,
            harness_id: self.harness_id,
            weights_version: self.weights_version,
            seed: self.seed,
            answer: trace.answer(),
            turns: trace.model_calls.len(),
            model_calls: trace.model_calls,
            tool_calls: trace.tool_calls,
            order: trace.order,
            reward,
            success,
            verdict_detail,
            error,
            prompt_tokens: trace.prompt_tokens,
            completion_tokens: trace.completion_tokens,
            wall,
            log: trace.log,
        }
    }
}
