//! The placement trace: for every tier walked, every node's verdict (the
//! filter that rejected it, or its full key) and the tier's provisioning
//! decision. `onPlacementDecision` carries it; `plan --explain` prints it.

use serde::Serialize;

use crate::model::NodeId;

use super::filter::{Filter, Rejection};
use super::key::PlacementKey;

/// The whole trace of one placement.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Trace {
    /// The tiers walked, cheapest first, up to the one that decided.
    pub tiers: Vec<TierTrace>,
}

/// One tier of the walk.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierTrace {
    /// The pool walked.
    pub pool: String,
    /// The tier walked.
    pub tier: String,
    /// Every node of the fleet, in node-id order, with its verdict for this
    /// tier.
    pub nodes: Vec<NodeTrace>,
    /// What the tier decided.
    pub decision: TierDecision,
}

/// One node's verdict in one tier.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeTrace {
    pub node_id: NodeId,
    /// Rejected or ranked.
    pub verdict: Verdict,
}

/// A node's verdict.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Verdict {
    /// The first filter that failed, and why.
    Rejected {
        filter: Filter,
        /// The reason with its numbers.
        rejection: Rejection,
    },
    /// Passed every filter; ranked by this key.
    Survived { key: PlacementKey },
}

/// What a tier decided.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "decision", rename_all = "camelCase")]
pub enum TierDecision {
    /// The best survivor takes the job.
    #[serde(rename_all = "camelCase")]
    Placed {
        /// The winning node.
        node_id: NodeId,
    },
    /// No node survived; a node of this shape is provisioned.
    #[serde(rename_all = "camelCase")]
    Provision {
        /// The first candidate shape that fits.
        instance_type: String,
    },
    /// No node survived and nothing is provisioned here; the walk goes on.
    NotProvisioned {
        /// Why not.
        why: NoProvisionReason,
    },
}

/// Why a tier with no survivor does not provision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "reason", rename_all = "camelCase")]
pub enum NoProvisionReason {
    /// A pinned target never provisions.
    PinnedTarget,
    /// A fixed tier holds pre-registered cluster nodes only.
    FixedTier,
    /// The job must join a co-located peer already placed on a node.
    CoLocatedPeerPlaced,
    /// `sameAz: hard` with placed peers: a new node's AZ is not known in
    /// advance, so it cannot be shown to share theirs.
    PeerAzUnknownForNewNode,
    /// The tier is at its `maxNodes` (prospective nodes count).
    #[serde(rename_all = "camelCase")]
    AtMaxNodes {
        /// Nodes of the tier, prospective ones included.
        nodes: u32,
        /// The tier's cap.
        max_nodes: u32,
    },
    /// No candidate shape fits the job (or its group).
    NoShapeFits,
    /// The tier's capacity is lost with the failure domain a what-if
    /// takes away (`headroom`), so nothing is provisioned from it.
    CapacityLost,
}

impl std::fmt::Display for NoProvisionReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NoProvisionReason::PinnedTarget => write!(f, "a pinned target never provisions"),
            NoProvisionReason::FixedTier => write!(f, "fixed tier"),
            NoProvisionReason::CoLocatedPeerPlaced => write!(f, "a co-located peer is already placed"),
            NoProvisionReason::PeerAzUnknownForNewNode => write!(f, "sameAz hard: a new node's AZ is unknown"),
            NoProvisionReason::AtMaxNodes { nodes, max_nodes } => write!(f, "at maxNodes ({nodes} of {max_nodes})"),
            NoProvisionReason::NoShapeFits => write!(f, "no candidate instance type fits"),
            NoProvisionReason::CapacityLost => write!(f, "its capacity is lost with the domain"),
        }
    }
}

/// How many rejected nodes of one tier [`Trace::why_not_placed`] names
/// before it only counts the rest.
const NODES_NAMED_PER_TIER: usize = 5;

impl Trace {
    /// Why the walk placed nothing, in words, tier by tier (`tier cluster:
    /// b: needs 3 vCPU, 2 free; c: host port 1935/tcp taken; not
    /// provisioned: fixed tier. tier aws: ...`): each node of the tier with
    /// the filter that rejected it and its numbers (needed against free),
    /// then why the tier did not provision. Nodes of other pools or tiers,
    /// nodes a pin rules out and the node a re-placement leaves are not
    /// named.
    pub fn why_not_placed(&self) -> String {
        let tiers: Vec<String> = self
            .tiers
            .iter()
            .map(|tier| {
                let rejected: Vec<String> = tier
                    .nodes
                    .iter()
                    .filter_map(|n| match &n.verdict {
                        Verdict::Rejected { filter, rejection }
                            if !matches!(
                                filter,
                                Filter::TargetNode | Filter::Pool | Filter::Tier | Filter::RecoveryExclusion
                            ) =>
                        {
                            Some(format!("{}: {rejection}", n.node_id))
                        }
                        _ => None,
                    })
                    .collect();
                let mut words = format!("tier {}", tier.tier);
                if rejected.is_empty() {
                    words.push_str(": no node to take it");
                } else {
                    let named = rejected.len().min(NODES_NAMED_PER_TIER);
                    words.push_str(": ");
                    words.push_str(&rejected[..named].join("; "));
                    if rejected.len() > named {
                        words.push_str(&format!(" and {} more", rejected.len() - named));
                    }
                }
                match &tier.decision {
                    TierDecision::NotProvisioned { why } => words.push_str(&format!("; not provisioned: {why}")),
                    TierDecision::Placed { node_id } => words.push_str(&format!("; placed on {node_id}")),
                    TierDecision::Provision { instance_type } => {
                        words.push_str(&format!("; provisions {instance_type}"))
                    }
                }
                words
            })
            .collect();
        if tiers.is_empty() {
            "the pool has no tier".to_owned()
        } else {
            tiers.join(". ")
        }
    }
}
