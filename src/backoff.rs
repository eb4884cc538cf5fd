//! The one exponential backoff: `base × 2^attempt`, capped, optionally with
//! jitter in [50 %, 100 %] of that (seeded, so tests are deterministic). The
//! Manager stream reconnects on it, every watch of the API server retries on
//! it, the Lease is renewed and read on it, and a controller requeues a
//! failing object on it — all with jitter, so a fleet of operators (or the
//! many objects one outage failed at once) does not retry in lock-step.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use rand::{Rng, SeedableRng, rngs::StdRng};

/// Successive delays of one retried thing.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    jitter: Option<StdRng>,
}

impl Backoff {
    /// Delays starting at `base`, doubling, never exceeding `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
            jitter: None,
        }
    }

    /// The same, each delay drawn in [50 %, 100 %] of the doubled one from a
    /// generator seeded with `seed`.
    pub fn with_jitter(self, seed: u64) -> Self {
        Self {
            jitter: Some(StdRng::seed_from_u64(seed)),
            ..self
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.base.saturating_mul(1u32 << self.attempt.min(20)).min(self.cap);
        self.attempt = self.attempt.saturating_add(1);
        match &mut self.jitter {
            Some(rng) => ceiling.mul_f64(rng.random_range(0.5..=1.0)),
            None => ceiling,
        }
    }

    /// Back to the base delay (after a success).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

/// An endless series of delays: how kube-runtime's watch streams take a
/// backoff (`WatchStreamExt::backoff`, `Controller::trigger_backoff`).
impl Iterator for Backoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.next_delay())
    }
}

/// kube-runtime resets a watch's backoff on every event it delivers, so a
/// watch that came back retries from the base delay the next time.
impl kube::runtime::utils::Backoff for Backoff {
    fn reset(&mut self) {
        Backoff::reset(self);
    }
}

/// A seed for a jittered backoff that differs per call and per process:
/// two watches (or two operators) that failed together retry apart.
pub fn seed() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let call = CALLS.fetch_add(1, Ordering::Relaxed);
    // Spread consecutive calls over the whole range (a Weyl sequence step).
    nanos ^ u64::from(std::process::id()).rotate_left(32) ^ call.wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_from_the_base_up_to_the_cap() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(300));
        let delays: Vec<_> = (0..14).map(|_| b.next_delay().as_millis()).collect();
        assert_eq!(&delays[..5], [250, 500, 1000, 2000, 4000]);
        assert_eq!(delays[11], 300_000, "250 ms × 2^11 is past the cap");
        assert_eq!(delays[13], 300_000);
        b.reset();
        assert_eq!(b.next_delay(), Duration::from_millis(250));
    }

    #[test]
    fn jittered_delays_stay_within_half_and_all_of_the_doubled_one() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).with_jitter(7);
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] <= Duration::from_millis(100));
        assert!(delays[3] >= Duration::from_millis(400) && delays[3] <= Duration::from_millis(800));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[7] >= Duration::from_secs(1));
        let again: Vec<_> = {
            let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2)).with_jitter(7);
            (0..8).map(|_| b.next_delay()).collect()
        };
        assert_eq!(delays, again, "the same seed, the same delays");
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }

    #[test]
    fn as_a_watch_backoff_it_never_ends_and_a_delivered_event_starts_it_over() {
        let mut b = Backoff::new(Duration::from_millis(250), Duration::from_secs(4));
        let delays: Vec<_> = b.by_ref().take(10).collect();
        assert_eq!(delays[0], Duration::from_millis(250));
        assert_eq!(delays[9], Duration::from_secs(4), "capped, never given up on");
        kube::runtime::utils::Backoff::reset(&mut b);
        assert_eq!(b.next(), Some(Duration::from_millis(250)));
    }

    #[test]
    fn seeds_differ_from_call_to_call() {
        assert_ne!(seed(), seed());
    }
}
