//! What a `coordination.k8s.io` Lease record means to one candidate: who
//! holds it, until when its holder may still act, when a holder renews and
//! when it must stop acting. Pure: instants come in as values; the election
//! ([`super::leader`]) reads and writes the record.
//!
//! The rule that keeps two leaders from acting at once, even when the
//! leader alone is cut off from the API server: a holder stops acting
//! half-way through the grace period after it sent its last successful
//! write ([`Timing::stop_at`]); another candidate takes the Lease only once
//! it has seen the same record, unchanged, for the record's whole duration
//! ([`Sighting::acting_until`]). It saw the record after the holder sent it,
//! so the holder has stopped first whatever the clocks say. A record whose
//! `renewTime` is older than its duration plus the grace (the clock skew
//! tolerated between candidates) by this candidate's own clock is over at
//! once: a holder that died long ago does not hold up a cold start.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// The longest a follower goes without looking at a Lease another holds:
/// a released Lease is taken this soon.
const MAX_POLL: Duration = Duration::from_secs(2);

/// The Lease's timing, as this process holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timing {
    /// How long the Lease is valid without renewal.
    pub duration: Duration,
    /// How long before expiry the holder renews; also the clock skew
    /// tolerated between candidates.
    pub grace: Duration,
}

impl Timing {
    /// When a holder whose last successful write it sent at `wrote` renews.
    pub fn renew_at(&self, wrote: Instant) -> Instant {
        wrote + self.duration.saturating_sub(self.grace)
    }

    /// When a holder whose last successful write it sent at `wrote` stops
    /// acting unless a renewal has succeeded: half-way through the grace
    /// period, so that a renewal has half of it to get through and the
    /// term has the other half to wind down before anyone can take over.
    pub fn stop_at(&self, wrote: Instant) -> Instant {
        wrote + self.duration.saturating_sub(self.grace / 2)
    }

    /// How often a follower looks at a Lease another holds.
    pub fn poll(&self) -> Duration {
        self.grace.min(MAX_POLL)
    }
}

/// The record as this candidate saw it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sighting {
    /// Who holds it; `None` when nobody does (never held, or released).
    pub holder: Option<String>,
    /// Its `resourceVersion`: any write changes it.
    pub version: String,
    /// Its `renewTime`, by the holder's clock.
    pub renewed: Option<Timestamp>,
    /// Its `leaseDurationSeconds`.
    pub duration: Option<Duration>,
    /// When this candidate first saw this version.
    pub first_seen: Instant,
}

impl Sighting {
    /// `lease` as seen at `now`; a version seen `before` keeps the instant
    /// it was first seen.
    pub fn of(lease: &Lease, before: Option<&Sighting>, now: Instant) -> Sighting {
        let version = lease.metadata.resource_version.clone().unwrap_or_default();
        let spec = lease.spec.as_ref();
        let first_seen = match before {
            Some(before) if before.version == version => before.first_seen,
            _ => now,
        };
        Sighting {
            holder: spec.and_then(|s| s.holder_identity.clone()).filter(|h| !h.is_empty()),
            version,
            renewed: spec.and_then(|s| s.renew_time.as_ref()).map(|t| t.0),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|s| u64::try_from(s).ok())
                .map(Duration::from_secs),
            first_seen,
        }
    }

    /// Until when the holder this record names may still be acting, as far
    /// as this candidate can tell at `now` (`now_wall` by its wall clock).
    pub fn acting_until(&self, timing: &Timing, now: Instant, now_wall: Timestamp) -> Instant {
        let duration = self.duration.unwrap_or(timing.duration);
        // The holder sent the record before it was seen, and stops acting
        // before its duration has passed since.
        let by_sight = self.first_seen + duration;
        let Some(renewed) = self.renewed else {
            return by_sight;
        };
        // By its renewTime, allowing `grace` of clock skew.
        let age = now_wall.duration_since(renewed).as_secs_f64();
        let left = duration.as_secs_f64() + timing.grace.as_secs_f64() - age;
        let by_clock = if left >= 0.0 {
            now + Duration::from_secs_f64(left)
        } else {
            now.checked_sub(Duration::from_secs_f64(-left)).unwrap_or(now)
        };
        by_sight.min(by_clock)
    }
}

/// A holder this candidate took the Lease from without it being released.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Predecessor {
    /// Its identity.
    pub holder: String,
    /// By when it stopped acting (its calls to Manager may still land for a
    /// while after: see `process::fence`).
    pub acting_until: Instant,
}

/// What a candidate does after reading the record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Write the record as its holder: it is free, ours, or over.
    Take {
        /// Whom it is taken from, when that holder did not let it go.
        predecessor: Option<Predecessor>,
    },
    /// Another holder may still be acting: read it again at `at`.
    LookAgain {
        /// Who holds it.
        holder: String,
        /// When to read it again.
        at: Instant,
    },
}

/// What candidate `identity` does about `seen` at `now`.
pub fn judge(seen: &Sighting, identity: &str, timing: &Timing, now: Instant, now_wall: Timestamp) -> Verdict {
    let holder = match &seen.holder {
        None => return Verdict::Take { predecessor: None },
        // A previous term of this process, or a write of ours whose answer
        // was lost: nobody else acted since.
        Some(holder) if holder == identity => return Verdict::Take { predecessor: None },
        Some(holder) => holder,
    };
    let acting_until = seen.acting_until(timing, now, now_wall);
    if acting_until <= now {
        Verdict::Take {
            predecessor: Some(Predecessor {
                holder: holder.clone(),
                acting_until,
            }),
        }
    } else {
        Verdict::LookAgain {
            holder: holder.clone(),
            at: acting_until.min(now + timing.poll()),
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::LeaseSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    const TIMING: Timing = Timing {
        duration: Duration::from_secs(15),
        grace: Duration::from_secs(5),
    };

    fn lease(version: &str, holder: Option<&str>, renewed: Timestamp) -> Lease {
        Lease {
            metadata: ObjectMeta {
                resource_version: Some(version.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(15),
                renew_time: Some(MicroTime(renewed)),
                ..LeaseSpec::default()
            }),
        }
    }

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn a_holder_renews_before_it_must_stop_and_stops_before_anyone_may_take_over() {
        let wrote = Instant::now();
        assert_eq!(TIMING.renew_at(wrote), wrote + secs(10));
        assert_eq!(TIMING.stop_at(wrote), wrote + Duration::from_millis(12_500));
        // A follower sees the write no earlier than it was sent: the
        // earliest it may take the Lease is a whole duration after.
        let seen = Sighting::of(&lease("7", Some("a"), Timestamp::now()), None, wrote);
        let earliest = seen.acting_until(&TIMING, wrote, Timestamp::now());
        assert!(TIMING.stop_at(wrote) < earliest);
    }

    #[test]
    fn a_free_or_own_lease_is_taken_at_once_without_a_predecessor() {
        let now = Instant::now();
        let wall = Timestamp::now();
        for holder in [None, Some(""), Some("me")] {
            let seen = Sighting::of(&lease("1", holder, wall), None, now);
            assert_eq!(
                judge(&seen, "me", &TIMING, now, wall),
                Verdict::Take { predecessor: None },
                "{holder:?}"
            );
        }
    }

    #[test]
    fn another_s_lease_is_taken_only_once_seen_unchanged_for_its_duration() {
        let start = Instant::now();
        let wall = Timestamp::now();
        let record = lease("4", Some("other"), wall);
        let first = Sighting::of(&record, None, start);
        let Verdict::LookAgain { holder, at } = judge(&first, "me", &TIMING, start, wall) else {
            panic!("a fresh renewal is held");
        };
        assert_eq!(holder, "other");
        assert_eq!(at, start + secs(2), "looked at again within the poll");
        // Still the same version 14 s later (by the monotonic clock; the
        // wall clock said nothing new): held.
        let later = start + secs(14);
        let again = Sighting::of(&record, Some(&first), later);
        assert_eq!(again.first_seen, start);
        assert!(matches!(
            judge(&again, "me", &TIMING, later, wall),
            Verdict::LookAgain { .. }
        ));
        // A renewal (a new version) starts the count again.
        let renewed = Sighting::of(&lease("5", Some("other"), wall), Some(&again), later);
        assert_eq!(renewed.first_seen, later);
        // Unchanged for the whole duration: taken, from `other`, who
        // stopped acting by then.
        let over = start + secs(15);
        let last = Sighting::of(&record, Some(&first), over);
        assert_eq!(
            judge(&last, "me", &TIMING, over, wall),
            Verdict::Take {
                predecessor: Some(Predecessor {
                    holder: "other".to_owned(),
                    acting_until: start + secs(15),
                })
            }
        );
    }

    #[test]
    fn a_record_renewed_longer_ago_than_its_duration_and_the_skew_is_over_at_once() {
        let now = Instant::now();
        let wall = Timestamp::now();
        let stale = wall - SignedDuration::from_secs(60);
        let seen = Sighting::of(&lease("9", Some("gone"), stale), None, now);
        let Verdict::Take {
            predecessor: Some(predecessor),
        } = judge(&seen, "me", &TIMING, now, wall)
        else {
            panic!("a long-dead holder holds nothing");
        };
        assert_eq!(predecessor.holder, "gone");
        // It stopped 40 s ago (60 s - 15 s - 5 s of skew allowed).
        let stopped = now.checked_sub(secs(40)).unwrap_or(now);
        let off = predecessor.acting_until.max(stopped) - predecessor.acting_until.min(stopped);
        assert!(off < Duration::from_millis(50), "{off:?}");
        // Renewed 18 s ago by its clock: within duration + skew, still held.
        let recent = Sighting::of(
            &lease("9", Some("gone"), wall - SignedDuration::from_secs(18)),
            None,
            now,
        );
        assert!(matches!(
            judge(&recent, "me", &TIMING, now, wall),
            Verdict::LookAgain { .. }
        ));
    }
}
