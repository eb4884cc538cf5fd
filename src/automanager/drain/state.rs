//! What a drain reports (`DrainState`, its phases and job statuses) and
//! what `drainNode` takes (`DrainOptions`, `strategyFor`): plain data, as
//! `drainProgress` carries it and `drainStatus` reads it.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{JobId, NodeId, UnixMillis};

use crate::automanager::migration::MigrationStrategy;
use crate::model::MigrationId;

/// Where a drain is (`DrainState.phase`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DrainPhase {
    /// Migrations of its jobs are in flight.
    Migrating,
    /// No migration is in flight, but jobs (stuck ones) are still on the
    /// node: the drain waits for them to leave or for its timeout.
    Waiting,
    /// The terminate has been issued; Manager has not answered yet.
    Terminating,
    /// The node was terminated and every job had left it first (migrated,
    /// or moved some other way): nothing went down with it.
    Done,
    /// The timeout passed with jobs stuck: nothing was terminated, the node
    /// stays cordoned, and `jobs` names the stuck ones.
    Partial,
    /// The drain could not move every job off: a forced drain (an
    /// interruption's included) terminated the node with jobs still on it
    /// (they are `terminated`, recover per their `onRuntimeFailure`, and the
    /// reason names them), the node stopped under it, the terminate was
    /// refused, or an uncordon cancelled it.
    Failed,
}

impl DrainPhase {
    /// Whether the drain has ended (a new drain of the node may start).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Partial | Self::Failed)
    }
}

/// What became of one job of a drained node (`DrainState.jobs[].status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DrainJobStatus {
    /// Its migration is in flight.
    Migrating,
    /// Its migration completed: it lives on the target.
    Migrated,
    /// It left the node some other way (it ended, failed and was recovered
    /// elsewhere, or was deleted).
    Moved,
    /// The saga refused it, placement found nowhere for it, or its
    /// migration aborted: it stays where it is until the timeout.
    Stuck,
    /// It went down with the node: the node was terminated with it still
    /// on it (a forced drain at its timeout, an eviction) or stopped under
    /// it; it is recovered per its `onRuntimeFailure`. Never counted as
    /// moved.
    Terminated,
}

impl DrainJobStatus {
    /// Whether the job left the node before it went (`migrated`, `moved`).
    pub fn left_the_node(self) -> bool {
        matches!(self, Self::Migrated | Self::Moved)
    }
}

/// What a drain does with its node once every job has left it. The spec's
/// drain always terminates; keeping the node is this project's extension
/// for planned work on it (a maintenance drain): the node ends emptied,
/// cordoned and running, and `uncordonNode` returns it to service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum DrainAfter {
    /// Terminate the emptied node (the spec's drain-then-terminate).
    #[default]
    Terminate,
    /// Keep the emptied node, cordoned and running (a maintenance drain).
    Keep,
}

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
    /// What becomes of the emptied node. When absent: kept for a
    /// registered cluster server (a node of a `local-servers` tier, where
    /// terminating takes a studio server away), terminated otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<DrainAfter>,
}
