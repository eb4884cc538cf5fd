//! What the decision layer's and the controllers' unit tests share: the core of
//! [`crate::automanager::testing`], and conditions as a user reads them.

use super::conditions::Observed;
pub use crate::automanager::testing::*;

/// Conditions as a user reads them: type, status, reason, message.
pub fn said(conditions: &[Observed]) -> Vec<(&str, &str, &str, &str)> {
    conditions
        .iter()
        .map(|c| (c.type_, c.status_name(), c.reason.as_str(), c.message.as_str()))
        .collect()
}
