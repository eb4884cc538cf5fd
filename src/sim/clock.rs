//! Simulated time. The simulator runs a clock that advances `time_scale`
//! times faster than the wall clock, so a 30 s keepalive timeout takes 30 ms
//! at a scale of 1000. Every delay the simulator models is expressed in
//! simulated milliseconds and converted to a real wait here, and nowhere
//! else.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// The longest single real wait; a tiny time scale makes simulated delays
/// astronomically long in real time, and a wait is re-planned after this.
pub const MAX_REAL_WAIT: Duration = Duration::from_secs(3600);

/// A clock whose rate can change while it runs (`set-time-scale`): each
/// change re-anchors it, so simulated time stays continuous.
#[derive(Debug, Clone)]
pub struct SimClock {
    anchor_real: Instant,
    anchor_sim_ms: i64,
    scale: f64,
}

impl SimClock {
    /// A clock that starts at the current wall-clock time (so timestamps a
    /// client compares with its own clock are believable) and runs `scale`
    /// times faster.
    pub fn start(scale: f64) -> Self {
        let wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
            .unwrap_or(0);
        Self {
            anchor_real: Instant::now(),
            anchor_sim_ms: wall_ms,
            scale,
        }
    }

    /// Simulated milliseconds since the Unix epoch.
    pub fn now_ms(&self) -> i64 {
        let real_ms = self.anchor_real.elapsed().as_secs_f64() * 1000.0;
        // A float-to-int cast saturates, and so does the sum: an absurd
        // scale stops time at the end of the range instead of overflowing.
        self.anchor_sim_ms.saturating_add((real_ms * self.scale) as i64)
    }

    /// The current scale (simulated seconds per real second).
    pub fn scale(&self) -> f64 {
        self.scale
    }

    /// Changes the rate from now on; simulated time does not jump.
    pub fn set_scale(&mut self, scale: f64) {
        self.anchor_sim_ms = self.now_ms();
        self.anchor_real = Instant::now();
        self.scale = scale;
    }

    /// How long to really wait until simulated instant `at_ms`, at most
    /// [`MAX_REAL_WAIT`] (the caller simply waits again).
    pub fn real_wait_until(&self, at_ms: i64) -> Duration {
        let sim_ms = at_ms.saturating_sub(self.now_ms()).max(0) as f64;
        Duration::try_from_secs_f64(sim_ms / self.scale / 1000.0).map_or(MAX_REAL_WAIT, |d| d.min(MAX_REAL_WAIT))
    }
}

/// A valid time scale: finite and positive.
pub fn valid_scale(scale: f64) -> bool {
    scale.is_finite() && scale > 0.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn real_wait_is_the_simulated_delay_divided_by_the_scale() {
        let clock = SimClock::start(1000.0);
        let wait = clock.real_wait_until(clock.now_ms() + 30_000);
        assert!(wait <= Duration::from_millis(30), "{wait:?}");
    }

    #[test]
    fn changing_the_scale_keeps_time_continuous() {
        let mut clock = SimClock::start(1.0);
        let before = clock.now_ms();
        clock.set_scale(1_000_000.0);
        assert!(clock.now_ms() >= before);
    }

    #[test]
    fn a_tiny_scale_waits_at_most_the_maximum_instead_of_overflowing() {
        let clock = SimClock::start(1e-300);
        assert_eq!(clock.real_wait_until(i64::MAX), MAX_REAL_WAIT);
    }

    #[test]
    fn zero_negative_and_nan_scales_are_invalid() {
        assert!(valid_scale(1000.0));
        for bad in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            assert!(!valid_scale(bad), "{bad}");
        }
    }
}
