//! The rollout's referee: it measures the harness's own compute time (the clock stops while
//! the host waits for the model, a tool or the environment), holds the first fatal error, and
//! answers QuickJS's interrupt polls so that a runaway or already-failed harness is stopped
//! with an exception the script cannot catch.

use std::cell::{Cell, RefCell};
use std::time::{Duration, Instant};
use whale_core::ErrorKind;

/// A limit broken or a host failure: the rollout ends with this error whatever the script does next.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Fatal {
    pub kind: ErrorKind,
    pub message: String,
    /// The script's stack where the limit was broken, when the host saw it happen.
    pub stack: Option<String>,
}

pub(crate) struct Watchdog {
    budget: Duration,
    spent: Cell<Duration>,
    running_since: Cell<Option<Instant>>,
    fatal: RefCell<Option<Fatal>>,
}

impl Watchdog {
    /// A stopped clock with `budget` of compute time.
    pub fn new(budget: Duration) -> Self {
        Self { budget, spent: Cell::new(Duration::ZERO), running_since: Cell::new(None), fatal: RefCell::new(None) }
    }

    /// Starts (or restarts) counting compute time.
    pub fn resume(&self) {
        if self.running_since.get().is_none() {
            self.running_since.set(Some(Instant::now()));
        }
    }

    /// Stops counting until the returned guard is dropped.
    pub fn pause(&self) -> PausedClock<'_> {
        let was_running = self.stop();
        PausedClock { watchdog: self, was_running }
    }

    /// Stops counting; true if the clock was running.
    pub fn stop(&self) -> bool {
        match self.running_since.take() {
            Some(since) => {
                self.spent.set(self.spent.get() + since.elapsed());
                true
            }
            None => false,
        }
    }

    /// Compute time used so far.
    pub fn spent(&self) -> Duration {
        self.spent.get() + self.running_since.get().map_or(Duration::ZERO, |since| since.elapsed())
    }

    /// Records `fatal` unless an earlier fatal error is already recorded (the first cause wins).
    pub fn fail(&self, kind: ErrorKind, message: impl Into<String>) {
        self.fail_at(kind, message, None);
    }

    /// [`Self::fail`] with the script's stack at the point of failure.
    pub fn fail_at(&self, kind: ErrorKind, message: impl Into<String>, stack: Option<String>) {
        let mut slot = self.fatal.borrow_mut();
        if slot.is_none() {
            *slot = Some(Fatal { kind, message: message.into(), stack });
        }
    }

    pub fn fatal(&self) -> Option<Fatal> {
        self.fatal.borrow().clone()
    }

    /// QuickJS's interrupt poll: true stops the script with an uncatchable exception.
    pub fn should_interrupt(&self) -> bool {
        if self.fatal.borrow().is_some() {
            return true;
        }
        if self.spent() > self.budget {
            self.fail(
                ErrorKind::Timeout,
                format!("the harness used more than {} ms of compute time", self.budget.as_millis()),
            );
            return true;
        }
        false
    }

    /// Records a timeout if the harness returned past its budget. QuickJS polls the interrupt
    /// handler between operations, not inside a built-in one, so a single long call (a huge
    /// `JSON.stringify`, say) can carry a harness past its budget to its end unstopped; the
    /// budget holds for it all the same.
    pub fn check_spent_at_end(&self) {
        let spent = self.spent();
        if spent > self.budget {
            self.fail(
                ErrorKind::Timeout,
                format!(
                    "the harness used {} ms of compute time, more than its {} ms; the last of it in a built-in \
                     operation that the sandbox cannot stop midway",
                    spent.as_millis(),
                    self.budget.as_millis()
                ),
            );
        }
    }
}

/// Keeps the compute clock stopped while it lives.
pub(crate) struct PausedClock<'a> {
    watchdog: &'a Watchdog,
    was_running: bool,
}

impl Drop for PausedClock<'_> {
    fn drop(&mut self) {
        if self.was_running {
            self.watchdog.resume();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::thread::sleep;

    #[test]
    fn paused_time_is_not_compute_time() {
        // A budget of 300 ms leaves a loaded machine that much slack between the calls.
        let dog = Watchdog::new(Duration::from_millis(300));
        dog.resume();
        {
            let _paused = dog.pause();
            sleep(Duration::from_millis(600));
        }
        assert!(dog.spent() < Duration::from_millis(300), "{:?}", dog.spent());
        assert!(!dog.should_interrupt());
        sleep(Duration::from_millis(400));
        assert!(dog.should_interrupt());
        assert_eq!(dog.fatal().map(|f| f.kind), Some(ErrorKind::Timeout));
    }

    #[test]
    fn the_first_fatal_error_wins_and_keeps_interrupting() {
        let dog = Watchdog::new(Duration::from_secs(60));
        dog.fail(ErrorKind::CallLimit, "too many model calls");
        dog.fail(ErrorKind::BadAnswer, "later");
        assert!(dog.should_interrupt());
        assert!(dog.should_interrupt());
        let fatal = Fatal { kind: ErrorKind::CallLimit, message: "too many model calls".into(), stack: None };
        assert_eq!(dog.fatal(), Some(fatal));
    }
}
