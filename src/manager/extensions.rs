//! Which of Manager's RPCs are the published Norsk Manager API
//! (`proto/published-api.txt`, @norskvideo/norsk-api 1.0.384) and which are
//! the additions this operator needs, with what each addition is for. A
//! Manager that serves only the published API answers an addition with
//! `UNIMPLEMENTED`; the runtime then says once, in these words, what is
//! missing and what it means, instead of failing every call alike.

const PUBLISHED: &str = include_str!("../../proto/published-api.txt");

/// Whether `method` (of `norsk.api.manager.Manager`) is in the published API.
pub fn is_published(method: &str) -> bool {
    PUBLISHED.lines().any(|line| {
        line.strip_prefix("rpc norsk.api.manager.Manager.")
            .and_then(|rest| rest.split_once(' '))
            .is_some_and(|(name, _)| name == method)
    })
}

/// What the operator cannot do without the addition `method`.
pub fn needed_for(method: &str) -> &'static str {
    match method {
        "CreateBundle" | "UpdateBundle" | "DeleteBundle" => {
            "storing bundles: no Bundle can be submitted, changed or deleted"
        }
        "StartBundleJob" | "StopBundleJob" => "starting and stopping manual jobs",
        "SetTerminalVerdict" => "recording that a bundle broke or a job was dropped",
        "StartPreparedJob" => "overlap and handover migrations (a prepared target is started at the cut-over)",
        "SendMigrationSignal" => "handover migrations (the cut-over signals between source and target)",
        "UpdateNodeTags" => "hot spares and cordons (they are node tags)",
        "PrefetchImages" => "warming hot spares with the templates' images",
        _ => "an AutoManager feature",
    }
}

/// What a person reads when Manager lacks `method`.
pub fn missing_message(method: &str) -> String {
    format!(
        "Manager does not serve {method}: it speaks the published Norsk Manager API without the \
         AutoManager extensions, which the operator needs for {}. Upgrade Norsk Manager to a \
         release that serves the AutoManager extensions",
        needed_for(method)
    )
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
        assert!(missing_message("CreateBundle").contains("no Bundle can be submitted"));
    }
}
