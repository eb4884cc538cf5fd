//! The `JobMigration` controller: a resource starts `migrateJob` on the
//! core for its job (bundle, replica and job name resolved to the runtime
//! job id); one a drain created (annotated with its migration id) follows
//! that migration instead. Status: see [`crate::decide::migration_status`], kept
//! current on every migration notification. `spec.abort: true` aborts
//! (`abortMigration`) — a clean rollback only before the point of no
//! return; after it the status says the saga fails forward.
//!
//! Restarts and leader changes lose nothing: a migration recorded in
//! flight that the (new) core does not hold is not silently dropped — the
//! status ends `done` when the job is found running on its target,
//! `aborted` when it still runs on its source short of the point of no
//! return, else `lost`, with the recorded phase and where the job is in
//! the reason. A person's JobMigration rolled back that way is started again by the
//! new term: the request still stands, and the job never left its source (the
//! `Restarted` Event says so). A drain's migrations are left `aborted`: their drain
//! starts again and moves the job itself.

use std::sync::Arc;

use futures::Stream;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};

use crate::automanager::MigrationId;
use crate::crd::{self, JobMigration, JobMigrationStatus};
use crate::model::{BundleId, JobId, MigrationPhase, wire_name};

use super::drain_follow::{DrainContext, after_status, run_controller};
use super::error::{ApplyError, DecideError, ReadError, WriteStatusError};
use super::status::StatusWriter;
use super::{Context, ReconcileError};
use crate::decide::migration::{ABORT_REASON, ABORT_TOO_LATE, abort_refusal, job_of, migration_refused, options_of};
use crate::decide::migration_status::{
    Unfollowed, conditions_of, ended_without_core, is_recorded, status_of, unfollowed,
};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "jobmigration";
/// Annotation: the migration a drain started for this resource.
pub const MIGRATION_ID: &str = "automanager.norsk.video/migration-id";
/// Label: the `NodeDrain` whose migration this is.
pub const DRAIN: &str = "automanager.norsk.video/drain";

/// Runs the controller until `shutdown` resolves, over the migrations of
/// the shared namespace (all when none); `notified` carries the resources
/// notifications were about.
pub async fn run(
    shared: Arc<DrainContext>,
    notified: impl Stream<Item = ObjectRef<JobMigration>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<JobMigration> = match &shared.namespace {
        Some(namespace) => Api::namespaced(shared.ctx.client.clone(), namespace),
        None => Api::all(shared.ctx.client.clone()),
    };
    run_controller(api, shared, notified, shutdown, reconcile, error_policy).await;
}

fn key(migration: &JobMigration) -> String {
    format!("{}/{}", namespace(migration), migration.name_any())
}

fn namespace(migration: &JobMigration) -> String {
    migration
        .namespace()
        .unwrap_or_else(|| crd::DEFAULT_NAMESPACE.to_owned())
}

/// The status writer of `migration`'s namespace.
fn writer<'a>(ctx: &'a Context, migration: &JobMigration) -> StatusWriter<'a, JobMigration> {
    StatusWriter::new(
        ctx,
        Api::namespaced(ctx.client.clone(), &namespace(migration)),
        CONTROLLER,
    )
}

#[tracing::instrument(skip_all, fields(migration = %key(&migration)))]
async fn reconcile(migration: Arc<JobMigration>, shared: Arc<DrainContext>) -> Result<Action, ReconcileError> {
    let key = key(&migration);
    shared
        .ctx
        .reconciling(CONTROLLER, &key, reconcile_once(migration, shared.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile`].
async fn reconcile_once(migration: Arc<JobMigration>, shared: Arc<DrainContext>) -> Result<Action, ReconcileError> {
    let ctx = &shared.ctx;
    if migration.meta().deletion_timestamp.is_some() {
        writer(ctx, &migration).forget(&migration.name_any());
        return Ok(Action::await_change());
    }
    if !ctx.core.read(|core| core.is_hydrated()).await? {
        return Err(DecideError::NotHydrated.into());
    }
    apply(&migration, &shared).await
}

fn error_policy(migration: Arc<JobMigration>, error: &ReconcileError, shared: Arc<DrainContext>) -> Action {
    shared.ctx.failed(CONTROLLER, &key(&migration), error)
}

async fn apply(migration: &JobMigration, shared: &DrainContext) -> Result<Action, ReconcileError> {
    let key = key(migration);
    let recorded = writer(&shared.ctx, migration).known(migration).unwrap_or_default();
    let adopted = migration
        .annotations()
        .get(MIGRATION_ID)
        .map(|id| MigrationId(id.clone()));
    let id = recorded
        .migration_id
        .clone()
        .map(MigrationId)
        .or(adopted)
        .or_else(|| shared.started(&key));
    let next = match id {
        Some(id) => {
            awaiting_bundle(migration, shared).await?;
            shared.follows(id.clone(), ObjectRef::from_obj(migration));
            follow(migration, shared, id, &recorded).await?
        }
        None if migration.spec.abort => aborted_unstarted(shared).await?,
        None => start(migration, shared, &key).await?,
    };
    let ended = next.phase.is_none_or(MigrationPhase::is_ended);
    write_status(migration, shared, &recorded, next).await?;
    Ok(after_status(ended))
}

/// Waits while the core does not know the migrating job's bundle although
/// the Bundle exists: a new term on a Manager without a bundle store hears
/// of a job only once its Bundle is applied, and judging the migration
/// before that would take a job that runs for one that is lost.
async fn awaiting_bundle(migration: &JobMigration, shared: &DrainContext) -> Result<(), ReconcileError> {
    let namespace = namespace(migration);
    let bundle = BundleId(format!("{namespace}/{}", migration.spec.bundle));
    let id = bundle.clone();
    let known = shared.ctx.core.read(move |core| core.bundle(&id).is_some()).await?;
    if known {
        return Ok(());
    }
    let api: Api<crd::Bundle> = Api::namespaced(shared.ctx.client.clone(), &namespace);
    let exists = api
        .get_opt(&migration.spec.bundle)
        .await
        .map_err(|source| ReadError::List {
            kind: "Bundle",
            selector: None,
            source,
        })?
        .is_some();
    if exists {
        return Err(DecideError::BundleNotApplied {
            bundle: bundle.to_string(),
        }
        .into());
    }
    Ok(())
}

/// `migrateJob`; a refusal (the job not running, already migrating,
/// nowhere to go) is recorded and waits for a change.
async fn start(
    migration: &JobMigration,
    shared: &DrainContext,
    key: &str,
) -> Result<JobMigrationStatus, ReconcileError> {
    match shared
        .ctx
        .core
        .migrate_job(job_of(migration), options_of(&migration.spec))
        .await
    {
        Ok(id) => {
            shared.start(key, id.clone());
            shared.follows(id.clone(), ObjectRef::from_obj(migration));
            let state = shared.ctx.core.migration_by_id(id.clone()).await?;
            // The Manager at hand cannot carry the strategy out: said once,
            // as the migration starts.
            if let Some(note) = state.as_ref().and_then(|s| s.note.clone()) {
                shared.ctx.publish(
                    Event {
                        type_: EventType::Normal,
                        reason: "StrategyChanged".to_owned(),
                        note: Some(note),
                        action: "Migrate".to_owned(),
                        secondary: None,
                    },
                    ObjectRef::from_obj(migration).into(),
                );
            }
            Ok(state.map_or_else(
                || JobMigrationStatus {
                    migration_id: Some(id.to_string()),
                    ..JobMigrationStatus::default()
                },
                |s| status_of(&s),
            ))
        }
        Err(e) if migration_refused(&e) => Ok(JobMigrationStatus {
            reason: Some(e.to_string()),
            ..JobMigrationStatus::default()
        }),
        Err(source) => Err(ApplyError::Command {
            action: "migrate",
            object: format!("job {} (JobMigration {key})", job_of(migration)),
            source,
        }
        .into()),
    }
}

/// `spec.abort` before any migration started: nothing to roll back.
async fn aborted_unstarted(shared: &DrainContext) -> Result<JobMigrationStatus, ReadError> {
    let now = shared.ctx.core.read(|core| core.now()).await?;
    Ok(ended_without_core(
        &JobMigrationStatus::default(),
        MigrationPhase::Aborted,
        now,
        "aborted before it started: nothing was moved".to_owned(),
    ))
}

/// The recorded migration as the core reports it, aborted when asked; or,
/// when the core does not hold it, how it ended while no one followed it.
async fn follow(
    migration: &JobMigration,
    shared: &DrainContext,
    id: MigrationId,
    recorded: &JobMigrationStatus,
) -> Result<JobMigrationStatus, ReconcileError> {
    let core = &shared.ctx.core;
    let job_id = job_of(migration);
    let found = core
        .migration_by_id(id.clone())
        .await?
        .filter(|s| is_recorded(s, job_id.as_str(), recorded));
    let Some(mut state) = found else {
        return match ended_elsewhere(shared, &job_id, recorded).await? {
            Unfollowed::Ended(status) => Ok(status),
            // The person's request still stands: the new term carries it out from the
            // start (a drain's migrations are started again by their drain instead).
            Unfollowed::RolledBack { phase, source, status }
                if !migration.spec.abort && !migration.annotations().contains_key(MIGRATION_ID) =>
            {
                let note = format!(
                    "{TERM_ENDED} during {}, before the point of no return: the job stayed on {source}; started again",
                    wire_name(&phase)
                );
                shared.ctx.publish(
                    Event {
                        type_: EventType::Normal,
                        reason: "Restarted".to_owned(),
                        note: Some(note),
                        action: "Migrate".to_owned(),
                        secondary: None,
                    },
                    ObjectRef::from_obj(migration).into(),
                );
                drop(status);
                start(migration, shared, &key(migration)).await
            }
            Unfollowed::RolledBack { status, .. } => Ok(status),
        };
    };
    if migration.spec.abort && !state.phase.is_ended() {
        if state.past_point_of_no_return {
            let mut status = status_of(&state);
            status.reason = Some(ABORT_TOO_LATE.to_owned());
            return Ok(status);
        }
        match core.abort_migration(id.clone(), ABORT_REASON.to_owned()).await {
            Ok(()) => {
                if let Some(after) = core.migration_by_id(id).await? {
                    state = after;
                }
            }
            Err(source) => {
                if let Some(reason) = abort_refusal(&source) {
                    let mut status = status_of(&state);
                    status.reason = Some(reason);
                    return Ok(status);
                }
                return Err(ApplyError::Command {
                    action: "abort",
                    object: format!("migration {id} (JobMigration {})", key(migration)),
                    source,
                }
                .into());
            }
        }
    }
    Ok(status_of(&state))
}

/// A migration recorded in flight that this core does not hold (a new
/// leader, a rebuilt core), ended from where its job runs now (see
/// [`unfollowed`]).
async fn ended_elsewhere(
    shared: &DrainContext,
    job_id: &JobId,
    recorded: &JobMigrationStatus,
) -> Result<Unfollowed, ReadError> {
    let job = job_id.clone();
    let (node, now) = shared
        .ctx
        .core
        .read(move |core| {
            let node = core.node_of(&job).map(ToString::to_string);
            (node, core.now())
        })
        .await?;
    Ok(unfollowed(recorded, node, now, TERM_ENDED))
}

/// What made a migration lose its core, in the reasons recorded.
const TERM_ENDED: &str = "the operator's term ended";

/// Writes `next`, with its conditions, when it differs from the status
/// `previous` that the resource holds.
async fn write_status(
    migration: &JobMigration,
    shared: &DrainContext,
    previous: &JobMigrationStatus,
    next: JobMigrationStatus,
) -> Result<(), WriteStatusError> {
    let conditions = conditions_of(&next);
    writer(&shared.ctx, migration)
        .merge_and_write(migration, previous, next, conditions)
        .await?;
    Ok(())
}
