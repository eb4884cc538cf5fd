//! Why `migrateJob` or `abortMigration` is refused.

use serde::Serialize;

use crate::model::{BundleId, JobId, MigrationId, NodeId};

use crate::model::MigrationPhase;

/// Why `migrateJob` or `abortMigration` was refused.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, thiserror::Error)]
#[serde(tag = "refusal", rename_all = "camelCase")]
pub enum MigrationRefusal {
    /// Manager's initial snapshot is not complete yet: nothing is placed
    /// before it.
    #[error("AutoManager has not yet seen Manager's snapshot; job {job_id} cannot move yet")]
    #[serde(rename_all = "camelCase")]
    NotHydrated { job_id: JobId },
    /// The job is not one this AutoManager placed (no bundle job of that
    /// id).
    #[error("job {job_id} is not placed by this AutoManager")]
    #[serde(rename_all = "camelCase")]
    NotAutoManagerPlaced { job_id: JobId },
    /// The job has no instance running.
    #[error("job {job_id} is not running")]
    #[serde(rename_all = "camelCase")]
    NotRunning { job_id: JobId },
    /// The job's bundle is broken: its production ended, nothing of it is
    /// placed again until it is updated.
    #[error("job {job_id} belongs to broken bundle {bundle_id}")]
    #[serde(rename_all = "camelCase")]
    BundleBroken { job_id: JobId, bundle_id: BundleId },
    /// The job is dropped (by this AutoManager, or by a verdict Manager
    /// holds): it does not run again until its bundle is updated, and an
    /// instance of it still live is a stray, not a source to move.
    #[error("job {job_id} is dropped: it runs again once its bundle is updated")]
    #[serde(rename_all = "camelCase")]
    JobDropped { job_id: JobId },
    /// No concurrent migrations per job.
    #[error("job {job_id} is already migrating ({migration_id})")]
    #[serde(rename_all = "camelCase")]
    AlreadyMigrating {
        job_id: JobId,
        /// The migration in flight.
        migration_id: MigrationId,
    },
    /// The pin names the node the job already runs on.
    #[error("job {job_id} already runs on {node_id}")]
    #[serde(rename_all = "camelCase")]
    TargetIsSource { job_id: JobId, node_id: NodeId },
    /// Placement found nowhere for the target.
    #[error("no target for job {job_id}: {reason}")]
    #[serde(rename_all = "camelCase")]
    NowhereToPlace {
        job_id: JobId,
        /// Placement's reason.
        reason: String,
    },
    /// The job's co-located group moves as a unit, and it cannot: a member
    /// is not running or already migrating, or no target takes the whole
    /// group (the reason names the rule, the tier and the numbers).
    #[error("job {job_id} moves with its co-located group [{}], which cannot move: {reason}", .group.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))]
    #[serde(rename_all = "camelCase")]
    GroupCannotMove {
        /// The job asked for.
        job_id: JobId,
        /// Every member that would have moved with it (itself included).
        group: Vec<JobId>,
        /// Why not.
        reason: String,
    },
    /// No migration of that id is known.
    #[error("no migration {migration_id}")]
    #[serde(rename_all = "camelCase")]
    UnknownMigration {
        /// The id asked for.
        migration_id: MigrationId,
    },
    /// The migration has ended already.
    #[error("migration {migration_id} has already ended ({phase:?})")]
    #[serde(rename_all = "camelCase")]
    AlreadyEnded {
        migration_id: MigrationId,
        /// How it ended.
        phase: MigrationPhase,
    },
    /// The source has been told to stop: no clean rollback any more; the
    /// saga fails forward.
    #[error("migration {migration_id} is past its point of no return")]
    #[serde(rename_all = "camelCase")]
    PastPointOfNoReturn { migration_id: MigrationId },
}
