//! What a drain reports (`DrainState`, its phases and job statuses) and
//! what `drainNode` takes (`DrainOptions`, `strategyFor`): plain data, as
//! `drainProgress` carries it and `drainStatus` reads it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::automanager::fleet::Fleet;
use crate::model::{
    DrainAfter, DrainJobStatus, DrainPhase, InterruptionKind, JobId, MigrationId, MigrationStrategy, NodeId, UnixMillis,
};

/// One job of a drain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainJob {
    pub job_id: JobId,
    /// What became of it.
    pub status: DrainJobStatus,
    /// The migration started for it, if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_id: Option<MigrationId>,
    /// Why it is stuck (or terminated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// `DrainState`: a drain as `drainProgress` reports it and `drainStatus`
/// reads it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainState {
    /// The node drained.
    pub node_id: NodeId,
    /// Where the drain is.
    pub phase: DrainPhase,
    /// When it started.
    pub started: UnixMillis,
    /// How long after `started` it times out.
    pub timeout_ms: u64,
    /// Whether the node is terminated at the timeout regardless.
    pub force: bool,
    /// What becomes of the node once every job has left it.
    #[serde(default)]
    pub after: DrainAfter,
    /// Every job that was bound to the node when the drain started.
    pub jobs: Vec<DrainJob>,
    /// Why it ended as it did (`partial`, `failed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// Which migration strategy the caller of a drain gives each job
/// (`strategyFor`): one per job where given, else the default. A job the
/// caller gives none moves with the strategy it declares
/// (`requirements.migrationStrategy`), else `stopThenStart`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StrategyFor {
    /// For every job not named below.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<MigrationStrategy>,
    /// Per job.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub jobs: BTreeMap<JobId, MigrationStrategy>,
}

impl StrategyFor {
    /// One strategy for every job.
    pub fn all(strategy: MigrationStrategy) -> Self {
        Self {
            default: Some(strategy),
            jobs: BTreeMap::new(),
        }
    }

    /// The strategy the caller gives `job`, if any.
    pub fn given(&self, job: &JobId) -> Option<MigrationStrategy> {
        self.jobs.get(job).copied().or(self.default)
    }
}

/// `drainNode`'s options.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DrainOptions {
    /// Default `DEFAULT_DRAIN_TIMEOUT_MS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
    /// Terminate at the timeout regardless.
    #[serde(default)]
    pub force: bool,
    /// Per-job migration strategy (a job given none moves with its own).
    #[serde(default)]
    pub strategy_for: StrategyFor,
    /// What becomes of the emptied node. When absent it is terminated, as
    /// the spec's drain does, whatever the node; `keep` is a person's
    /// choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<DrainAfter>,
}

/// `DEFAULT_DRAIN_TIMEOUT_MS`: how long a drain waits for its node to empty
/// when no timeout is given (10 min).
pub const DEFAULT_DRAIN_TIMEOUT_MS: u64 = 10 * 60_000;

/// One drain: its state, its deadline and whether its terminate is out.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Drain {
    pub(super) state: DrainState,
    /// When the timeout falls (`started + timeout_ms`).
    pub(super) deadline: UnixMillis,
}

impl Drain {
    pub(super) fn terminate_issued(&self) -> bool {
        self.state.phase == DrainPhase::Terminating || self.state.phase == DrainPhase::Done
    }
}

/// Every drain (the running ones and the last one of each node) and every
/// interruption notice taken.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct Drains {
    pub(super) by_node: BTreeMap<NodeId, Drain>,
    pub(in crate::automanager) interruptions: Interruptions,
    /// Cordons of a disposed core, applied once this one is hydrated.
    carried_cordons: Vec<NodeId>,
}

impl Drains {
    /// What a fresh core carries on from a disposed one (after a stream
    /// break): its cordons, its drains and the interruption notices it
    /// took, which are this AutoManager's own state and not in Manager's
    /// snapshot. A drain keeps its deadline, so a forced one still
    /// terminates its node on time and another one still ends `partial`;
    /// the disposed core's migrations end with it (each drained job's
    /// status follows), and a notice Manager replays again is one the
    /// drain already has.
    pub(in crate::automanager) fn carried_from(previous: &Drains, fleet: &Fleet) -> Self {
        Self {
            by_node: previous.by_node.clone(),
            interruptions: previous.interruptions.clone(),
            carried_cordons: fleet.iter().filter(|n| n.cordoned).map(|n| n.id.clone()).collect(),
        }
    }

    /// Starts `drain` on `node`, in place of its last one.
    pub(super) fn begin(&mut self, node: &NodeId, drain: Drain) {
        self.by_node.insert(node.clone(), drain);
    }

    /// The cordons carried from a disposed core, handed over once.
    pub(super) fn take_carried_cordons(&mut self) -> Vec<NodeId> {
        std::mem::take(&mut self.carried_cordons)
    }

    /// The drain of `node` (running, or the last one).
    pub(in crate::automanager) fn get(&self, node: &NodeId) -> Option<&DrainState> {
        self.by_node.get(node).map(|d| &d.state)
    }

    /// Every drain, in node order.
    pub(in crate::automanager) fn iter(&self) -> impl Iterator<Item = &DrainState> {
        self.by_node.values().map(|d| &d.state)
    }

    /// Whether jobs lost with `node` were lost to a provider reclaim.
    pub(in crate::automanager) fn is_reclaimed(&self, node: &NodeId) -> bool {
        self.interruptions.get(node).is_some()
    }

    /// The earliest timeout of a drain that has not issued its terminate.
    pub(in crate::automanager) fn next_deadline(&self) -> Option<UnixMillis> {
        self.by_node
            .values()
            .filter(|d| !d.state.phase.is_final() && !d.terminate_issued())
            .map(|d| d.deadline)
            .min()
    }

    /// A running drain's deadline, made no later than `deadline` and forced
    /// (an interruption notice for a node already draining); true when that
    /// changed it.
    pub(in crate::automanager) fn tighten(&mut self, node: &NodeId, deadline: UnixMillis) -> bool {
        let Some(drain) = self.by_node.get_mut(node).filter(|d| !d.state.phase.is_final()) else {
            return false;
        };
        let mut changed = !drain.state.force || drain.state.after != DrainAfter::Terminate;
        drain.state.force = true;
        // The provider takes the node at the deadline: a maintenance drain
        // under way can no longer keep it.
        drain.state.after = DrainAfter::Terminate;
        if deadline < drain.deadline && !drain.terminate_issued() {
            drain.deadline = deadline;
            drain.state.timeout_ms = (deadline - drain.state.started).max(0) as u64;
            changed = true;
        }
        changed
    }

    pub(super) fn running(&self, node: &NodeId) -> bool {
        self.by_node.get(node).is_some_and(|d| !d.state.phase.is_final())
    }

    pub(super) fn running_nodes(&self) -> Vec<NodeId> {
        self.by_node
            .iter()
            .filter(|(_, d)| !d.state.phase.is_final())
            .map(|(n, _)| n.clone())
            .collect()
    }
}

/// `SPOT_INTERRUPTION_DRAIN_MARGIN_MS`: a drain for a notice with a
/// deadline times out this long before it (30 s).
pub const SPOT_INTERRUPTION_DRAIN_MARGIN_MS: u64 = 30_000;
/// `DEFAULT_SPOT_INTERRUPTION_DRAIN_MS`: a spot interruption without a
/// deadline drains for this long (90 s, EC2's two-minute warning less the
/// margin).
pub const DEFAULT_SPOT_INTERRUPTION_DRAIN_MS: u64 = 90_000;
/// `DEFAULT_REBALANCE_DRAIN_MS`: a rebalance recommendation without a
/// deadline drains for this long (5 min).
pub const DEFAULT_REBALANCE_DRAIN_MS: u64 = 5 * 60_000;

/// `handleNodeInterruption`'s notice.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterruptionNotice {
    /// `spot-interruption` or `rebalance`.
    pub kind: InterruptionKind,
    /// When the provider reclaims the node, if it said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<UnixMillis>,
    /// Per-job migration strategy, as for `drainNode`.
    #[serde(default)]
    pub strategy_for: StrategyFor,
}

impl InterruptionNotice {
    /// The drain's timeout for a notice taken at `now`: `deadline − now −
    /// SPOT_INTERRUPTION_DRAIN_MARGIN_MS` (never below zero), or the kind's
    /// default without a deadline.
    pub fn drain_timeout_ms(&self, now: UnixMillis) -> u64 {
        match self.deadline {
            Some(deadline) => {
                let left = deadline.saturating_sub(now).max(0) as u64;
                left.saturating_sub(SPOT_INTERRUPTION_DRAIN_MARGIN_MS)
            }
            None => match self.kind {
                InterruptionKind::Rebalance => DEFAULT_REBALANCE_DRAIN_MS,
                // A kind this build does not know is read as the more
                // urgent one: the node may go at any moment.
                InterruptionKind::SpotInterruption | InterruptionKind::Unknown(_) => DEFAULT_SPOT_INTERRUPTION_DRAIN_MS,
            },
        }
    }
}

/// `NodeInterruptionState`: what `nodeInterrupted` reports and
/// `nodeInterruption` reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeInterruptionState {
    pub node_id: NodeId,
    /// The last notice's kind. Written as `interruptionKind`: a notification
    /// line's `kind` is the callback's name (`nodeInterrupted`), and a key
    /// may appear only once in a JSON object.
    #[serde(rename = "interruptionKind")]
    pub kind: InterruptionKind,
    /// The provider's deadline, if it gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deadline: Option<UnixMillis>,
    /// When the notice was taken.
    pub noticed_at: UnixMillis,
    /// The drain it started or tightened.
    pub drain: DrainState,
}

/// A notice taken for a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(in crate::automanager) struct Notice {
    pub(in crate::automanager) kind: InterruptionKind,
    pub(in crate::automanager) deadline: Option<UnixMillis>,
    pub(in crate::automanager) noticed_at: UnixMillis,
}

/// The notices taken, by node, until the node leaves the fleet or an
/// uncordon withdraws it.
#[derive(Clone, Debug, Default)]
pub(in crate::automanager) struct Interruptions {
    by_node: BTreeMap<NodeId, Notice>,
    /// Notices Manager relayed, not yet acted on.
    relayed: Vec<(NodeId, InterruptionNotice, UnixMillis)>,
}

impl Interruptions {
    /// Takes `notice` for `node`; the notice it replaces, if any.
    pub(in crate::automanager) fn take(&mut self, node: &NodeId, notice: Notice) -> Option<Notice> {
        self.by_node.insert(node.clone(), notice)
    }

    /// Puts back what [`Interruptions::take`] replaced (a notice not acted
    /// on leaves nothing behind).
    pub(in crate::automanager) fn restore(&mut self, node: &NodeId, previous: Option<Notice>) {
        match previous {
            Some(notice) => self.by_node.insert(node.clone(), notice),
            None => self.by_node.remove(node),
        };
    }

    /// Keeps a notice Manager relayed, acted on before the next placement
    /// round.
    pub(in crate::automanager) fn relay(&mut self, node: NodeId, notice: InterruptionNotice, noticed_at: UnixMillis) {
        self.relayed.push((node, notice, noticed_at));
    }

    /// The relayed notices not yet acted on, handed over once.
    pub(in crate::automanager) fn take_relayed(&mut self) -> Vec<(NodeId, InterruptionNotice, UnixMillis)> {
        std::mem::take(&mut self.relayed)
    }

    pub(in crate::automanager) fn get(
        &self,
        node: &NodeId,
    ) -> Option<(InterruptionKind, Option<UnixMillis>, UnixMillis)> {
        self.by_node.get(node).map(|n| (n.kind, n.deadline, n.noticed_at))
    }

    /// `uncordonNode` withdraws the notice with the drain.
    pub(in crate::automanager) fn withdraw(&mut self, node: &NodeId) {
        self.by_node.remove(node);
    }

    /// Notices for nodes the fleet no longer holds are forgotten (their jobs
    /// have long been recovered).
    pub(in crate::automanager) fn forget_missing(&mut self, fleet: &Fleet) {
        if self.by_node.keys().any(|n| !fleet.contains(n)) {
            self.by_node.retain(|n, _| fleet.contains(n));
        }
    }
}
