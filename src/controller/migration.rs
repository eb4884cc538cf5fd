//! The `JobMigration` controller: a resource starts `migrateJob` once (its
//! status records the migration id), its status follows the saga (phase
//! with a timestamp per transition, source and target node and instance
//! keys, point of no return, reason), and `spec.abort` aborts it
//! (`abortMigration`: a clean rollback only before the point of no return;
//! after it the saga fails forward and the status says so). Every
//! `migrationPhase` notification reconciles the migrations. The migrations a
//! drain starts are recorded as `JobMigration`s owned by the drain.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action, Config, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::automanager::{
    CommandError, MigrationId, MigrationOptions, MigrationPhase, MigrationState, MigrationStrategy, QueryError,
};
use crate::crd::{self, JobMigration, JobMigrationStatus, PhaseTransition};
use crate::model::{BundleId, NodeId, runtime_job_id};

use super::conditions::{self, Observed, READY, STALLED};
use super::{Context, ReconcileError, status};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "jobmigration";

/// Runs the controller over the migrations of `namespace` (all when
/// `None`) until `shutdown` resolves; every migration is reconciled again
/// when `progressed` yields.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    progressed: impl Stream<Item = ()> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<JobMigration> = match namespace {
        Some(namespace) => Api::namespaced(ctx.client.clone(), namespace),
        None => Api::all(ctx.client.clone()),
    };
    Controller::new(api, watcher::Config::default())
        .with_config(Config::default().debounce(Duration::from_millis(200)))
        .reconcile_all_on(progressed)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

fn key(migration: &JobMigration) -> String {
    format!("{}/{}", migration.namespace().unwrap_or_default(), migration.name_any())
}

fn error_policy(migration: Arc<JobMigration>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.failed(CONTROLLER, &key(&migration), error)
}

fn strategy(s: crd::MigrationStrategy) -> MigrationStrategy {
    match s {
        crd::MigrationStrategy::StopThenStart => MigrationStrategy::StopThenStart,
        crd::MigrationStrategy::Overlap => MigrationStrategy::Overlap,
        crd::MigrationStrategy::Handover => MigrationStrategy::Handover,
    }
}

fn word<T: serde::Serialize>(value: T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn rfc3339(at_ms: i64) -> String {
    Timestamp::from_millisecond(at_ms)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[tracing::instrument(skip_all, fields(migration = %key(&migration)))]
async fn reconcile(migration: Arc<JobMigration>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let started = Instant::now();
    let object = key(&migration);
    if !ctx.core.inspect(|core, _| core.is_hydrated()).await? {
        return Err(ReconcileError::NotHydrated);
    }
    let previous = ctx
        .known_status(
            CONTROLLER,
            &object,
            migration.meta().resource_version.as_ref(),
            migration.status.clone(),
        )
        .unwrap_or_default();
    let mut refused = None;
    // A migration a drain started carries its id in an annotation.
    let adopted = migration.annotations().get(MIGRATION_ID).cloned();
    let id = match previous.migration_id.clone().or(adopted) {
        Some(id) => Some(MigrationId(id)),
        None if migration.spec.abort => None,
        None => {
            let namespace = migration.namespace().unwrap_or_default();
            let bundle = BundleId(format!("{namespace}/{}", migration.spec.bundle));
            let job_id = runtime_job_id(&bundle, migration.spec.replica_index, &migration.spec.job_name);
            let options = MigrationOptions {
                strategy: strategy(migration.spec.strategy),
                target_node_id: migration.spec.target_node_id.clone().map(NodeId),
                override_reservation: migration.spec.override_reservation,
            };
            match ctx.core.migrate_job(job_id, options).await {
                Ok(id) => Some(id),
                Err(CommandError::Closed) => return Err(ReconcileError::ReadCore(QueryError::Closed)),
                // Not running, nowhere to go, already migrating: waits for
                // a change of the resource.
                Err(e) => {
                    refused = Some(e.to_string());
                    None
                }
            }
        }
    };
    let mut state = match &id {
        Some(id) => ctx.core.migration_by_id(id.clone()).await?,
        None => None,
    };
    if migration.spec.abort
        && let Some(s) = &state
        && !s.phase.is_ended()
    {
        match ctx
            .core
            .abort_migration(s.migration_id.clone(), "spec.abort set".to_owned())
            .await
        {
            Ok(()) => state = ctx.core.migration_by_id(s.migration_id.clone()).await?,
            Err(CommandError::Closed) => return Err(ReconcileError::ReadCore(QueryError::Closed)),
            // Past the point of no return: the saga fails forward.
            Err(e) => refused = Some(e.to_string()),
        }
    }
    let next = migration_status(&previous, id, state.as_ref(), refused, migration.meta().generation);
    if status::differs(&previous, &next, |s: &mut JobMigrationStatus| &mut s.conditions) {
        let api: Api<JobMigration> = Api::namespaced(ctx.client.clone(), &migration.namespace().unwrap_or_default());
        status::apply(&api, &migration.name_any(), CONTROLLER, &next, &ctx.metrics).await?;
        ctx.wrote(CONTROLLER, &object, migration.meta().resource_version.clone(), &next);
    }
    ctx.timed(CONTROLLER, started);
    ctx.succeeded(CONTROLLER, &object);
    Ok(Action::await_change())
}

/// The status a migration state implies (what was recorded stands once the
/// core no longer holds the migration, e.g. after a leader change).
fn migration_status(
    previous: &JobMigrationStatus,
    id: Option<MigrationId>,
    state: Option<&MigrationState>,
    refused: Option<String>,
    generation: Option<i64>,
) -> JobMigrationStatus {
    let mut next = previous.clone();
    next.migration_id = id.map(|id| id.0).or(next.migration_id);
    if let Some(s) = state {
        next.phase = Some(word(s.phase));
        next.transitions = s
            .transitions
            .iter()
            .map(|t| PhaseTransition {
                phase: word(t.phase),
                at: rfc3339(t.at),
            })
            .collect();
        next.source_node_id = Some(s.source_node_id.to_string());
        next.target_node_id = Some(s.target_node_id.to_string());
        next.source_instance_key = Some(s.source_key.to_string());
        next.target_instance_key = Some(s.target_key.to_string());
        next.point_of_no_return_passed = s.past_point_of_no_return;
        next.reason.clone_from(&s.reason);
    }
    let observed = match (&refused, state.map(|s| s.phase)) {
        (Some(why), _) => vec![
            Observed::no(READY, "Refused", why.clone()),
            Observed::yes(STALLED, "Refused", why.clone()),
        ],
        (None, Some(MigrationPhase::Done)) => vec![
            Observed::yes(READY, "Done", "the job runs on the target"),
            Observed::no(STALLED, "Done", ""),
        ],
        (None, Some(phase @ (MigrationPhase::Aborted | MigrationPhase::Lost))) => {
            let why = next.reason.clone().unwrap_or_default();
            vec![
                Observed::no(READY, word(phase), why.clone()),
                Observed::yes(STALLED, word(phase), why),
            ]
        }
        (None, Some(phase)) => vec![
            Observed::no(READY, word(phase), "the migration is running"),
            Observed::no(STALLED, word(phase), ""),
        ],
        (None, None) => return next,
    };
    next.conditions = conditions::merge(
        &previous.conditions,
        conditions::with_reconciling(observed, &[]),
        generation,
    );
    next
}

/// Annotation naming the migration a `JobMigration` records (set by the
/// operator on the ones it makes for a drain's migrations).
pub const MIGRATION_ID: &str = "automanager.norsk.video/migration-id";

/// A drain started migrations: each is recorded as a `JobMigration` in its
/// bundle's namespace, owned by the `NodeDrain` when there is one, so the
/// work in flight is visible with `kubectl get norsk`.
pub async fn record_drain_migrations(ctx: &Context, drain: &crate::automanager::DrainState) {
    let drains: Api<crd::NodeDrain> = Api::all(ctx.client.clone());
    let owner = drains
        .get_opt(&super::node_status::resource_name(drain.node_id.as_str()))
        .await
        .ok()
        .flatten()
        .and_then(|d| d.controller_owner_ref(&()));
    for job in &drain.jobs {
        let Some(id) = &job.migration_id else { continue };
        let mut parts = job.job_id.as_str().splitn(4, '/');
        let (Some(namespace), Some(bundle), Some(replica), Some(job_name)) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let Ok(Some(state)) = ctx.core.migration_by_id(id.clone()).await else {
            continue;
        };
        let name = super::node_status::resource_name(&format!("drain-{}", id.0));
        let mut metadata = serde_json::json!({"name": name, "annotations": {MIGRATION_ID: id.0}});
        if let Some(owner) = &owner {
            metadata["ownerReferences"] = serde_json::json!([owner]);
        }
        let object = serde_json::json!({
            "apiVersion": JobMigration::api_version(&()),
            "kind": JobMigration::kind(&()),
            "metadata": metadata,
            "spec": {
                "bundle": bundle,
                "replicaIndex": replica.parse::<u32>().unwrap_or_default(),
                "jobName": job_name,
                "strategy": word(state.strategy),
            },
        });
        let api: Api<JobMigration> = Api::namespaced(ctx.client.clone(), namespace);
        let params = kube::api::PatchParams::apply(&status::field_manager(CONTROLLER)).force();
        if let Err(e) = api.patch(&name, &params, &kube::api::Patch::Apply(&object)).await {
            tracing::warn!(migration = %id.0, error = %e, "failed to record a drain's migration");
        }
    }
}
