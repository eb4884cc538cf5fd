//! Scheduled bundles: a production booked for a start and, optionally, an
//! end. The start reaches Manager as each runtime job's `start_date_time`
//! (the published `Job` field 4); Manager has no end date, so the end is the
//! AutoManager's own: at the end it completes the bundle's jobs.
//!
//! What a schedule means over time ([`BundleSchedule::phase_at`]):
//!
//! | phase | from | to |
//! |---|---|---|
//! | `waiting` | — | `placingFrom` (start − the placement lead) |
//! | `placing` | `placingFrom` | `start` |
//! | `live` | `start` | `end` (for ever without one) |
//! | `ended` | `end` | — |
//!
//! The placement lead is decided where the pools are known (the core); here
//! it arrives as `placing_from`.

use std::fmt;
use std::str::FromStr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::UnixMillis;

/// An instant written as an RFC 3339 date-time with an offset
/// (`2026-12-05T19:00:00Z`, `2026-12-05T20:00:00+01:00`), held as Unix
/// milliseconds. Written back in UTC.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DateTime(UnixMillis);

/// Why a date-time could not be read.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an RFC 3339 date-time with an offset (e.g. 2026-12-05T19:00:00Z): {why}")]
pub struct DateTimeError {
    /// The text as given.
    pub text: String,
    /// What is wrong with it.
    pub why: String,
}

impl DateTime {
    /// The instant `millis` after the Unix epoch.
    pub fn from_millis(millis: UnixMillis) -> Self {
        Self(millis)
    }

    /// Milliseconds after the Unix epoch.
    pub fn millis(self) -> UnixMillis {
        self.0
    }
}

/// The shape RFC 3339 (§5.6 `date-time`) allows, checked before the calendar
/// is: four-digit year, `T`, seconds, an optional fraction and a mandatory
/// offset. The same shape as the CRD's `pattern`, so a document standalone
/// reads is refused exactly where the API server refuses it.
fn rfc3339_shape(text: &str) -> Result<(), &'static str> {
    let b = text.as_bytes();
    let digits = |range: std::ops::Range<usize>| b.get(range).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let at = |i: usize, allowed: &[u8]| b.get(i).is_some_and(|c| allowed.contains(c));
    if !(digits(0..4) && at(4, b"-") && digits(5..7) && at(7, b"-") && digits(8..10)) {
        return Err("the date must be YYYY-MM-DD");
    }
    if !at(10, b"Tt") {
        return Err("the date and the time are separated by T");
    }
    if !(digits(11..13) && at(13, b":") && digits(14..16) && at(16, b":") && digits(17..19)) {
        return Err("the time must be HH:MM:SS");
    }
    let mut i = 19;
    if at(i, b".") {
        let fraction = b[i + 1..].iter().take_while(|c| c.is_ascii_digit()).count();
        if fraction == 0 {
            return Err("a fraction of a second needs digits after the dot");
        }
        i += 1 + fraction;
    }
    let offset = &b[i.min(b.len())..];
    let numeric = offset.len() == 6
        && matches!(offset[0], b'+' | b'-')
        && offset[1..3].iter().all(u8::is_ascii_digit)
        && offset[3] == b':'
        && offset[4..6].iter().all(u8::is_ascii_digit);
    if matches!(offset, b"Z" | b"z") || numeric {
        Ok(())
    } else {
        Err("it must end in an offset: Z or +HH:MM / -HH:MM")
    }
}

impl FromStr for DateTime {
    type Err = DateTimeError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let err = |why: String| DateTimeError {
            text: text.to_owned(),
            why,
        };
        rfc3339_shape(text).map_err(|why| err(why.to_owned()))?;
        let at: jiff::Timestamp = text.parse().map_err(|e: jiff::Error| err(e.to_string()))?;
        Ok(Self(at.as_millisecond()))
    }
}

impl fmt::Display for DateTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match jiff::Timestamp::from_millisecond(self.0) {
            Ok(at) => write!(f, "{at}"),
            // Only an instant decoded from elsewhere can be out of jiff's
            // range (years -9999..=9999); say what it is rather than fail.
            Err(_) => write!(f, "{} ms after the Unix epoch", self.0),
        }
    }
}

super::string_serde!(DateTime);

/// The CRD's form: a `date-time` string (a timestamp to CEL) of the shape
/// [`rfc3339_shape`] checks.
const RFC3339_PATTERN: &str =
    r"^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?([Zz]|[+-][0-9]{2}:[0-9]{2})$";

impl JsonSchema for DateTime {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "DateTime".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "format": "date-time",
            "pattern": RFC3339_PATTERN
        })
    }
}

/// `schedule`: when a bundle's production runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
#[schemars(extend("x-kubernetes-validations" = [
    {"rule": "!has(self.end) || self.end > self.start",
     "message": "schedule.end must be after schedule.start"}
]))]
pub struct BundleSchedule {
    /// When the production goes on air (RFC 3339, e.g.
    /// `2026-12-05T19:00:00Z`). Placement starts the pool's placement lead
    /// ahead of it (`placementLeadMs`: 5 min for cloud tiers, 0 for cluster
    /// tiers; the largest of the pool's tiers).
    pub start: DateTime,
    /// When it ends: every job of the bundle is completed (stopped) and not
    /// placed again. Absent: it runs until the bundle is deleted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<DateTime>,
}

super::string_enum! {
    /// Where a schedule stands.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
    #[serde(rename_all = "camelCase")]
    pub enum SchedulePhase {
        /// Before the placement lead: nothing is placed yet.
        Waiting,
        /// Inside the placement lead: jobs are placed so they run at the start.
        Placing,
        /// From the start to the end.
        Live,
        /// Past the end: the jobs were completed and are not placed again.
        Ended,
    }
}

impl SchedulePhase {
    /// The phase's name as the status and notifications spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Waiting => "waiting",
            Self::Placing => "placing",
            Self::Live => "live",
            Self::Ended => "ended",
        }
    }
}

/// A phase change still to come.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScheduleTransition {
    /// The phase entered.
    pub phase: SchedulePhase,
    /// When.
    pub at: UnixMillis,
}

impl BundleSchedule {
    /// The end, as milliseconds.
    pub fn end_millis(&self) -> Option<UnixMillis> {
        self.end.map(DateTime::millis)
    }

    /// The phase at `now`, placement starting at `placing_from` (at most
    /// the start), and the next change, if one is to come.
    pub fn phase_at(&self, placing_from: UnixMillis, now: UnixMillis) -> (SchedulePhase, Option<ScheduleTransition>) {
        let start = self.start.millis();
        let placing_from = placing_from.min(start);
        let next = |phase, at| Some(ScheduleTransition { phase, at });
        let ended = |end| next(SchedulePhase::Ended, end);
        match self.end_millis() {
            Some(end) if now >= end => (SchedulePhase::Ended, None),
            end if now >= start => (SchedulePhase::Live, end.and_then(ended)),
            _ if now >= placing_from => (SchedulePhase::Placing, next(SchedulePhase::Live, start)),
            _ => (SchedulePhase::Waiting, next(SchedulePhase::Placing, placing_from)),
        }
    }

    /// Whether the production is over at `now`.
    pub fn has_ended(&self, now: UnixMillis) -> bool {
        self.end_millis().is_some_and(|end| now >= end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> UnixMillis {
        text.parse::<DateTime>().unwrap().millis()
    }

    #[test]
    fn rfc3339_with_an_offset_is_read_and_written_back_in_utc() {
        assert_eq!(at("1970-01-01T00:00:01Z"), 1_000);
        assert_eq!(at("2026-12-05T20:00:00+01:00"), at("2026-12-05T19:00:00Z"));
        assert_eq!(at("2026-12-05t19:00:00.250z"), at("2026-12-05T19:00:00Z") + 250);
        let written = DateTime::from_millis(at("2026-12-05T20:00:00+01:00")).to_string();
        assert_eq!(written, "2026-12-05T19:00:00Z");
    }

    #[test]
    fn what_rfc3339_does_not_allow_is_refused_with_the_reason() {
        for (bad, why) in [
            ("2026-12-05T19:00:00", "offset"),
            ("2026-12-05 19:00:00Z", "separated by T"),
            ("2026-12-05T19:00Z", "HH:MM:SS"),
            ("05/12/2026 19:00", "YYYY-MM-DD"),
            ("2026-12-05T19:00:00.Z", "digits after the dot"),
            ("2026-12-05T19:00:00+0100", "offset"),
            ("2026-12-05T19:00:00Z[Europe/Oslo]", "offset"),
            ("2026-02-30T19:00:00Z", "2026-02-30"),
            ("tomorrow", "YYYY-MM-DD"),
        ] {
            let e = bad.parse::<DateTime>().expect_err(bad);
            assert!(e.to_string().contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn the_schema_pattern_is_the_shape_the_parser_checks() {
        let schema = schemars::schema_for!(DateTime);
        assert_eq!(schema.get("pattern").and_then(|p| p.as_str()), Some(RFC3339_PATTERN));
        assert_eq!(schema.get("format").and_then(|p| p.as_str()), Some("date-time"));
    }

    fn schedule(end: Option<&str>) -> BundleSchedule {
        BundleSchedule {
            start: "2026-12-05T19:00:00Z".parse().unwrap(),
            end: end.map(|e| e.parse().unwrap()),
        }
    }

    #[test]
    fn phases_follow_the_lead_the_start_and_the_end() {
        let s = schedule(Some("2026-12-05T21:00:00Z"));
        let start = at("2026-12-05T19:00:00Z");
        let end = at("2026-12-05T21:00:00Z");
        let lead = start - 300_000;
        let phase = |now| s.phase_at(lead, now);
        assert_eq!(
            phase(lead - 1),
            (
                SchedulePhase::Waiting,
                Some(ScheduleTransition {
                    phase: SchedulePhase::Placing,
                    at: lead
                })
            )
        );
        assert_eq!(phase(lead).0, SchedulePhase::Placing);
        assert_eq!(phase(start - 1).1.map(|t| t.at), Some(start));
        assert_eq!(
            phase(start),
            (
                SchedulePhase::Live,
                Some(ScheduleTransition {
                    phase: SchedulePhase::Ended,
                    at: end
                })
            )
        );
        assert_eq!(phase(end), (SchedulePhase::Ended, None));
        assert!(s.has_ended(end) && !s.has_ended(end - 1));
    }

    #[test]
    fn without_an_end_a_schedule_is_live_for_ever_and_without_a_lead_it_places_at_the_start() {
        let s = schedule(None);
        let start = at("2026-12-05T19:00:00Z");
        assert_eq!(
            s.phase_at(start, start - 1).1.map(|t| t.phase),
            Some(SchedulePhase::Placing)
        );
        assert_eq!(s.phase_at(start, start + 86_400_000), (SchedulePhase::Live, None));
        assert!(!s.has_ended(i64::MAX));
    }

    #[test]
    fn the_phase_schema_lists_every_serde_name() {
        let schema = schemars::schema_for!(SchedulePhase);
        let listed: Vec<&str> = schema
            .get("oneOf")
            .and_then(|v| v.as_array())
            .unwrap()
            .iter()
            .map(|v| v["const"].as_str().unwrap())
            .collect();
        let phases = [
            SchedulePhase::Waiting,
            SchedulePhase::Placing,
            SchedulePhase::Live,
            SchedulePhase::Ended,
        ];
        let named: Vec<String> = phases
            .iter()
            .map(|p| serde_json::to_value(p).unwrap().as_str().unwrap().to_owned())
            .collect();
        assert_eq!(listed, named);
        assert!(phases.iter().all(|p| serde_json::to_value(p).unwrap() == p.as_str()));
    }

    #[test]
    fn unknown_schedule_fields_are_refused() {
        let e = yaml_serde::from_str::<BundleSchedule>("{start: '2026-12-05T19:00:00Z', stop: '2026-12-05T21:00:00Z'}")
            .expect_err("unknown field");
        assert!(e.to_string().contains("stop"), "{e}");
    }
}
