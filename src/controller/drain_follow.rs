//! Drains and migrations in flight, followed through the core's
//! notifications: each `drainProgress` that moves a drain or one of its
//! jobs becomes an Event on its `NodeDrain` and a reconcile of it; each
//! `nodeInterrupted` an Event and, when no `NodeDrain` names the node yet,
//! one created with the interruption (so the work shows in `kubectl get
//! norsk`); each migration notification an Event on its `JobMigration`
//! and a reconcile of it.
//! Runs the [`super::drain`] and [`super::migration`] controllers for the
//! term and owns what they share.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::Resource;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::events::{Event, EventType};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use serde::de::DeserializeOwned;
use tokio::sync::{broadcast, mpsc};
use tokio_stream::wrappers::UnboundedReceiverStream;

use crate::automanager::{DrainJobStatus, DrainPhase, DrainState, MigrationId, NodeInterruptionState, Notification};
use crate::crd::{self, Interruption, JobMigration, NodeDrain, NodeDrainSpec};
use crate::model::{self, NodeId};

use super::error::{ApplyError, ReadError};
use super::{Context, ReconcileError, drain, migration};
use crate::decide::drain_status::{camel, job_changes, rfc3339};
use crate::decide::node::{FLEET, MANAGED_BY};
use crate::decide::node_status::node_resource_name;
use crate::model::wire_name;

/// A drain or a migration in flight is re-read at least this often.
const RESYNC: Duration = Duration::from_secs(30);

/// What the drain and migration controllers share for one term.
pub struct DrainContext {
    /// The operator's context.
    pub ctx: Arc<Context>,
    /// The fleet this operator serves: `NodeDrain`s are cluster-wide, and
    /// one names a node of this fleet or carries this fleet's label.
    pub fleet: String,
    /// Only `JobMigration`s of this namespace (all when absent), as for
    /// bundles.
    pub namespace: Option<String>,
    /// The `NodeDrain` of each node, as last reconciled.
    drain_names: Mutex<HashMap<NodeId, String>>,
    /// The `JobMigration` following each migration.
    followers: Mutex<HashMap<MigrationId, ObjectRef<JobMigration>>>,
    /// Migrations this term started, by `JobMigration` (so a failed status
    /// write does not start a second one).
    started: Mutex<HashMap<String, MigrationId>>,
    /// `JobMigration`s made for a drain's migrations this term.
    created: Mutex<HashSet<String>>,
    /// Why Manager refused the last terminate of each node, as the core
    /// reported it (an evict or terminate `NodeDrain` ends `failed` on it).
    refused_terminates: Mutex<HashMap<NodeId, String>>,
    drains: mpsc::UnboundedSender<ObjectRef<NodeDrain>>,
    migrations: mpsc::UnboundedSender<ObjectRef<JobMigration>>,
}

fn locked<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The maps are only ever updated entry by entry: a poisoned one is usable.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl DrainContext {
    /// `name` is the `NodeDrain` of `node`.
    pub fn drain_named(&self, node: &NodeId, name: &str) {
        locked(&self.drain_names).insert(node.clone(), name.to_owned());
    }

    /// The `NodeDrain` of `node`: the one reconciled, else the name the
    /// operator gives the drains it creates.
    pub fn drain_of(&self, node: &NodeId) -> String {
        locked(&self.drain_names)
            .get(node)
            .cloned()
            .unwrap_or_else(|| node_resource_name(&self.fleet, node.as_str()))
    }

    /// `NodeDrain` `name` is gone.
    pub fn drain_gone(&self, node: &NodeId) {
        locked(&self.drain_names).remove(node);
    }

    /// `follower` follows migration `id`.
    pub fn follows(&self, id: MigrationId, follower: ObjectRef<JobMigration>) {
        locked(&self.followers).insert(id, follower);
    }

    /// The migration this term started for `JobMigration` `key`.
    pub fn started(&self, key: &str) -> Option<MigrationId> {
        locked(&self.started).get(key).cloned()
    }

    /// This term started `id` for `JobMigration` `key`.
    pub fn start(&self, key: &str, id: MigrationId) {
        locked(&self.started).insert(key.to_owned(), id);
    }

    /// Whether `JobMigration` `key` was created this term; marks it so.
    pub fn created(&self, key: &str) -> bool {
        !locked(&self.created).insert(key.to_owned())
    }

    /// Forgets that `key` was created (its creation failed).
    pub fn not_created(&self, key: &str) {
        locked(&self.created).remove(key);
    }

    /// Why Manager refused the last terminate of `node`, if it did.
    pub fn refused_terminate(&self, node: &NodeId) -> Option<String> {
        locked(&self.refused_terminates).get(node).cloned()
    }

    /// A terminate of `node` is about to be issued: an earlier refusal is
    /// not its answer.
    pub fn forget_refused_terminate(&self, node: &NodeId) {
        locked(&self.refused_terminates).remove(node);
    }

    /// Reconciles the `NodeDrain` of `node`, if one was reconciled this term.
    fn reconcile_named(&self, node: &NodeId) {
        let named = locked(&self.drain_names).get(node).cloned();
        if let Some(name) = named {
            let _ = self.drains.send(ObjectRef::new(&name));
        }
    }

    fn reconcile_drain(&self, node: &NodeId) {
        // The controllers outlive the follower within a term.
        let _ = self.drains.send(ObjectRef::new(&self.drain_of(node)));
    }

    fn reconcile_all(&self) {
        for name in locked(&self.drain_names).values() {
            let _ = self.drains.send(ObjectRef::new(name));
        }
        for follower in locked(&self.followers).values() {
            let _ = self.migrations.send(follower.clone());
        }
    }
}

/// Runs the drain and migration controllers, and the follower feeding
/// them, until `stop()` resolves.
pub async fn run<F>(ctx: Arc<Context>, fleet: String, namespace: Option<String>, stop: impl Fn() -> F)
where
    F: Future<Output = ()> + Send + Sync + 'static,
{
    // Unbounded, as for bundles: the controllers merge repeated triggers.
    let (drains, drains_rx) = mpsc::unbounded_channel();
    let (migrations, migrations_rx) = mpsc::unbounded_channel();
    let notifications = ctx.core.subscribe();
    let shared = Arc::new(DrainContext {
        ctx,
        fleet,
        namespace,
        drain_names: Mutex::new(HashMap::new()),
        followers: Mutex::new(HashMap::new()),
        started: Mutex::new(HashMap::new()),
        created: Mutex::new(HashSet::new()),
        refused_terminates: Mutex::new(HashMap::new()),
        drains,
        migrations,
    });
    let follower = tokio::spawn(follow(shared.clone(), notifications));
    tokio::join!(
        drain::run(shared.clone(), UnboundedReceiverStream::new(drains_rx), stop()),
        migration::run(shared.clone(), UnboundedReceiverStream::new(migrations_rx), stop()),
    );
    follower.abort();
}

/// Runs the controller of `api`'s resources (drains or migrations) until
/// `shutdown` resolves, reconciling as well each one `notified` names.
pub(super) async fn run_controller<K, F>(
    api: Api<K>,
    shared: Arc<DrainContext>,
    notified: impl Stream<Item = ObjectRef<K>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
    reconcile: impl FnMut(Arc<K>, Arc<DrainContext>) -> F,
    error_policy: impl Fn(Arc<K>, &ReconcileError, Arc<DrainContext>) -> Action,
) where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    F: Future<Output = Result<Action, ReconcileError>> + Send + 'static,
{
    super::api_server::controller(api, watcher::Config::default(), Duration::from_millis(100))
        .reconcile_on(notified)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, shared)
        .for_each(|_| async {})
        .await;
}

/// What follows a reconcile that wrote a drain's or a migration's status:
/// nothing once it `ended` (a change wakes it), else another look after
/// [`RESYNC`].
pub(super) fn after_status(ended: bool) -> Action {
    if ended {
        Action::await_change()
    } else {
        Action::requeue(RESYNC)
    }
}

async fn follow(shared: Arc<DrainContext>, mut notifications: broadcast::Receiver<Notification>) {
    let mut last: BTreeMap<NodeId, DrainState> = BTreeMap::new();
    loop {
        let notification = match notifications.recv().await {
            Ok(n) => n,
            Err(broadcast::error::RecvError::Lagged(_)) => {
                shared.reconcile_all();
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        match notification {
            Notification::DrainProgress(state) => {
                if let Some(event) = progress_event(last.get(&state.node_id), &state) {
                    publish(&shared, &state.node_id, event);
                }
                shared.reconcile_drain(&state.node_id);
                last.insert(state.node_id.clone(), *state);
            }
            // What an evict or terminate `NodeDrain` waits for.
            Notification::NodeStopping { node_id, .. } | Notification::NodeStopped { node_id } => {
                shared.reconcile_named(&node_id);
            }
            Notification::TerminateRefused { node_id, reason } => {
                locked(&shared.refused_terminates).insert(node_id.clone(), reason);
                shared.reconcile_named(&node_id);
            }
            Notification::NodeInterrupted(state) => {
                publish(&shared, &state.node_id, interrupted_event(&state));
                let shared = shared.clone();
                tokio::spawn(async move {
                    if let Err(e) = ensure_drain(&shared, &state).await {
                        tracing::warn!(node = %state.node_id, error = %e, "no NodeDrain for an interruption");
                    }
                    shared.reconcile_drain(&state.node_id);
                });
            }
            Notification::MigrationPhase(state) => {
                let phase = wire_name(&state.phase);
                let group: Vec<String> = state.group.iter().map(|p| p.job_id.to_string()).collect();
                let with = if group.is_empty() {
                    String::new()
                } else {
                    format!(", with its co-located group ({})", group.join(", "))
                };
                let note = format!(
                    "{} is {phase} ({} -> {}{with})",
                    state.job_id, state.source_node_id, state.target_node_id
                );
                follow_migration(
                    &shared,
                    &state.migration_id,
                    migration_event(EventType::Normal, &format!("Migration{}", camel(&phase)), note),
                );
            }
            Notification::MigrationCompleted { migration_id, job_id } => {
                let note = format!("{job_id} lives on the target");
                follow_migration(
                    &shared,
                    &migration_id,
                    migration_event(EventType::Normal, "MigrationCompleted", note),
                );
            }
            Notification::MigrationAborted {
                migration_id,
                job_id,
                reason,
                lost,
            } => {
                let (why, note) = if lost {
                    (
                        "MigrationLost",
                        format!("{job_id}: lost past the point of no return: {reason}"),
                    )
                } else {
                    ("MigrationAborted", format!("{job_id}: rolled back: {reason}"))
                };
                follow_migration(&shared, &migration_id, migration_event(EventType::Warning, why, note));
            }
            _ => {}
        }
    }
}

/// Publishes `event` on the `JobMigration` following migration `id` and
/// reconciles it (a migration no resource follows has no object to tell).
fn follow_migration(shared: &DrainContext, id: &MigrationId, event: Event) {
    let follower = locked(&shared.followers).get(id).cloned();
    if let Some(follower) = follower {
        shared.ctx.publish(event, follower.clone().into());
        let _ = shared.migrations.send(follower);
    }
}

fn migration_event(type_: EventType, reason: &str, note: String) -> Event {
    Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note.chars().take(1000).collect()),
        action: "Migrate".to_owned(),
        secondary: None,
    }
}

fn publish(shared: &DrainContext, node: &NodeId, event: Event) {
    let regarding = ObjectRef::<NodeDrain>::new(&shared.drain_of(node)).into();
    shared.ctx.publish(event, regarding);
}

/// The Event of a `drainProgress`: one per phase transition (its reason
/// the phase) or job status change; none when nothing moved.
fn progress_event(before: Option<&DrainState>, after: &DrainState) -> Option<Event> {
    let changes = job_changes(before, after);
    let phase_moved = before.is_none_or(|b| b.phase != after.phase);
    if !phase_moved && changes.is_empty() {
        return None;
    }
    let phase = wire_name(&after.phase);
    let lost = after.jobs.iter().any(|j| j.status == DrainJobStatus::Terminated);
    let warning = lost || matches!(after.phase, DrainPhase::Partial | DrainPhase::Failed);
    let mut note = format!("drain of {} is {phase}", after.node_id);
    if let Some(reason) = &after.reason {
        note.push_str(&format!(" ({reason})"));
    }
    if !changes.is_empty() {
        note.push_str(": ");
        note.push_str(&changes.join(", "));
    }
    Some(Event {
        type_: if warning { EventType::Warning } else { EventType::Normal },
        reason: match (phase_moved, lost && after.phase.is_final()) {
            // Ended with jobs gone down with the node: said as such.
            (true, true) => "DrainJobsLost".to_owned(),
            (true, false) => format!("Drain{}", camel(&phase)),
            (false, _) => "DrainProgress".to_owned(),
        },
        note: Some(note.chars().take(1000).collect()),
        action: "Drain".to_owned(),
        secondary: None,
    })
}

fn interrupted_event(state: &NodeInterruptionState) -> Event {
    let deadline = state
        .deadline
        .and_then(rfc3339)
        .map_or_else(|| "no deadline given".to_owned(), |d| format!("reclaimed at {d}"));
    Event {
        type_: EventType::Warning,
        reason: "NodeInterrupted".to_owned(),
        note: Some(format!(
            "{:?} notice for {}: {deadline}; its drain is {}",
            state.kind,
            state.node_id,
            wire_name(&state.drain.phase)
        )),
        action: "Drain".to_owned(),
        secondary: None,
    }
}

/// The crd's name for an interruption kind; a kind this build does not know
/// is read as the more urgent one, as the core does.
fn interruption_kind(kind: model::InterruptionKind) -> crd::InterruptionKind {
    match kind {
        model::InterruptionKind::Rebalance => crd::InterruptionKind::Rebalance,
        model::InterruptionKind::SpotInterruption | model::InterruptionKind::Unknown(_) => {
            crd::InterruptionKind::SpotInterruption
        }
    }
}

/// Creates the `NodeDrain` of an interrupted node unless one names it.
async fn ensure_drain(shared: &DrainContext, state: &NodeInterruptionState) -> Result<(), ReconcileError> {
    let api: Api<NodeDrain> = Api::all(shared.ctx.client.clone());
    let existing = api.list(&Default::default()).await.map_err(|source| ReadError::List {
        kind: "NodeDrain",
        selector: None,
        source,
    })?;
    // Another fleet's drain of a node of the same id is not this one.
    let of_fleet = |d: &&NodeDrain| {
        kube::ResourceExt::labels(*d)
            .get(FLEET)
            .is_none_or(|f| *f == shared.fleet)
    };
    if let Some(found) = existing
        .items
        .iter()
        .filter(of_fleet)
        .find(|d| d.spec.node_id == state.node_id.as_str())
    {
        if let Some(name) = &found.metadata.name {
            shared.drain_named(&state.node_id, name);
        }
        return Ok(());
    }
    let name = node_resource_name(&shared.fleet, state.node_id.as_str());
    let drain = NodeDrain {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([
                (MANAGED_BY.to_owned(), crate::decide::OPERATOR_NAME.to_owned()),
                (FLEET.to_owned(), shared.fleet.clone()),
            ])),
            ..ObjectMeta::default()
        },
        spec: NodeDrainSpec {
            node_id: state.node_id.to_string(),
            mode: None,
            timeout_seconds: None,
            // An interruption's drain is forced: the provider takes the
            // node at the deadline regardless.
            force: true,
            // Each job moves with its declared strategy.
            strategy: None,
            after: None,
            interruption: Some(Interruption {
                kind: interruption_kind(state.kind),
                deadline: state.deadline.and_then(rfc3339),
            }),
        },
        status: None,
    };
    match api.create(&PostParams::default(), &drain).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(source) => {
            return Err(ApplyError::Create {
                kind: "NodeDrain",
                name,
                source,
            }
            .into());
        }
    }
    shared.drain_named(&state.node_id, &name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::automanager::DrainJob;

    fn drain(phase: DrainPhase, status: DrainJobStatus, reason: Option<&str>) -> DrainState {
        DrainState {
            node_id: "node-a".into(),
            phase,
            started: 0,
            timeout_ms: 90_000,
            force: true,
            after: Default::default(),
            jobs: vec![DrainJob {
                job_id: "default/ch1/0/encode".into(),
                status,
                migration_id: None,
                reason: None,
            }],
            reason: reason.map(str::to_owned),
        }
    }

    #[test]
    fn a_drain_ending_with_jobs_gone_down_with_its_node_is_a_warning_that_says_so() {
        let before = drain(DrainPhase::Terminating, DrainJobStatus::Terminated, None);
        let after = drain(
            DrainPhase::Partial,
            DrainJobStatus::Terminated,
            Some("the node was terminated with 1 job(s) still on it"),
        );
        let event = progress_event(Some(&before), &after).expect("an Event");
        assert_eq!(event.type_, EventType::Warning);
        assert_eq!(event.reason, "DrainJobsLost");
        let note = event.note.unwrap_or_default();
        assert!(note.contains("drain of node-a is partial"), "{note}");
        assert!(note.contains("1 job(s) still on it"), "{note}");
    }

    #[test]
    fn a_drain_done_with_every_job_migrated_is_normal() {
        let before = drain(DrainPhase::Terminating, DrainJobStatus::Migrated, None);
        let after = drain(DrainPhase::Done, DrainJobStatus::Migrated, None);
        let event = progress_event(Some(&before), &after).expect("an Event");
        assert_eq!(event.type_, EventType::Normal);
        assert_eq!(event.reason, "DrainDone");
    }
}
