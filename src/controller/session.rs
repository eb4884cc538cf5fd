//! One term of leadership: the standby core that followed Manager is
//! promoted (it decides from the state it followed), the controllers run and the core's notifications are
//! followed — each becomes a metric, notes for status, an Event on the
//! `Bundle` it concerns and a reconcile of it — until the term ends; then
//! the controllers stop and the core is closed. The controllers rebuild
//! what they own from the resources at every term's start, and the leader
//! publishes its Manager status for the term.

use std::sync::Arc;

use k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::reflector::ObjectRef;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::{ReceiverStream, UnboundedReceiverStream};

use crate::automanager::{AutoManagerHandle, AutoSettings, Notification, RunOptions};
use crate::crd;
use crate::manager::client::ClientSettings;
use crate::telemetry::OperatorMetrics;

use crate::decide::manager_status::Publisher;
use crate::decide::node_status::node_resource_name;
use crate::decide::notes::{bundle_event, bundle_of, node_event, pool_event};

use super::{Context, bundle, drain_follow, hot_spare, manager_status, node, notification_log, pool};

/// How long the controllers have to stop once a term has ended.
const WIND_DOWN: std::time::Duration = std::time::Duration::from_secs(10);

/// What a term runs with.
#[derive(Clone, Debug)]
pub struct SessionSettings {
    /// The core's settings (pools come from the `PlacementPool` resources).
    pub settings: AutoSettings,
    /// How to reach Manager.
    pub manager: ClientSettings,
    /// The core's clock (1 in production).
    pub options: RunOptions,
    /// The Events' reporting instance (the pod name).
    pub instance: Option<String>,
    /// The name of the fleet (one Manager) this operator mirrors into
    /// `NorskNode`s: several operators, each with its Manager, can share a
    /// cluster as long as their fleets are named apart.
    pub fleet: String,
    /// Only `Bundle`s of this namespace (all namespaces when absent);
    /// pools and hot-spare policies are cluster-wide either way.
    pub bundle_namespace: Option<String>,
    /// Where the leader publishes its Manager status (see
    /// [`manager_status`]): the operator's own namespace, the Lease's.
    pub status_namespace: String,
    /// `settings.templateImages` as the settings file changes them, applied
    /// live to every core (see `cli::settings_file`); `None`: they stay as
    /// `settings` has them.
    pub template_images: Option<watch::Receiver<std::collections::BTreeMap<String, Vec<String>>>>,
}

/// Runs one term with `core` (a standby, started with `session`'s
/// settings, whose loop is `core_task`) until `ended` turns true.
pub async fn lead(
    client: Client,
    session: SessionSettings,
    core: AutoManagerHandle,
    core_task: JoinHandle<()>,
    metrics: Arc<OperatorMetrics>,
    mut ended: watch::Receiver<bool>,
) {
    // Subscribed before the promotion: the first decisions' notifications
    // are followed too.
    let notifications = core.subscribe();
    // A closed core is answered by the term ending (its loop is awaited).
    let _ = core.promote().await;
    let (ctx, publisher) = Context::new(client, core.clone(), metrics, session.instance.clone());
    // Unbounded: the controller merges repeated triggers of one bundle, and
    // a trigger dropped would leave a status stale until the resync.
    let (bundles_tx, bundles_rx) = mpsc::unbounded_channel::<ObjectRef<crd::Bundle>>();
    // Capacity one: a burst of fleet changes is one reconcile of every pool.
    let (pools_tx, pools_rx) = mpsc::channel::<()>(1);
    let (spares_tx, spares_rx) = mpsc::channel::<()>(1);
    let (nodes_tx, nodes_rx) = mpsc::channel::<()>(1);
    let fleet = FleetTriggers {
        pools: pools_tx,
        spares: spares_tx,
        nodes: nodes_tx,
    };
    let follower = tokio::spawn(follow(
        ctx.clone(),
        notifications,
        bundles_tx,
        fleet,
        session.fleet.clone(),
        session.manager.url.clone(),
    ));
    let term = ended.clone();
    let stop = move || {
        let mut ended = term.clone();
        async move {
            // A dropped sender ends the term too.
            let _ = ended.wait_for(|e| *e).await;
        }
    };
    // The core is closed the moment the term ends: it is what drives
    // Manager, and a leader whose Lease is running out must stop at once,
    // not once its reconciles in flight have wound down (one waiting on an
    // unreachable API server can take a while). Their commands meanwhile
    // are answered `Closed`.
    let closing = {
        let core = core.clone();
        let term = stop();
        async move {
            term.await;
            core.close().await;
        }
    };
    let controllers = async {
        tokio::join!(
            bundle::run(
                ctx.clone(),
                session.bundle_namespace.as_deref(),
                UnboundedReceiverStream::new(bundles_rx),
                stop()
            ),
            pool::run_pools(ctx.clone(), ReceiverStream::new(pools_rx), stop()),
            hot_spare::run(ctx.clone(), ReceiverStream::new(spares_rx), stop()),
            node::mirror(
                ctx.clone(),
                session.fleet.clone(),
                nodes_rx,
                session.template_images.clone(),
                stop()
            ),
            node::run_spec(ctx.clone(), session.fleet.clone(), stop()),
            drain_follow::run(
                ctx.clone(),
                session.fleet.clone(),
                session.bundle_namespace.clone(),
                &stop
            ),
            manager_status::run(ctx.clone(), status_publisher(&session), stop()),
        );
    };
    // A reconcile in flight waits for the API server as long as its request
    // does (kube sets no read deadline): a leader cut off from it would
    // never get back to following. Past `WIND_DOWN` they are dropped; the
    // core is closed by then, so they could no longer act anyway.
    let wound_down = async {
        let mut controllers = std::pin::pin!(controllers);
        tokio::select! {
            () = &mut controllers => {}
            () = async { stop().await; tokio::time::sleep(WIND_DOWN).await } => {
                tracing::warn!(
                    wait_s = WIND_DOWN.as_secs_f64(),
                    "the controllers did not stop after the term ended (requests to the API server hang): dropped"
                );
            }
        }
    };
    tokio::join!(closing, wound_down);
    let _ = ended.wait_for(|e| *e).await;
    follower.abort();
    // The loop answers every waiting command before it ends.
    let _ = core_task.await;
    drop(ctx);
    // Queued Events are published, unless the API server does not answer.
    let mut publisher = publisher;
    if tokio::time::timeout(WIND_DOWN, &mut publisher).await.is_err() {
        publisher.abort();
    }
}

/// Who publishes the term's Manager status, of which Manager.
fn status_publisher(session: &SessionSettings) -> Publisher {
    Publisher {
        namespace: session.status_namespace.clone(),
        fleet: session.fleet.clone(),
        leader: session.instance.clone().unwrap_or_default(),
        manager: session.manager.url.clone(),
    }
}

/// Follows the core's notifications for the rest of the term.
async fn follow(
    ctx: Arc<Context>,
    mut notifications: broadcast::Receiver<Notification>,
    bundles: mpsc::UnboundedSender<ObjectRef<crd::Bundle>>,
    fleet: FleetTriggers,
    fleet_name: String,
    manager_url: String,
) {
    let mut log = notification_log::NotificationLog::new(manager_url);
    loop {
        let notification = match notifications.recv().await {
            Ok(n) => n,
            Err(broadcast::error::RecvError::Lagged(missed)) => {
                tracing::warn!(missed, "notifications lagged; every resource is reconciled");
                fleet.changed();
                continue;
            }
            Err(broadcast::error::RecvError::Closed) => return,
        };
        // The structured record of every callback (the Event and the metric
        // follow).
        tracing::debug!(?notification, "notification");
        log.log(&notification);
        ctx.metrics.count(&notification);
        ctx.notes().record(&notification);
        if let Some(target) = bundle_of(&notification) {
            if let Some(event) = bundle_event(&notification) {
                ctx.publish(event, target.clone().into());
            }
            // The controller outlives the follower within a term.
            let _ = bundles.send(target);
        }
        if let Some((node_id, event)) = node_event(&notification) {
            ctx.publish(event, norsk_node_ref(&fleet_name, node_id));
        }
        if let Some((pool, event)) = pool_event(&notification) {
            ctx.publish(event, ObjectRef::<crd::PlacementPool>::new(pool).into());
        }
        if touches_fleet(&notification) {
            fleet.changed();
        }
    }
}

/// The `NorskNode` mirroring `node_id` (cluster-scoped: its Events land in
/// the `default` namespace).
fn norsk_node_ref(fleet: &str, node_id: &crate::model::NodeId) -> ObjectReference {
    ObjectRef::<crd::NorskNode>::new(&node_resource_name(fleet, node_id.as_str())).into()
}

/// The controllers that follow the fleet as a whole. Each channel holds
/// one wake-up: a burst of changes is one round.
struct FleetTriggers {
    pools: mpsc::Sender<()>,
    spares: mpsc::Sender<()>,
    nodes: mpsc::Sender<()>,
}

impl FleetTriggers {
    fn changed(&self) {
        // A full channel already holds the wake-up this would add.
        let _ = self.pools.try_send(());
        let _ = self.spares.try_send(());
        let _ = self.nodes.try_send(());
    }
}

/// Notifications after which pool and spare status may read differently.
fn touches_fleet(notification: &Notification) -> bool {
    matches!(
        notification,
        Notification::NodeStarting { .. }
            | Notification::NodeStarted { .. }
            | Notification::NodeStopping { .. }
            | Notification::NodeStopped { .. }
            | Notification::NodeTerminated { .. }
            | Notification::PlacementDecision(_)
            | Notification::JobDeleted { .. }
            | Notification::JobUpdated { .. }
            | Notification::NodeUnhealthy { .. }
            | Notification::NodeHealthy { .. }
            | Notification::ConnectionStateChange { .. }
            | Notification::HeadroomChanged { .. }
    )
}
