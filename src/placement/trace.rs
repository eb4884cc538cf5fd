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
    /// The node.
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
        /// The filter.
        filter: Filter,
        /// The reason with its numbers.
        rejection: Rejection,
    },
    /// Passed every filter; ranked by this key.
    Survived {
        /// The key.
        key: PlacementKey,
    },
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
}
