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

/// Why `abortMigration`'s error refuses the abort (the saga is past the
/// point of no return, or already ended): recorded in the status, and not
/// asked again until the document changes. `None` for any other error,
/// which is transient and tried again.
pub fn abort_refusal(error: &CommandError) -> Option<String> {
    match error {
        CommandError::Migration(refusal) => Some(refusal.to_string()),
        _ => None,
    }
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

#[cfg(test)]
mod tests {
    use super::abort_refusal;
    use crate::automanager::{CommandError, MigrationId, MigrationRefusal};

    #[test]
    fn only_the_sagas_own_refusal_of_an_abort_is_recorded_and_anything_else_is_tried_again() {
        let refused = CommandError::Migration(MigrationRefusal::PastPointOfNoReturn {
            migration_id: MigrationId("0badcafe".to_owned()),
        });
        let reason = abort_refusal(&refused).expect("a refusal is recorded");
        assert!(reason.contains("0badcafe"), "the reason names the migration: {reason}");
        assert_eq!(abort_refusal(&CommandError::Closed), None);
    }
}
