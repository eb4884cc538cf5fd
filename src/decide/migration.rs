//! What a `JobMigration` document asks, whoever applies it: the runtime job
//! it names, the options of its `migrateJob`, which answers of the core are
//! refusals (the document then waits for a change) and what `spec.abort`
//! says once the point of no return has passed. The operator's controller
//! and `standalone` both start and abort migrations by it.

use kube::ResourceExt;

use crate::automanager::{CommandError, MigrationOptions};
use crate::crd::{self, JobMigration, JobMigrationSpec};
use crate::model::{BundleId, JobId, NodeId, runtime_job_id};

/// The reason given to `abortMigration`.
pub const ABORT_REASON: &str = "spec.abort set on the JobMigration";
/// Why `spec.abort` did nothing: the migration passed its point of no
/// return and fails forward.
pub const ABORT_TOO_LATE: &str = "abort asked after the point of no return: the migration fails forward";

/// What a `JobMigration`'s spec asks of `migrateJob`.
pub fn options_of(spec: &JobMigrationSpec) -> MigrationOptions {
    MigrationOptions {
        strategy: spec.strategy,
        target_node_id: spec.target_node_id.as_deref().map(NodeId::from),
        override_reservation: spec.override_reservation,
    }
}

/// The runtime job a migration names: `<namespace>/<bundle>/<replica>/<job>`.
pub fn job_of(migration: &JobMigration) -> JobId {
    let namespace = migration
        .namespace()
        .unwrap_or_else(|| crd::DEFAULT_NAMESPACE.to_owned());
    let bundle = BundleId(format!("{namespace}/{}", migration.spec.bundle));
    runtime_job_id(&bundle, migration.spec.replica_index, &migration.spec.job_name)
}

/// Whether `migrateJob`'s error refuses the request (the job not running,
/// already migrating, nowhere to go, an unknown or departed node): the
/// refusal is recorded and waits for the document to change. Any other
/// error is transient and tried again.
pub fn migration_refused(error: &CommandError) -> bool {
    matches!(
        error,
        CommandError::Migration(_) | CommandError::UnknownNode(_) | CommandError::NodeGone(_)
    )
}
