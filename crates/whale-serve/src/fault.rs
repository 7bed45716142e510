//! Fault injection for testing clients: a seeded pseudo-random fraction of generation requests
//! is answered with 503 before any work, as an overloaded or restarting server would, so a
//! client's retries can be exercised against the real server on loopback.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Decides which requests fail. The draws follow arrival order, so with concurrent clients
/// which request fails varies between runs, but the fraction does not.
pub struct FaultInjector {
    rate: f64,
    rng: Mutex<ChaCha8Rng>,
    injected: AtomicU64,
}

impl FaultInjector {
    /// Fails a fraction `rate` (clamped to [0, 1]) of the requests it is asked about.
    pub fn new(rate: f64, seed: u64) -> Self {
        let rate = if rate.is_finite() { rate.clamp(0.0, 1.0) } else { 0.0 };
        Self { rate, rng: Mutex::new(ChaCha8Rng::seed_from_u64(seed)), injected: AtomicU64::new(0) }
    }

    pub fn rate(&self) -> f64 {
        self.rate
    }

    /// Whether to fail this request; counts the failures injected.
    pub fn should_fail(&self) -> bool {
        if self.rate == 0.0 {
            return false;
        }
        let draw: f64 = self.rng.lock().unwrap_or_else(PoisonError::into_inner).gen();
        let fail = draw < self.rate;
        if fail {
            self.injected.fetch_add(1, Ordering::Relaxed);
        }
        fail
    }

    /// Failures injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_failed_fraction_follows_the_rate_and_the_seed() {
        let injector = FaultInjector::new(0.3, 7);
        let pattern: Vec<bool> = (0..2000).map(|_| injector.should_fail()).collect();
        let failed = pattern.iter().filter(|&&fail| fail).count();
        assert_eq!(injector.injected(), failed as u64);
        assert!((500..700).contains(&failed), "{failed} of 2000 at rate 0.3");
        let again = FaultInjector::new(0.3, 7);
        assert!(pattern.iter().all(|&fail| again.should_fail() == fail));
        assert!(!(0..100).any(|_| FaultInjector::new(0.0, 1).should_fail()));
        assert_eq!(FaultInjector::new(f64::NAN, 1).rate(), 0.0);
    }
}
