//! A drain's vocabulary: what becomes of its node, its phase and what
//! became of each job of the node. The core's drain records them and a
//! `NodeDrain`'s spec and status carry them, so both share these names.

use serde::{Deserialize, Serialize};

super::string_enum! {
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
}

impl DrainPhase {
    /// Whether the drain has ended (a new drain of the node may start).
    pub fn is_final(self) -> bool {
        matches!(self, Self::Done | Self::Partial | Self::Failed)
    }
}

super::string_enum! {
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
}

impl DrainJobStatus {
    /// Whether the job left the node before it went (`migrated`, `moved`).
    pub fn left_the_node(self) -> bool {
        matches!(self, Self::Migrated | Self::Moved)
    }
}

super::string_enum! {
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
        /// Keep the emptied node, cordoned and running, for planned work (a
        /// maintenance drain).
        Keep,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{schema_names, serde_names};

    #[test]
    fn the_drain_phase_schema_lists_every_serde_name() {
        assert_eq!(schema_names::<DrainPhase>(), serde_names(DrainPhase::ALL));
    }

    #[test]
    fn the_drain_job_status_schema_lists_every_serde_name() {
        assert_eq!(schema_names::<DrainJobStatus>(), serde_names(DrainJobStatus::ALL));
    }

    #[test]
    fn the_drain_after_schema_lists_every_serde_name() {
        assert_eq!(schema_names::<DrainAfter>(), serde_names(DrainAfter::ALL));
    }
}
