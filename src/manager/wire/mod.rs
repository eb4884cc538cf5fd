//! Conversion between Manager's wire messages and the domain model, both
//! ways. This is the boundary where bad producer values are normalised or
//! refused: nothing that arrives from the wire may panic.
//!
//! Normalisation rules (the spec's "Capacity, GPU and port contracts"):
//! - `utilizationCap` outside (0, 1] (an absolute, 0, negative, NaN) is read
//!   as 1, so a node never advertises more than its declared capacity;
//! - a negative or non-finite reserved or GPU capacity is read as 0;
//! - unknown enum values and oneof cases become typed `Unknown` values;
//! - over-long free text is truncated.
//!
//! What cannot be normalised (an empty or over-long id, a total capacity that
//! is negative or not a number, a malformed host port) is a [`WireError`]
//! naming the message, the field and why: the caller reports it and carries
//! on with the next message.

mod bundle;
mod event;
mod job;
mod node;

pub use bundle::*;
pub use event::*;
pub use job::*;
pub use node::*;

use prost_types::Timestamp;

use crate::model::UnixMillis;

/// The longest id (node, job, bundle, instance key) accepted from the wire.
pub const MAX_ID_BYTES: usize = 512;
/// The longest free text (reasons, details) kept from the wire; longer text
/// is truncated.
pub const MAX_TEXT_BYTES: usize = 16 * 1024;
/// The most entries accepted in one repeated field or map of a message.
pub const MAX_ENTRIES: usize = 100_000;

/// A wire value that could not be turned into the model.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A required field was absent.
    #[error("{message}.{field} is missing")]
    Missing {
        /// The message type.
        message: &'static str,
        field: &'static str,
    },
    /// A field held a value that cannot be used.
    #[error("{message}.{field} is invalid: {reason}")]
    Invalid {
        /// The message type.
        message: &'static str,
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl WireError {
    /// A stable, low-cardinality name for metrics and logs.
    pub fn reason(&self) -> &'static str {
        match self {
            WireError::Missing { .. } => "missingField",
            WireError::Invalid { .. } => "invalidField",
        }
    }
}

/// A value the conversion had to change to make it usable, reported so the
/// producer can be fixed.
#[derive(Clone, Debug, PartialEq)]
pub struct Normalisation {
    /// The message type.
    pub message: &'static str,
    pub field: &'static str,
    /// What arrived and what it was read as.
    pub what: String,
}

/// Normalisations collected while converting one message.
pub type Notes = Vec<Normalisation>;

pub(crate) fn note(notes: &mut Notes, message: &'static str, field: &'static str, what: String) {
    notes.push(Normalisation { message, field, what });
}

/// `value`, a field `message` must carry.
pub(crate) fn required<T>(message: &'static str, field: &'static str, value: Option<T>) -> Result<T, WireError> {
    value.ok_or(WireError::Missing { message, field })
}

/// An id: non-empty, at most [`MAX_ID_BYTES`], no control characters.
pub(crate) fn id(message: &'static str, field: &'static str, value: &str) -> Result<String, WireError> {
    let invalid = |reason: String| WireError::Invalid { message, field, reason };
    if value.is_empty() {
        return Err(invalid("empty id".into()));
    }
    if value.len() > MAX_ID_BYTES {
        return Err(invalid(format!("id of {} bytes exceeds {MAX_ID_BYTES}", value.len())));
    }
    if value.chars().any(char::is_control) {
        return Err(invalid("id contains control characters".into()));
    }
    Ok(value.to_owned())
}

/// Free text, truncated to [`MAX_TEXT_BYTES`] on a character boundary.
pub(crate) fn text(notes: &mut Notes, message: &'static str, field: &'static str, value: &str) -> String {
    if value.len() <= MAX_TEXT_BYTES {
        return value.to_owned();
    }
    let mut end = MAX_TEXT_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    note(
        notes,
        message,
        field,
        format!("{} bytes of text truncated to {end}", value.len()),
    );
    value[..end].to_owned()
}

/// Refuses a repeated field or map with more than [`MAX_ENTRIES`] entries.
pub(crate) fn bounded(message: &'static str, field: &'static str, len: usize) -> Result<(), WireError> {
    if len > MAX_ENTRIES {
        return Err(WireError::Invalid {
            message,
            field,
            reason: format!("{len} entries exceed {MAX_ENTRIES}"),
        });
    }
    Ok(())
}

/// A protobuf timestamp as epoch milliseconds; out-of-range values are read
/// as absent.
pub fn millis_from_pb(ts: Option<&Timestamp>) -> Option<UnixMillis> {
    let ts = ts?;
    let millis = ts
        .seconds
        .checked_mul(1000)?
        .checked_add(i64::from(ts.nanos) / 1_000_000)?;
    (0..=253_402_300_799_999).contains(&millis).then_some(millis)
}

/// Epoch milliseconds as a protobuf timestamp.
pub fn millis_to_pb(millis: UnixMillis) -> Timestamp {
    Timestamp {
        seconds: millis.div_euclid(1000),
        nanos: (millis.rem_euclid(1000) * 1_000_000) as i32,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_non_empty_bounded_and_printable() {
        assert!(id("M", "f", "node-a").is_ok());
        assert!(id("M", "f", "").is_err());
        assert!(id("M", "f", &"x".repeat(MAX_ID_BYTES + 1)).is_err());
        assert!(id("M", "f", "a\nb").is_err());
    }

    #[test]
    fn long_text_is_truncated_on_a_character_boundary() {
        let mut notes = Notes::new();
        let long = "é".repeat(MAX_TEXT_BYTES);
        let kept = text(&mut notes, "M", "f", &long);
        assert!(kept.len() <= MAX_TEXT_BYTES);
        assert_eq!(notes.len(), 1);
    }

    #[test]
    fn timestamps_round_trip_and_absurd_ones_are_absent() {
        assert_eq!(
            millis_from_pb(Some(&millis_to_pb(1_700_000_000_123))),
            Some(1_700_000_000_123)
        );
        let absurd = Timestamp {
            seconds: i64::MAX,
            nanos: 0,
        };
        assert_eq!(millis_from_pb(Some(&absurd)), None);
    }
}
