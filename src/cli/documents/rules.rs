//! What the API server checks of a resource beyond its schema's shape and
//! bounds: a valid name, and the CEL rules (`x-kubernetes-validations`) on
//! the types. Each rule is checked once, where it can be: the rules that
//! read one document alone and have no validation function elsewhere are
//! here, as is every transition rule (`oldSelf`: what an update may not
//! change); a Bundle's and a PlacementPool's rules are the placement
//! engine's own validation (`validate_bundle`, `validate_pools`), run where
//! the resource is applied or planned. [`COVERED`] lists every CEL rule
//! with where it is checked, and a test fails when the CRDs gain a rule
//! this list does not name.

use kube::api::ObjectMeta;

use super::resource::{Kind, Resource};
use super::strict::FieldPath;
use crate::crd::{DrainAfter, DrainMode, NodeDrainSpec};

/// Every CEL rule of the CRDs and where it is checked outside the API
/// server.
pub const COVERED: &[(&str, &str)] = &[
    (
        "self.jobs.all(j, self.jobs.exists_one(k, k.jobName == j.jobName))",
        "validate_bundle: duplicateJobName",
    ),
    (
        "self.jobs.all(j, !has(j.coLocateWith) || j.coLocateWith.all(n, n != j.jobName && self.jobs.exists(k, k.jobName == n)))",
        "validate_bundle: unknownPeer, selfReference",
    ),
    (
        "self.jobs.all(j, !has(j.separateFrom) || j.separateFrom.all(n, n != j.jobName && self.jobs.exists(k, k.jobName == n)))",
        "validate_bundle: unknownPeer, selfReference",
    ),
    (
        "self.jobs.all(j, !has(j.coLocateWith) || !has(j.separateFrom) || j.coLocateWith.all(n, !(n in j.separateFrom)))",
        "validate_bundle: contradictoryPlacementRules",
    ),
    (
        "!has(self.backupParameterOverrides) || self.backupParameterOverrides.all(n, self.jobs.exists(k, k.jobName == n))",
        "validate_bundle: unknownBackupOverrideJob",
    ),
    (
        "!has(self.singleUse) || !self.singleUse || (has(self.exclusive) && self.exclusive)",
        "validate_bundle: singleUseRequiresExclusive",
    ),
    (
        "has(self.scaleOut) && self.scaleOut == 'fixed' || has(self.candidateInstanceTypes) && size(self.candidateInstanceTypes) > 0",
        "validate_pools: noCandidateInstanceTypes",
    ),
    (
        "self.tiers.all(t, self.tiers.exists_one(u, u.name == t.name))",
        "validate_pools: duplicateTier",
    ),
    (
        "self.tiers.filter(t, has(t.scaleOut) && t.scaleOut == 'fixed').size() <= 1",
        "validate_pools: multipleFixedTiers",
    ),
    (
        "!has(self.end) || self.end > self.start",
        "validate_bundle: scheduleEndsBeforeStart",
    ),
    (
        "!has(self.startedReplicas) || size(self.startedReplicas) == 0 || (has(self.startMode) && self.startMode == 'manual')",
        "validate_bundle: startedAutoJob",
    ),
    (
        "self.jobs.all(j, !has(j.startedReplicas) || j.startedReplicas.all(r, r == 0 || has(self.resiliencePolicy)))",
        "validate_bundle: unknownStartedReplica",
    ),
    ("self.metadata.name == self.spec.pool", "rules::of: HotSparePolicy"),
    (
        "!has(self.interruption) || !has(self.after) || self.after == 'terminate'",
        "rules::of: NodeDrain",
    ),
    ("self.nodeId == oldSelf.nodeId", "rules::update: NodeDrain"),
    (
        "!has(self.mode) || self.mode == 'drain' || (!has(self.timeoutSeconds) && !(has(self.force) && self.force) && !has(self.strategy) && !has(self.after) && !has(self.interruption))",
        "rules::of: NodeDrain",
    ),
    (
        "(has(self.mode) ? self.mode : 'drain') == (has(oldSelf.mode) ? oldSelf.mode : 'drain')",
        "rules::update: NodeDrain",
    ),
    (
        "self.bundle == oldSelf.bundle && self.replicaIndex == oldSelf.replicaIndex && self.jobName == oldSelf.jobName && has(self.strategy) == has(oldSelf.strategy) && (!has(self.strategy) || self.strategy == oldSelf.strategy)",
        "rules::update: JobMigration",
    ),
    (
        "!has(oldSelf.abort) || !oldSelf.abort || self.abort",
        "rules::update: JobMigration",
    ),
    ("self == oldSelf", "rules::update: NorskNode"),
];

/// `metadata`: a name that is a DNS subdomain, as the API server demands
/// of every custom resource, and a namespace that is a DNS label.
pub fn metadata(kind: Kind, meta: &ObjectMeta) -> Vec<(FieldPath, String)> {
    let mut found = Vec::new();
    match meta.name.as_deref() {
        None | Some("") => found.push((FieldPath::of(&["metadata", "name"]), "missing".to_owned())),
        Some(name) if !is_dns_subdomain(name) => found.push((
            FieldPath::of(&["metadata", "name"]),
            format!(
                "{name:?} is not a valid name: lowercase letters, digits, '-' and '.', starting and ending \
                 with a letter or digit, at most 253 characters"
            ),
        )),
        Some(_) => {}
    }
    if kind.namespaced()
        && let Some(namespace) = meta.namespace.as_deref()
        && !is_dns_label(namespace)
    {
        found.push((
            FieldPath::of(&["metadata", "namespace"]),
            format!(
                "{namespace:?} is not a valid namespace: lowercase letters, digits and '-', starting and ending \
                 with a letter or digit, at most 63 characters"
            ),
        ));
    }
    found
}

fn is_dns_label(text: &str) -> bool {
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes
            .iter()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        && bytes.first().is_some_and(u8::is_ascii_alphanumeric)
        && bytes.last().is_some_and(u8::is_ascii_alphanumeric)
}

fn is_dns_subdomain(text: &str) -> bool {
    text.len() <= 253 && text.split('.').all(is_dns_label)
}

/// The CEL rules of one document that no validation function elsewhere
/// checks.
pub fn of(resource: &Resource) -> Vec<(FieldPath, String)> {
    match resource {
        // `self.metadata.name == self.spec.pool`
        Resource::HotSparePolicy(policy) if policy.metadata.name.as_deref() != Some(policy.spec.0.pool.as_str()) => {
            vec![(
                FieldPath::of(&["spec", "pool"]),
                "metadata.name must equal spec.pool: one HotSparePolicy per pool, named after it".to_owned(),
            )]
        }
        // `!has(self.interruption) || !has(self.after) || self.after == 'terminate'`
        Resource::NodeDrain(drain) if keeps_an_interrupted_node(&drain.spec) => vec![(
            FieldPath::of(&["spec", "after"]),
            "a drain answering an interruption cannot keep its node: the provider takes it at the deadline".to_owned(),
        )],
        // `!has(self.mode) || self.mode == 'drain' || (no drain option)`
        Resource::NodeDrain(drain) if at_once_with_drain_options(&drain.spec) => vec![(
            FieldPath::of(&["spec", "mode"]),
            "evict and terminate act at once: timeoutSeconds, force, strategy, after and interruption only apply to mode drain"
                .to_owned(),
        )],
        _ => Vec::new(),
    }
}

fn at_once_with_drain_options(spec: &NodeDrainSpec) -> bool {
    spec.mode.is_some_and(DrainMode::is_at_once)
        && (spec.timeout_seconds.is_some()
            || spec.force
            || spec.strategy.is_some()
            || spec.after.is_some()
            || spec.interruption.is_some())
}

fn keeps_an_interrupted_node(spec: &NodeDrainSpec) -> bool {
    spec.interruption.is_some() && spec.after.is_some_and(|a| a != DrainAfter::Terminate)
}

/// The transition rules: what an update from `old` to `new` (one resource,
/// two versions) may not change.
pub fn update(old: &Resource, new: &Resource) -> Vec<(FieldPath, String)> {
    match (old, new) {
        // `self.nodeId == oldSelf.nodeId`
        (Resource::NodeDrain(old), Resource::NodeDrain(new)) if old.spec.node_id != new.spec.node_id => vec![(
            FieldPath::of(&["spec", "nodeId"]),
            "nodeId cannot change: delete this drain and create another".to_owned(),
        )],
        // `(has(self.mode) ? self.mode : 'drain') == (has(oldSelf.mode) ? oldSelf.mode : 'drain')`
        (Resource::NodeDrain(old), Resource::NodeDrain(new))
            if old.spec.mode.unwrap_or_default() != new.spec.mode.unwrap_or_default() =>
        {
            vec![(
                FieldPath::of(&["spec", "mode"]),
                "mode cannot change: delete this NodeDrain and create another".to_owned(),
            )]
        }
        (Resource::JobMigration(old), Resource::JobMigration(new)) => {
            let (was, now) = (&old.spec, &new.spec);
            let mut found = Vec::new();
            if (&was.bundle, was.replica_index, &was.job_name, was.strategy)
                != (&now.bundle, now.replica_index, &now.job_name, now.strategy)
            {
                found.push((
                    FieldPath::of(&["spec"]),
                    "a migration's job and strategy cannot change: create another JobMigration".to_owned(),
                ));
            }
            // `!has(oldSelf.abort) || !oldSelf.abort || self.abort`
            if was.abort && !now.abort {
                found.push((
                    FieldPath::of(&["spec", "abort"]),
                    "an aborted migration cannot be resumed: create another JobMigration".to_owned(),
                ));
            }
            found
        }
        // `self == oldSelf` on `spec.nodeId`
        (Resource::NorskNode(old), Resource::NorskNode(new)) if old.spec.node_id != new.spec.node_id => vec![(
            FieldPath::of(&["spec", "nodeId"]),
            "nodeId is the Manager node this resource mirrors and cannot change".to_owned(),
        )],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    fn rules_in(schema: &serde_json::Value, out: &mut BTreeSet<String>) {
        match schema {
            serde_json::Value::Object(fields) => {
                if let Some(rules) = fields.get("x-kubernetes-validations").and_then(|v| v.as_array()) {
                    out.extend(rules.iter().filter_map(|r| r["rule"].as_str().map(str::to_owned)));
                }
                fields.values().for_each(|v| rules_in(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| rules_in(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_cel_rule_of_the_crds_is_checked_outside_the_api_server() {
        let mut in_crds = BTreeSet::new();
        for definition in crate::crd::definitions() {
            rules_in(&serde_json::to_value(&definition.spec).unwrap(), &mut in_crds);
        }
        let covered: BTreeSet<String> = COVERED.iter().map(|(rule, _)| (*rule).to_owned()).collect();
        let missing: Vec<_> = in_crds.difference(&covered).collect();
        assert!(
            missing.is_empty(),
            "CEL rules with no check outside the API server: {missing:?}"
        );
        let stale: Vec<_> = covered.difference(&in_crds).collect();
        assert!(
            stale.is_empty(),
            "COVERED names rules the CRDs no longer have: {stale:?}"
        );
    }

    #[test]
    fn names_follow_the_api_servers_rules() {
        assert!(is_dns_subdomain("ch1.studio-a"));
        for bad in ["Ch1", "-a", "a-", "a_b", ""] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
        assert!(!is_dns_label("a.b"));
    }
}
