//! What the decision layer's and the controllers' unit tests share: the core of
//! [`crate::automanager::testing`], and conditions as a user reads them.

use super::conditions::{Observed, READY, RECONCILING, STALLED};
pub use crate::automanager::testing::*;

/// What a resource stopped for `reason` says: not `Ready` and `Stalled`,
/// both with `why`, no longer `Reconciling`.
pub fn stalled_for<'a>(reason: &'a str, why: &'a str) -> [(&'static str, &'static str, &'a str, &'a str); 3] {
    [
        (READY, "False", reason, why),
        (RECONCILING, "False", reason, ""),
        (STALLED, "True", reason, why),
    ]
}

/// What a resource in flight (`reason`) says: not `Ready` yet and
/// `Reconciling`, both with `what`, not `Stalled`.
pub fn in_flight<'a>(reason: &'a str, what: &'a str) -> [(&'static str, &'static str, &'a str, &'a str); 3] {
    [
        (READY, "False", reason, what),
        (RECONCILING, "True", reason, what),
        (STALLED, "False", "InProgress", ""),
    ]
}

/// Conditions as a user reads them: type, status, reason, message.
pub fn said(conditions: &[Observed]) -> Vec<(&str, &str, &str, &str)> {
    conditions
        .iter()
        .map(|c| (c.type_, c.status_name(), c.reason.as_str(), c.message.as_str()))
        .collect()
}
