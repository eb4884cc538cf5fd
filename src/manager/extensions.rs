//! Which of Manager's RPCs are the published Norsk Manager API
//! (`proto/published-api.txt`, @norskvideo/norsk-api 1.0.384) and which are
//! additions. A Manager that serves only the published API answers an
//! addition with `UNIMPLEMENTED`; such an answer is said in these words
//! (what the addition is and what the operator does without it).

use crate::model::manager::Capability;

const PUBLISHED: &str = include_str!("../../proto/published-api.txt");

/// Whether `method` (of `norsk.api.manager.Manager`) is in the published API.
pub fn is_published(method: &str) -> bool {
    PUBLISHED.lines().any(|line| {
        line.strip_prefix("rpc norsk.api.manager.Manager.")
            .and_then(|rest| rest.split_once(' '))
            .is_some_and(|(name, _)| name == method)
    })
}

/// What a person reads when Manager answers the addition `method`
/// `UNIMPLEMENTED`: what it is and what the operator does without it.
pub fn missing_message(method: &str) -> String {
    let without = Capability::of_rpc(method).map_or("it is not used", |c| c.without().0);
    format!("Manager does not serve {method}, an addition to the published Norsk Manager API; without it {without}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_published_api_is_told_from_the_additions() {
        for published in [
            "CreateJob",
            "StartJob",
            "StopJob",
            "EventStream",
            "TerminateNode",
            "CompleteJob",
        ] {
            assert!(is_published(published), "{published}");
        }
        for addition in [
            "CreateBundle",
            "StartBundleJob",
            "SetTerminalVerdict",
            "SendMigrationSignal",
            "UpdateNodeTags",
        ] {
            assert!(!is_published(addition), "{addition}");
        }
        assert!(missing_message("CreateBundle").contains("expanded by the operator"));
    }
}
