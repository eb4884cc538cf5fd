//! The caller's side of the runtime: every command, query and update is a
//! request to the loop, answered over a oneshot channel.

use std::collections::BTreeMap;

use tokio::sync::{broadcast, mpsc, oneshot, watch};

use crate::automanager::core::AutoManagerCore;
use crate::automanager::drain::state::{DrainOptions, DrainState, InterruptionNotice, NodeInterruptionState};
use crate::automanager::metrics::Metrics;
use crate::automanager::migration::state::{MigrationOptions, MigrationState};
use crate::automanager::node_services::state::ServicePhase;
use crate::automanager::notification::Notification;
use crate::automanager::protocol::{Answer, Command, CommandError};
use crate::automanager::queries::NodeView;
use crate::automanager::spares::diff::HotSpareSpecsDiff;
use crate::automanager::spares::state::HotSpareStatus;
use crate::automanager::views::ReadModel;
use crate::manager::stream::ConnectionState;
use crate::model::{
    Bundle, BundleId, BundleJobRef, BundleSpec, HotSpareSpec, JobId, MigrationId, NodeId, NodeInventory, PlacementPool,
    SpareSpec, UnixMillis,
};
use crate::placement::{Admission, BundleValidation, Placement, PlacementError};

use super::{Query, QueryError, Request};

/// The caller's side: commands, queries, subscriptions, close. Cheap to
/// clone.
#[derive(Clone)]
pub struct AutoManagerHandle {
    pub(super) requests: mpsc::Sender<Request>,
    pub(super) notifications: broadcast::Sender<Notification>,
    pub(super) connection: watch::Receiver<ConnectionState>,
    pub(super) capabilities: watch::Receiver<crate::manager::port::Capabilities>,
    pub(super) revision: watch::Receiver<u64>,
    /// The loop's Manager port, for what it keeps beside the core (node
    /// tags a Manager cannot store).
    pub(super) port: crate::manager::port::Port,
}

impl AutoManagerHandle {
    async fn command(&self, command: Command) -> Result<(), CommandError> {
        self.ask(command).await.map(drop)
    }

    async fn ask(&self, command: Command) -> Result<Option<Answer>, CommandError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Command(Box::new(command), reply))
            .await
            .map_err(|_| CommandError::Closed)?;
        answer.await.unwrap_or(Err(CommandError::Closed))
    }

    async fn query<T: Send + 'static>(
        &self,
        ask: impl FnOnce(&AutoManagerCore, UnixMillis) -> T + Send + 'static,
    ) -> Result<T, QueryError> {
        let (reply, answer) = oneshot::channel();
        let query: Query = Box::new(move |core, now| {
            // The caller may have gone; then nobody wants the answer.
            let _ = reply.send(ask(core, now));
        });
        self.requests
            .send(Request::Query(query))
            .await
            .map_err(|_| QueryError::Closed)?;
        answer.await.map_err(|_| QueryError::Closed)
    }

    /// `updateHotSpareSpecs(list)`: replaces the live `hotSpares` list
    /// without a reconnect; rejected whole when invalid, otherwise
    /// converged on at once. Returns what changed, keyed by pool. A standby
    /// adopts the list at once (a live settings change).
    pub async fn update_hot_spare_specs(&self, specs: Vec<HotSpareSpec>) -> Result<HotSpareSpecsDiff, CommandError> {
        match self.ask(Command::UpdateHotSpareSpecs(specs)).await? {
            Some(Answer::HotSpares(diff)) => Ok(diff),
            // `UpdateHotSpareSpecs` is answered with its diff.
            _ => Err(CommandError::Closed),
        }
    }

    /// `updateHotSpareNode`: edits one live spare's `SpareSpec`.
    pub async fn update_hot_spare_node(&self, node_id: NodeId, spec: SpareSpec) -> Result<(), CommandError> {
        self.command(Command::UpdateHotSpareNode { node_id, spec }).await
    }

    /// What a person declares node `node_id` to be (`None` withdraws it):
    /// placement reads it where Manager reports no inventory.
    pub async fn declare_inventory(
        &self,
        node_id: NodeId,
        inventory: Option<NodeInventory>,
    ) -> Result<(), CommandError> {
        self.command(Command::DeclareInventory { node_id, inventory }).await
    }

    /// `spareSpec(nodeId)`: a live spare's `SpareSpec`; `None` for a node
    /// that is not an unconsumed spare.
    pub async fn spare_spec(&self, node_id: NodeId) -> Result<Option<SpareSpec>, QueryError> {
        self.query(move |core, _| core.spare_spec(&node_id)).await
    }

    /// Each `hotSpares[]` entry's live and provisioning spares.
    pub async fn hot_spare_status(&self) -> Result<Vec<HotSpareStatus>, QueryError> {
        self.query(|core, _| core.hot_spare_status()).await
    }

    /// The live `hotSpares` list.
    pub async fn hot_spare_specs(&self) -> Result<Vec<HotSpareSpec>, QueryError> {
        self.query(|core, _| core.settings().hot_spares.clone()).await
    }

    /// Where each node service stands, per node: (service, node, phase).
    pub async fn node_service_placements(&self) -> Result<Vec<(String, NodeId, ServicePhase)>, QueryError> {
        self.query(|core, _| {
            core.node_service_placements()
                .map(|(s, n, p)| (s.to_owned(), n.clone(), p))
                .collect()
        })
        .await
    }

    /// `createBundle`: validated, then stored on Manager.
    pub async fn create_bundle(&self, bundle: Bundle) -> Result<(), CommandError> {
        self.command(Command::CreateBundle(bundle)).await
    }

    /// `updateBundle` (always `state: live`).
    pub async fn update_bundle(&self, bundle: Bundle) -> Result<(), CommandError> {
        self.command(Command::UpdateBundle(bundle)).await
    }

    /// `deleteBundle`: Manager's stop-then-delete saga.
    pub async fn delete_bundle(&self, bundle_id: BundleId) -> Result<(), CommandError> {
        self.command(Command::DeleteBundle(bundle_id)).await
    }

    /// `startBundleJob`.
    pub async fn start_bundle_job(&self, job: BundleJobRef) -> Result<(), CommandError> {
        self.command(Command::StartBundleJob(job)).await
    }

    /// `stopBundleJob`.
    pub async fn stop_bundle_job(&self, job: BundleJobRef) -> Result<(), CommandError> {
        self.command(Command::StopBundleJob(job)).await
    }

    /// `setTemplateImages`: what warmth is scored against.
    pub async fn set_template_images(&self, images: BTreeMap<String, Vec<String>>) -> Result<(), CommandError> {
        self.command(Command::SetTemplateImages(images)).await
    }

    /// Replaces the placement pools live, without reconnecting.
    pub async fn set_placement_pools(&self, pools: Vec<PlacementPool>) -> Result<(), CommandError> {
        self.command(Command::SetPlacementPools(pools)).await
    }

    /// Whether Manager's initial snapshot is complete (and, for a standby,
    /// whether it has been promoted: a standby stays hydrating until then).
    pub async fn is_hydrated(&self) -> Result<bool, QueryError> {
        self.query(|core, _| core.is_hydrated()).await
    }

    /// The node job `job_id` is placed on, if any.
    pub async fn node_of(&self, job_id: JobId) -> Result<Option<NodeId>, QueryError> {
        self.query(move |core, _| core.node_of(&job_id).cloned()).await
    }

    /// Every node of the fleet as the edges read it, in id order.
    pub async fn node_views(&self) -> Result<Vec<NodeView>, QueryError> {
        self.query(|core, _| core.node_views()).await
    }

    /// Reads the core with `ask` on the core's own task: one consistent
    /// reading between two steps (see [`ReadModel`]), e.g. to build a
    /// status from it.
    pub async fn read<T: Send + 'static>(
        &self,
        ask: impl FnOnce(ReadModel<'_>) -> T + Send + 'static,
    ) -> Result<T, QueryError> {
        self.query(move |core, now| ask(core.read(now))).await
    }

    /// `templateImages`.
    pub async fn template_images(&self) -> Result<BTreeMap<String, Vec<String>>, QueryError> {
        self.query(|core, _| core.template_images().clone()).await
    }

    /// `validateBundle`.
    pub async fn validate_bundle(&self, bundle: BundleSpec) -> Result<BundleValidation, QueryError> {
        Ok(self.query(move |core, _| core.validate_bundle(&bundle)).await??)
    }

    /// `validateBundleAdmission`.
    pub async fn validate_bundle_admission(&self, bundle: Bundle) -> Result<Admission, QueryError> {
        Ok(self
            .query(move |core, _| core.validate_bundle_admission(&bundle.bundle_id, &bundle.spec))
            .await??)
    }

    /// `placeDryRun`: one job of one replica, with the trace, without acting.
    pub async fn place_dry_run(
        &self,
        bundle: Bundle,
        replica_index: u32,
        job_name: String,
    ) -> Result<Result<Placement, PlacementError>, QueryError> {
        Ok(self
            .query(move |core, _| core.place_dry_run(&bundle.bundle_id, &bundle.spec, replica_index, &job_name))
            .await??)
    }

    /// `metrics()`.
    pub async fn metrics(&self) -> Result<Metrics, QueryError> {
        self.query(|core, now| core.metrics(now)).await
    }

    /// `cordonNode`: no new placements land on the node.
    pub async fn cordon_node(&self, node_id: NodeId) -> Result<(), CommandError> {
        self.command(Command::CordonNode(node_id)).await
    }

    /// `uncordonNode`: the reverse; cancels a drain that has not issued its
    /// terminate.
    pub async fn uncordon_node(&self, node_id: NodeId) -> Result<(), CommandError> {
        self.command(Command::UncordonNode(node_id)).await
    }

    /// `isCordoned`.
    pub async fn is_cordoned(&self, node_id: NodeId) -> Result<bool, QueryError> {
        self.query(move |core, _| core.is_cordoned(&node_id)).await
    }

    /// `terminateNode`: terminate without cordoning.
    pub async fn terminate_node(&self, node_id: NodeId) -> Result<(), CommandError> {
        self.command(Command::TerminateNode(node_id)).await
    }

    /// `evictNode`: cordon, then terminate at once.
    pub async fn evict_node(&self, node_id: NodeId) -> Result<(), CommandError> {
        self.command(Command::EvictNode(node_id)).await
    }

    /// `drainNode`: resolves once the migrations are started, with the
    /// drain (the running one, if the node was draining already).
    pub async fn drain_node(&self, node_id: NodeId, options: DrainOptions) -> Result<DrainState, CommandError> {
        let asked = node_id.clone();
        self.command(Command::DrainNode { node_id, options }).await?;
        self.drain_status(asked.clone())
            .await
            .map_err(|_| CommandError::Closed)?
            .ok_or(CommandError::UnknownNode(asked))
    }

    /// `drainStatus`: the node's running drain, or its last one.
    pub async fn drain_status(&self, node_id: NodeId) -> Result<Option<DrainState>, QueryError> {
        self.query(move |core, _| core.drain_status(&node_id).cloned()).await
    }

    /// Every drain (running, or the last one of its node).
    pub async fn drains(&self) -> Result<Vec<DrainState>, QueryError> {
        self.query(|core, _| core.drains().cloned().collect()).await
    }

    /// `handleNodeInterruption`: a forced drain cut to fit the deadline.
    pub async fn handle_node_interruption(
        &self,
        node_id: NodeId,
        notice: InterruptionNotice,
    ) -> Result<NodeInterruptionState, CommandError> {
        let asked = node_id.clone();
        self.command(Command::HandleNodeInterruption { node_id, notice })
            .await?;
        self.node_interruption(asked.clone())
            .await
            .map_err(|_| CommandError::Closed)?
            .ok_or(CommandError::UnknownNode(asked))
    }

    /// `nodeInterruption`: the notice taken for the node, with its drain.
    pub async fn node_interruption(&self, node_id: NodeId) -> Result<Option<NodeInterruptionState>, QueryError> {
        self.query(move |core, _| core.node_interruption(&node_id)).await
    }

    /// `migrateJob`: resolves once the target is placed (its `StartJob`
    /// dispatched, or its node being provisioned); refused when the job is
    /// not running, not placed by this AutoManager, already migrating, or
    /// placement finds nowhere for it.
    pub async fn migrate_job(&self, job_id: JobId, options: MigrationOptions) -> Result<MigrationId, CommandError> {
        match self.ask(Command::MigrateJob { job_id, options }).await? {
            Some(Answer::Migration(id)) => Ok(id),
            // `MigrateJob` is answered with its id.
            _ => Err(CommandError::Closed),
        }
    }

    /// `abortMigration`: a clean rollback, only before the point of no
    /// return.
    pub async fn abort_migration(&self, migration_id: MigrationId, reason: String) -> Result<(), CommandError> {
        self.command(Command::AbortMigration { migration_id, reason }).await
    }

    /// `migrationById`.
    pub async fn migration_by_id(&self, id: MigrationId) -> Result<Option<MigrationState>, QueryError> {
        self.query(move |core, _| core.migration_by_id(&id).cloned()).await
    }

    /// `migrationForJob`: in flight, else the most recent ended one.
    pub async fn migration_for_job(&self, job_id: JobId) -> Result<Option<MigrationState>, QueryError> {
        self.query(move |core, _| core.migration_for_job(&job_id).cloned())
            .await
    }

    /// `migrations()`: in flight and recently ended, oldest first.
    pub async fn migrations(&self) -> Result<Vec<MigrationState>, QueryError> {
        self.query(|core, _| core.migrations().into_iter().cloned().collect())
            .await
    }

    /// Every notification from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Notification> {
        self.notifications.subscribe()
    }

    /// Manager's stream as the core has it: `Ready` once the stream's
    /// snapshot has been applied (a standby's too), until the stream breaks.
    pub fn connection(&self) -> watch::Receiver<ConnectionState> {
        self.connection.clone()
    }

    /// The core's revision (see [`ReadModel::revision`]), changed after
    /// every step: what an edge watches to know its views may be stale.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.revision.clone()
    }

    /// How each capability beyond the published Manager API is carried
    /// out on the Manager at hand (see [`crate::manager::port`]).
    pub fn capabilities(&self) -> watch::Receiver<crate::manager::port::Capabilities> {
        self.capabilities.clone()
    }

    /// The node tag changes kept by the operator because Manager cannot
    /// store them (a published Manager): what a `NorskNode` records so that
    /// the next leader starts from them.
    pub fn kept_node_tags(&self) -> watch::Receiver<BTreeMap<NodeId, crate::manager::port::KeptTags>> {
        self.port.kept_tags()
    }

    /// Node tag changes a predecessor kept, read back from the `NorskNode`s:
    /// the core sees its nodes as they were left (a consumed spare stays
    /// consumed). Applied at once, by a standby too; a Manager that stores
    /// tags itself is given them on its next connection.
    pub fn keep_node_tags(&self, kept: BTreeMap<NodeId, crate::manager::port::KeptTags>) {
        self.port.keep_node_tags(kept);
    }

    /// Promotes a standby: its core leaves the hydration phase and decides
    /// from the state it has followed (a standby whose stream has not yet
    /// delivered Manager's snapshot hydrates as usual when it arrives), then
    /// the commands held meanwhile are served. Returns once the loop has
    /// taken the promotion; a no-op on an AutoManager that already acts.
    pub async fn promote(&self) -> Result<(), QueryError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send(Request::Promote(reply))
            .await
            .map_err(|_| QueryError::Closed)?;
        answer.await.map_err(|_| QueryError::Closed)
    }

    /// `close()`: cancels the timers, aborts in-flight migrations (holding
    /// the channel open at most `CLOSE_ABORT_GRACE_MS` for the aborts to be
    /// sent), stops the loop and the stream, answers waiting commands with
    /// `Closed`. Idempotent.
    pub async fn close(&self) {
        // A closed loop no longer listens; that is what was asked.
        let _ = self.requests.send(Request::Close).await;
    }
}
