//! `migrate`: a `JobMigration` in the bundle's namespace; the operator runs the saga.

use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::{JobMigration, JobMigrationSpec, MigrationStrategy};

use super::PluginError;

/// The JobMigration `migrate` creates (named `<bundle>-<job>-` plus a suffix the API server
/// chooses, so a job can be migrated again later).
pub fn migration_resource(
    bundle: &str,
    job: &str,
    replica_index: u32,
    target_node_id: Option<String>,
    strategy: MigrationStrategy,
    override_reservation: bool,
) -> JobMigration {
    let mut migration = JobMigration::new(
        "",
        JobMigrationSpec {
            bundle: bundle.to_owned(),
            replica_index,
            job_name: job.to_owned(),
            strategy,
            target_node_id,
            override_reservation,
            abort: false,
        },
    );
    migration.metadata.name = None;
    migration.metadata.generate_name = Some(format!("{bundle}-{job}-"));
    migration
}

/// Creates `migration` in `namespace`; returns its name.
pub async fn create(client: Client, namespace: &str, migration: JobMigration) -> Result<String, PluginError> {
    let api: Api<JobMigration> = Api::namespaced(client, namespace);
    let created = api
        .create(&PostParams::default(), &migration)
        .await
        .map_err(PluginError::request(format!("create jobmigration in {namespace}")))?;
    Ok(created.name_any())
}
