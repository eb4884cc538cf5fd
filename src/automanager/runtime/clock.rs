//! The core's clock: wall time at start plus elapsed time, scaled (the
//! demo and the tests compress time to match a simulator's).

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::model::UnixMillis;

/// The core's clock: wall time at start plus elapsed time, scaled.
#[derive(Clone, Copy, Debug)]
pub(super) struct Clock {
    pub(super) origin_wall: UnixMillis,
    origin: Instant,
    pub(super) scale: f64,
}

impl Clock {
    pub(super) fn new(scale: f64) -> Self {
        let origin_wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as UnixMillis);
        Self {
            origin_wall,
            origin: Instant::now(),
            scale: if scale.is_finite() && scale > 0.0 { scale } else { 1.0 },
        }
    }

    pub(super) fn now(&self) -> UnixMillis {
        self.origin_wall + (self.origin.elapsed().as_secs_f64() * 1_000.0 * self.scale) as UnixMillis
    }

    pub(super) fn instant_of(&self, at: UnixMillis) -> Instant {
        let real_ms = ((at - self.origin_wall).max(0) as f64 / self.scale).min(1e12);
        self.origin + Duration::from_secs_f64(real_ms / 1_000.0)
    }
}
