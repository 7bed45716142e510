//! A second thread for half of a one-row product, kept awake while such work keeps coming.
//!
//! A decoding step of one sequence multiplies one row by every weight; `gemm` runs each such
//! product on one thread, bound by one core's memory bandwidth. Handing half of the outputs to
//! rayon's pool costs the wake-up of a sleeping worker (tens of microseconds, more than half of
//! most of these products takes): only the LM head gained from it. This thread instead stays
//! awake for [`SPIN`] after each half, yielding its core in a loop rather than sleeping, so the
//! next half is picked up within a microsecond while any other thread that is ready to run
//! still gets the core (spinning without yielding halved whale serve's one-request speed on a
//! machine where another server polled). Then it parks. The caller takes the half back and runs
//! it itself when the thread has not started it by the time the caller's own half is done, so
//! a parked, busy or missing helper never makes a product much slower than running it alone.

use candle_core::Tensor;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// Work for the helper: half of a product.
pub(super) type Half = Box<dyn FnOnce() -> candle_core::Result<Tensor> + Send>;

/// How long the helper stays awake without work before it parks (a one-sequence decoding step
/// hands it a half every few microseconds).
const SPIN: Duration = Duration::from_micros(60);

/// Spins of a caller waiting for the helper's half before it yields its core between checks.
const WAIT_SPINS: u32 = 1 << 12;

/// `state`: nothing posted, a half posted, the helper running it, its result ready.
const IDLE: u8 = 0;
const POSTED: u8 = 1;
const RUNNING: u8 = 2;
const DONE: u8 = 3;

struct Helper {
    /// Held by the one caller using the helper; others run both halves themselves.
    caller: Mutex<()>,
    state: AtomicU8,
    half: Mutex<Option<Half>>,
    result: Mutex<Option<candle_core::Result<Tensor>>>,
    thread: std::thread::Thread,
}

/// The process's helper, started on first use; `None` if its thread could not start.
fn helper() -> Option<&'static Helper> {
    static HELPER: OnceLock<Option<&'static Helper>> = OnceLock::new();
    *HELPER.get_or_init(|| {
        let (sender, receiver) = std::sync::mpsc::channel::<&'static Helper>();
        let handle = std::thread::Builder::new()
            .name("whale-lm-helper".to_string())
            .spawn(move || {
                if let Ok(helper) = receiver.recv() {
                    helper.serve();
                }
            })
            .ok()?;
        let helper: &'static Helper = Box::leak(Box::new(Helper {
            caller: Mutex::new(()),
            state: AtomicU8::new(IDLE),
            half: Mutex::new(None),
            result: Mutex::new(None),
            thread: handle.thread().clone(),
        }));
        sender.send(helper).ok()?;
        Some(helper)
    })
}

impl Helper {
    fn serve(&self) {
        let mut idle_since = Instant::now();
        loop {
            let claimed = self.state.load(Ordering::Acquire) == POSTED
                && self.state.compare_exchange(POSTED, RUNNING, Ordering::AcqRel, Ordering::Acquire).is_ok();
            if claimed {
                let half = self.half.lock().unwrap_or_else(PoisonError::into_inner).take();
                // A half that panics must still answer, or its caller would wait forever.
                let result = half.map(|half| {
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(half))
                        .unwrap_or_else(|_| Err(candle_core::Error::Msg("a product panicked".into())))
                });
                *self.result.lock().unwrap_or_else(PoisonError::into_inner) = result;
                self.state.store(DONE, Ordering::Release);
                idle_since = Instant::now();
            } else if idle_since.elapsed() > SPIN {
                std::thread::park_timeout(Duration::from_millis(100));
                idle_since = Instant::now();
            } else {
                // Yielding rather than spinning: a thread of this process (the caller itself)
                // or another that is ready to run gets the core at once.
                std::thread::yield_now();
            }
        }
    }
}

/// Runs `first` on this thread and `second` on the helper when it takes it in time, else here.
pub(super) fn join(
    first: impl FnOnce() -> candle_core::Result<Tensor>,
    second: Half,
) -> (candle_core::Result<Tensor>, candle_core::Result<Tensor>) {
    let Some(helper) = helper() else { return (first(), second()) };
    let Ok(_caller) = helper.caller.try_lock() else { return (first(), second()) };
    *helper.half.lock().unwrap_or_else(PoisonError::into_inner) = Some(second);
    helper.state.store(POSTED, Ordering::Release);
    helper.thread.unpark();
    let first = first();
    if helper.state.compare_exchange(POSTED, IDLE, Ordering::AcqRel, Ordering::Acquire).is_ok() {
        let second = helper.half.lock().unwrap_or_else(PoisonError::into_inner).take();
        return (first, second.map_or_else(|| Err(candle_core::Error::Msg("the half was lost".into())), |half| half()));
    }
    // The helper is running the half; on a machine with more threads than cores it may have
    // been descheduled, so after a short spin this thread gives its core away while it waits.
    let mut spins = 0u32;
    while helper.state.load(Ordering::Acquire) != DONE {
        spins = spins.saturating_add(1);
        if spins < WAIT_SPINS {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
    let second = helper.result.lock().unwrap_or_else(PoisonError::into_inner).take();
    helper.state.store(IDLE, Ordering::Release);
    (first, second.unwrap_or_else(|| Err(candle_core::Error::Msg("the helper returned no result".into()))))
}
