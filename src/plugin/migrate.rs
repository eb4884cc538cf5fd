//! `migrate`: a `JobMigration` in the bundle's namespace; the operator runs the saga. By
//! default the command waits until the operator has accepted the migration (the saga started;
//! exit 0) or refused it (exit 1, with the operator's reason), and says when the job moves
//! with its co-located group; `--no-wait` returns once the resource is created.

use std::process::ExitCode;

use futures::StreamExt;
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};

use crate::crd::{JobMigration, JobMigrationSpec, JobMigrationStatus, MigrationStrategy};
use crate::decide::migration_status::group_words;
use crate::model::{MigrationPhase, wire_name};

use super::{PluginError, report_end, watch_named};

/// How the operator answered a `JobMigration`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MigrationAnswer {
    /// The saga started (and is where `phase` says); `summary` says what moves where.
    Accepted {
        /// The saga's phase when seen.
        phase: MigrationPhase,
        /// What moves where, with the co-located group moving along.
        summary: String,
    },
    /// The saga started and has already ended short of `done` (`aborted`, `lost`).
    Failed(String),
    /// The operator refused it (the job not running, nowhere to go, ...).
    Refused(String),
}

/// The answer a status gives, if the operator has answered yet.
pub fn answer(status: &JobMigrationStatus) -> Option<MigrationAnswer> {
    let Some(phase) = status.phase else {
        // Refused: no saga, the reason recorded.
        return status.reason.clone().map(MigrationAnswer::Refused);
    };
    let id = status.migration_id.clone().unwrap_or_default();
    let node = |n: &Option<String>| n.clone().unwrap_or_else(|| "?".to_owned());
    if phase.is_ended() && phase != MigrationPhase::Done {
        let why = status.reason.clone().unwrap_or_default();
        return Some(MigrationAnswer::Failed(format!(
            "migration {id} ended {}: {why}",
            wire_name(&phase)
        )));
    }
    Some(MigrationAnswer::Accepted {
        summary: format!(
            "migration {id} moves the job from {} to {}{}",
            node(&status.source_node_id),
            node(&status.target_node_id),
            group_words(&status.group)
        ),
        phase,
    })
}

/// The JobMigration `migrate` creates (named `<bundle>-<job>-` plus a suffix the API server
/// chooses, so a job can be migrated again later).
pub fn migration_resource(
    bundle: &str,
    job: &str,
    replica_index: u32,
    target_node_id: Option<String>,
    strategy: Option<MigrationStrategy>,
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

/// Creates `migration` in `namespace`; unless `no_wait`, waits for the operator's answer.
pub async fn create_and_wait(
    client: Client,
    namespace: &str,
    migration: JobMigration,
    no_wait: bool,
) -> Result<ExitCode, PluginError> {
    let name = create(client.clone(), namespace, migration).await?;
    println!("jobmigration/{name} created");
    if no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    let api: Api<JobMigration> = Api::namespaced(client, namespace);
    let end = match wait_for_answer(&api, &name).await? {
        MigrationAnswer::Accepted { phase, summary } => Ok(format!("accepted ({}): {summary}", wire_name(&phase))),
        MigrationAnswer::Failed(why) => Err(format!("failed: {why}")),
        MigrationAnswer::Refused(why) => Err(format!("refused: {why}")),
    };
    Ok(report_end(&format!("jobmigration/{name}"), end))
}

/// Watches JobMigration `name` until the operator has answered it.
pub async fn wait_for_answer(api: &Api<JobMigration>, name: &str) -> Result<MigrationAnswer, PluginError> {
    let mut migrations = watch_named(api, name, "migration");
    while let Some(migration) = migrations.next().await {
        if let Some(answer) = migration.status.as_ref().and_then(answer) {
            return Ok(answer);
        }
    }
    Err(PluginError::LostMigration(name.to_owned()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::GroupMemberStatus;

    #[test]
    fn no_answer_before_the_operator_wrote_one() {
        assert_eq!(answer(&JobMigrationStatus::default()), None);
    }

    #[test]
    fn a_refusal_is_the_recorded_reason_without_a_saga() {
        let refused = JobMigrationStatus {
            reason: Some("job default/ch1/0/package is not running".to_owned()),
            ..JobMigrationStatus::default()
        };
        assert_eq!(
            answer(&refused),
            Some(MigrationAnswer::Refused(
                "job default/ch1/0/package is not running".to_owned()
            ))
        );
    }

    #[test]
    fn an_accepted_migration_says_its_group_moves_with_it() {
        let accepted = JobMigrationStatus {
            migration_id: Some("0000abcd".to_owned()),
            phase: Some(MigrationPhase::Preparing),
            source_node_id: Some("node-a".to_owned()),
            target_node_id: Some("node-s1".to_owned()),
            group: vec![GroupMemberStatus {
                job_id: "default/ch1/0/encode".to_owned(),
                migration_id: "0000abce".to_owned(),
            }],
            ..JobMigrationStatus::default()
        };
        assert_eq!(
            answer(&accepted),
            Some(MigrationAnswer::Accepted {
                phase: MigrationPhase::Preparing,
                summary: "migration 0000abcd moves the job from node-a to node-s1 with its co-located group \
                          (default/ch1/0/encode)"
                    .to_owned(),
            })
        );
        let aborted = JobMigrationStatus {
            phase: Some(MigrationPhase::Aborted),
            reason: Some("preparing deadline passed".to_owned()),
            ..accepted
        };
        assert!(matches!(answer(&aborted), Some(MigrationAnswer::Failed(_))));
    }
}
