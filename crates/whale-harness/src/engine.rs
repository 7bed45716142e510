//! Many rollouts at once: a pool of OS threads, each running one rollout at a time in its own
//! JavaScript runtime, all calling one shared policy (so a batching engine sees their calls
//! together). Finished trajectories stream out as JSON lines in completion order; the result
//! comes back in job order.
//!
//! A model call that fails (a server gone after its retries, an engine that stopped) is the
//! infrastructure's failure, not the harness's or the model's: the batch stops taking new jobs
//! and returns [`EngineError::Policy`] instead of trajectories, so such a rollout is never scored
//! as reward 0. The caller's unit of work (a weight step, a search iteration, an evaluation) is
//! then not done, and a resumed run repeats it whole.

use crate::rollout::{run_rollout, RolloutJob};
use crate::sandbox::thread_stack_bytes;
use crate::Limits;
use indicatif::{ProgressBar, ProgressStyle};
use std::io::{IsTerminal, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use whale_core::{ErrorKind, Trajectory};
use whale_policy::{Policy, SamplingParams};

/// Default number of rollout threads.
pub const DEFAULT_THREADS: usize = 64;

/// How to run a batch of rollouts.
pub struct RunOptions<'w> {
    /// Rollouts in flight at once (at least 1).
    pub threads: usize,
    /// Sampling defaults for model calls; a harness's `opts` override them, and each call's
    /// seed is derived from the rollout seed.
    pub sampling: SamplingParams,
    /// Show a progress bar on standard error when it is a terminal.
    pub progress: bool,
    /// Receives each finished trajectory as one JSON line, in completion order, flushed after
    /// every line (so a file sink holds every finished rollout if the process dies).
    pub sink: Option<&'w mut dyn Write>,
}

impl Default for RunOptions<'_> {
    fn default() -> Self {
        Self { threads: DEFAULT_THREADS, sampling: SamplingParams::default(), progress: true, sink: None }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("cannot write a trajectory line: {0}")]
    Sink(std::io::Error),
    #[error("cannot start a rollout thread: {0}")]
    Spawn(std::io::Error),
    /// A model call failed; no rollout of the batch is scored.
    #[error("a model call of task {task_id} failed, so this batch of rollouts did not run: {message}")]
    Policy { task_id: String, message: String },
}

/// Runs every job under `limits` and returns their trajectories in job order. A harness that
/// fails ends only its own rollout; the run stops early if a model call fails, the sink cannot
/// be written or no thread can be started.
pub fn run_rollouts(
    jobs: Vec<RolloutJob>,
    policy: Arc<dyn Policy>,
    limits: &Limits,
    options: RunOptions<'_>,
) -> Result<Vec<Trajectory>, EngineError> {
    let total = jobs.len();
    let workers = options.threads.clamp(1, total.max(1));
    let queue = Mutex::new(jobs.into_iter().enumerate());
    let stop = AtomicBool::new(false);
    let bar = progress_bar(total, options.progress);
    let mut slots: Vec<Option<Trajectory>> = (0..total).map(|_| None).collect();
    let (finished, results) = mpsc::channel();
    let mut failure = None;
    std::thread::scope(|scope| {
        for worker in 0..workers {
            let (finished, queue, stop, policy) = (finished.clone(), &queue, &stop, policy.clone());
            let sampling = &options.sampling;
            let spawned = std::thread::Builder::new()
                .name(format!("rollout-{worker}"))
                .stack_size(thread_stack_bytes(limits))
                .spawn_scoped(scope, move || work(queue, stop, &finished, policy, limits, sampling));
            if let Err(error) = spawned {
                if worker == 0 {
                    stop.store(true, Ordering::Relaxed);
                    failure = Some(EngineError::Spawn(error));
                }
                break;
            }
        }
        drop(finished);
        let mut sink = options.sink;
        let mut tally = Tally::default();
        for (index, trajectory) in results {
            if let (Some(error), None) = (policy_failure(&trajectory), &failure) {
                stop.store(true, Ordering::Relaxed);
                failure = Some(error);
            }
            if let (Some(out), None) = (sink.as_mut(), &failure) {
                if let Err(error) = writeln!(out, "{}", trajectory.to_json_line()).and_then(|()| out.flush()) {
                    stop.store(true, Ordering::Relaxed);
                    failure = Some(EngineError::Sink(error));
                }
            }
            tally.add(&trajectory);
            bar.set_message(tally.to_string());
            bar.inc(1);
            slots[index] = Some(trajectory);
        }
    });
    bar.finish_and_clear();
    match failure {
        Some(error) => Err(error),
        None => Ok(slots.into_iter().flatten().collect()),
    }
}

fn work(
    queue: &Mutex<impl Iterator<Item = (usize, RolloutJob)>>,
    stop: &AtomicBool,
    finished: &mpsc::Sender<(usize, Trajectory)>,
    policy: Arc<dyn Policy>,
    limits: &Limits,
    sampling: &SamplingParams,
) {
    while !stop.load(Ordering::Relaxed) {
        let next = match queue.lock() {
            Ok(mut jobs) => jobs.next(),
            Err(_) => return,
        };
        let Some((index, job)) = next else { return };
        let trajectory = run_rollout(job, policy.clone(), limits, sampling);
        if policy_failure(&trajectory).is_some() {
            stop.store(true, Ordering::Relaxed);
        }
        if finished.send((index, trajectory)).is_err() {
            return;
        }
    }
}

/// The failed model call that ended `trajectory`, if one did.
fn policy_failure(trajectory: &Trajectory) -> Option<EngineError> {
    let error = trajectory.error.as_ref().filter(|error| error.kind == ErrorKind::Policy)?;
    Some(EngineError::Policy { task_id: trajectory.task_id.clone(), message: error.message.clone() })
}

fn progress_bar(total: usize, wanted: bool) -> ProgressBar {
    if !wanted || !std::io::stderr().is_terminal() {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total as u64);
    if let Ok(style) = ProgressStyle::with_template("rollouts {bar:30} {pos}/{len} {msg} [{elapsed} < {eta}]") {
        bar.set_style(style);
    }
    bar
}

/// Running totals shown beside the progress bar.
#[derive(Default)]
struct Tally {
    done: usize,
    reward: f64,
    errors: usize,
}

impl Tally {
    fn add(&mut self, trajectory: &Trajectory) {
        self.done += 1;
        self.reward += trajectory.reward;
        self.errors += usize::from(trajectory.error.is_some());
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mean = if self.done == 0 { 0.0 } else { self.reward / self.done as f64 };
        write!(f, "mean reward {mean:.3}, {} errors", self.errors)
    }
}
