//! A `Bundle`'s `Resilient` condition, read off the core's headroom report:
//! pure, so the rule is tested without a cluster.
//!
//! - **True** when the loss of the node under any of its replicas is
//!   absorbed for the bundle (its lost jobs placed again, it stays on air)
//!   and, with a backup, primary and backup share no failure domain (node,
//!   availability zone).
//! - **False** with `SameFailureDomain` (naming the node or zone both
//!   replicas run in) or `LossNotAbsorbed` (naming the node whose loss is
//!   not, and why).
//! - **Unknown** while headroom is not computed (`experimental.headroom`
//!   off, or no recompute yet), a replica is not placed, or a node of the
//!   bundle has no verdict yet.

use crate::model::BundleId;
use crate::placement::headroom::{DomainKind, Fate, HeadroomReport};

use super::conditions::Observed;

/// The loss of either replica's node is absorbed and the replicas share no
/// failure domain.
pub const RESILIENT: &str = "Resilient";

/// Where one replica of a bundle runs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReplicaPlacement {
    /// 0 primary, 1 backup.
    pub index: u32,
    /// Every job of the replica is bound to a node.
    pub placed: bool,
    /// The nodes its jobs are bound to, each with its availability zone
    /// when the node advertises one.
    pub nodes: Vec<(String, Option<String>)>,
}

/// The `Resilient` condition of `bundle`, whose replicas run as
/// `replicas` say, from `report` (`None`: headroom not computed).
pub fn resilient(report: Option<&HeadroomReport>, bundle: &BundleId, replicas: &[ReplicaPlacement]) -> Observed {
    let Some(report) = report else {
        return Observed::unknown(
            RESILIENT,
            "HeadroomNotComputed",
            "resilience headroom is not computed (settings.experimental.headroom is off, or no recompute yet)",
        );
    };
    if let Some(unplaced) = replicas.iter().find(|r| !r.placed) {
        return Observed::unknown(
            RESILIENT,
            "NotPlaced",
            format!("replica {} is not placed on a node yet", unplaced.index),
        );
    }
    if let [primary, backup] = replicas {
        let shared_node = primary
            .nodes
            .iter()
            .find(|(node, _)| backup.nodes.iter().any(|(other, _)| other == node));
        if let Some((node, _)) = shared_node {
            return Observed::no(
                RESILIENT,
                "SameFailureDomain",
                format!("primary and backup both run on node {node}: its loss takes both"),
            );
        }
        let shared_zone = primary.nodes.iter().find_map(|(_, zone)| {
            let zone = zone.as_ref()?;
            backup
                .nodes
                .iter()
                .any(|(_, other)| other.as_ref() == Some(zone))
                .then_some(zone)
        });
        if let Some(zone) = shared_zone {
            return Observed::no(
                RESILIENT,
                "SameFailureDomain",
                format!("primary and backup both run in zone {zone}: its loss takes both"),
            );
        }
    }
    let mut nodes: Vec<&str> = replicas
        .iter()
        .flat_map(|r| r.nodes.iter().map(|(node, _)| node.as_str()))
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    for node in &nodes {
        let Some(verdict) = report.node(node) else {
            return Observed::unknown(
                RESILIENT,
                "HeadroomNotComputed",
                format!("the loss of node {node} is not analysed yet"),
            );
        };
        let Some(fate) = verdict.bundles.iter().find(|b| &b.bundle == bundle) else {
            continue;
        };
        if fate.absorbed() {
            continue;
        }
        let dark = fate.jobs.iter().find_map(|j| match &j.fate {
            Fate::Dark { reason } => Some(format!("{} (replica {}): {reason}", j.job_name, j.replica_index)),
            _ => None,
        });
        let what = if fate.on_air {
            "is not absorbed"
        } else {
            "takes the bundle off the air"
        };
        return Observed::no(
            RESILIENT,
            "LossNotAbsorbed",
            format!(
                "the loss of node {node} {what}{}",
                dark.map(|d| format!(": {d}")).unwrap_or_default()
            ),
        );
    }
    let kind = DomainKind::Node.as_str();
    let message = if replicas.len() > 1 {
        format!("the loss of any {kind} it runs on is absorbed; primary and backup share no node or zone")
    } else {
        format!("the loss of any {kind} it runs on is absorbed by placing its jobs again")
    };
    Observed::yes(RESILIENT, "LossAbsorbed", message)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{JobId, NodeId};
    use crate::placement::headroom::{
        BundleFate, DarkReason, Domain, DomainVerdict, HeadroomReport, JobFate, LostNode,
    };

    fn placed(index: u32, nodes: &[(&str, Option<&str>)]) -> ReplicaPlacement {
        ReplicaPlacement {
            index,
            placed: true,
            nodes: nodes
                .iter()
                .map(|(n, z)| ((*n).to_owned(), z.map(str::to_owned)))
                .collect(),
        }
    }

    fn verdict(node: &str, bundle: &str, replica: u32, fate: Fate, on_air: bool) -> DomainVerdict {
        let job = JobFate {
            job_id: JobId::from(format!("{bundle}/{replica}/encode").as_str()),
            replica_index: replica,
            job_name: "encode".to_owned(),
            lost_from: NodeId::from(node),
            essential: true,
            fate,
        };
        let absorbed = job.fate.is_replaced();
        DomainVerdict {
            domain: Domain::new(DomainKind::Node, node),
            absorbed,
            nodes: vec![LostNode {
                node_id: NodeId::from(node),
                pool: Some("studio".to_owned()),
            }],
            jobs_lost: 1,
            jobs_replaced: u32::from(absorbed),
            bundles: vec![BundleFate {
                bundle: BundleId::from(bundle),
                on_air,
                broken: false,
                untouched_replicas: Vec::new(),
                jobs: vec![job],
            }],
            provisions: Vec::new(),
            unmanaged: Vec::new(),
        }
    }

    fn placed_on(node: &str) -> Fate {
        Fate::Placed {
            node_id: Some(NodeId::from(node)),
            pool: "studio".to_owned(),
            tier: "cluster".to_owned(),
        }
    }

    fn report(verdicts: Vec<DomainVerdict>) -> HeadroomReport {
        HeadroomReport::of(verdicts, &["studio".to_owned()])
    }

    /// Bundle `b`'s condition with `replicas` placed as given.
    fn resilient_b(report: &HeadroomReport, replicas: &[ReplicaPlacement]) -> Observed {
        resilient(Some(report), &BundleId::from("b"), replicas)
    }

    /// A primary and a backup, each on one node (node, zone).
    fn pair(primary: (&str, &str), backup: (&str, &str)) -> [ReplicaPlacement; 2] {
        [
            placed(0, &[(primary.0, Some(primary.1))]),
            placed(1, &[(backup.0, Some(backup.1))]),
        ]
    }

    /// Headroom of node `a` (the primary's, its loss absorbed) and node `d`
    /// (the backup's, its job's fate `d`).
    fn report_a_and_d(d: Fate) -> HeadroomReport {
        report(vec![
            verdict("a", "b", 0, placed_on("c"), true),
            verdict("d", "b", 1, d, true),
        ])
    }

    /// The condition's status and reason.
    fn said(condition: &Observed) -> (&str, &str) {
        (condition.status_name(), condition.reason.as_str())
    }

    #[test]
    fn without_a_headroom_report_the_condition_is_unknown() {
        let condition = resilient(None, &BundleId::from("b"), &[placed(0, &[("a", None)])]);
        assert!(condition.unknown);
        assert_eq!(said(&condition), ("Unknown", "HeadroomNotComputed"));
    }

    #[test]
    fn a_replica_not_placed_leaves_it_unknown() {
        let report = report(Vec::new());
        let mut backup = placed(1, &[]);
        backup.placed = false;
        let condition = resilient_b(&report, &[placed(0, &[("a", None)]), backup]);
        assert_eq!(said(&condition), ("Unknown", "NotPlaced"));
        assert!(condition.message.contains("replica 1"), "{}", condition.message);
    }

    #[test]
    fn primary_and_backup_on_one_node_share_a_failure_domain() {
        let report = report(vec![verdict("a", "b", 0, placed_on("c"), true)]);
        let condition = resilient_b(&report, &pair(("a", "z1"), ("a", "z1")));
        assert_eq!(said(&condition), ("False", "SameFailureDomain"));
        assert!(condition.message.contains("node a"), "{}", condition.message);
    }

    #[test]
    fn primary_and_backup_in_one_zone_share_a_failure_domain() {
        let condition = resilient_b(&report_a_and_d(placed_on("c")), &pair(("a", "z1"), ("d", "z1")));
        assert_eq!(condition.reason, "SameFailureDomain");
        assert!(condition.message.contains("zone z1"), "{}", condition.message);
    }

    #[test]
    fn a_node_loss_not_absorbed_names_the_node_and_why() {
        let dark = Fate::Dark {
            reason: DarkReason::RestartCeiling,
        };
        let condition = resilient_b(&report_a_and_d(dark), &pair(("a", "z1"), ("d", "z2")));
        assert_eq!(said(&condition), ("False", "LossNotAbsorbed"));
        assert!(condition.message.contains("node d"), "{}", condition.message);
        assert!(condition.message.contains("restart ceiling"), "{}", condition.message);
    }

    #[test]
    fn absorbed_losses_in_separate_domains_are_resilient() {
        let condition = resilient_b(&report_a_and_d(placed_on("c")), &pair(("a", "z1"), ("d", "z2")));
        assert_eq!(said(&condition), ("True", "LossAbsorbed"));
    }

    #[test]
    fn a_node_without_a_verdict_yet_leaves_it_unknown() {
        let report = report(vec![verdict("a", "b", 0, placed_on("c"), true)]);
        let condition = resilient_b(&report, &[placed(0, &[("e", None)])]);
        assert_eq!(said(&condition), ("Unknown", "HeadroomNotComputed"));
        assert!(condition.message.contains("node e"), "{}", condition.message);
    }
}
