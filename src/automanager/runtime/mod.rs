//! The runtime shell, the only async part: one task owns the core, feeds it
//! Manager's stream (snapshot, then live events), commands, RPC results and
//! timer expiries, and carries out its actions — RPCs run concurrently on
//! the [`ManagerClient`], notifications go to a broadcast channel (a slow or
//! failing subscriber lags; it never blocks the loop), replies go to their
//! callers. When the stream breaks and a new snapshot arrives, the core is
//! disposed and a fresh one hydrated from it (counters carried over).
//!
//! A *standby* runs the same loop without acting: it follows Manager's
//! stream with its core held in the hydration phase — every event applied
//! to the state as the snapshot's are, nothing recovered, placed or sent —
//! so a follower operator is ready to lead at once. `promote` ends the
//! hydration phase (Manager's `InitialDataComplete`): the core decides from
//! the state it has followed, as a fresh core hydrated from a snapshot
//! taken at that moment would, without waiting for a new stream.

mod calls;
mod clock;
mod handle;

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{broadcast, mpsc, oneshot, watch};
use tokio::task::JoinHandle;

use crate::manager::client::{ClientSettings, ConnectError, ManagerClient};
use crate::manager::port::{Capabilities, Port, Told};
use crate::manager::stream::{ConnectionState, StreamItem, StreamSession, StreamSettings};
use crate::model::{ManagerEvent, UnixMillis};
use crate::placement::FleetError;

use super::core::AutoManagerCore;
use super::migration::state::CLOSE_ABORT_GRACE_MS;
use super::notification::Notification;
use super::protocol::{Action, Answer, Command, CommandError, CommandId, Input, RequestId, RpcFailure, Step};
use super::settings::{AutoSettings, AutoSettingsValidationError, ValidSettings, validate_auto_settings};
use calls::{execute, failure};
use clock::Clock;
pub use handle::AutoManagerHandle;

/// How many notifications a subscriber may fall behind before it lags.
const NOTIFICATION_BUFFER: usize = 4096;
/// The most inputs fed to the core as one step.
const MAX_BATCH: usize = 1024;

/// Where RPC results are sent back to the loop.
type Results = mpsc::UnboundedSender<(RequestId, Result<(), RpcFailure>)>;

/// Why `run` refused to start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The settings are invalid (every problem listed).
    #[error(transparent)]
    InvalidSettings(#[from] AutoSettingsValidationError),
    /// The Manager client could not be built.
    #[error(transparent)]
    Connect(#[from] ConnectError),
}

/// Why a query could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The AutoManager is closed.
    #[error("AutoManager is closed")]
    Closed,
    /// The fleet view could not be built.
    #[error(transparent)]
    Fleet(#[from] FleetError),
}

/// How the runtime runs.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Core milliseconds per real millisecond: 1 in production; the demo
    /// and tests run a simulator with a compressed clock and match it.
    pub time_scale: f64,
}

impl Default for RunOptions {
    fn default() -> Self {
        Self { time_scale: 1.0 }
    }
}

type Query = Box<dyn FnOnce(&AutoManagerCore, UnixMillis) + Send>;

/// Where a command's answer goes.
type Replier = oneshot::Sender<Result<Option<Answer>, CommandError>>;

enum Request {
    /// Boxed: a bundle's spec makes a command much larger than any other
    /// request.
    Command(Box<Command>, Replier),
    Query(Query),
    Promote(oneshot::Sender<()>),
    Close,
}

/// Whether the loop acts on what it learns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    /// Following Manager without acting; `snapshot` once the stream's
    /// snapshot has been applied.
    Standby { snapshot: bool },
    /// Deciding and calling Manager.
    Active,
}

/// The AutoManager: `run` validates the settings, connects to Manager and
/// starts the loop.
pub struct AutoManager;

impl AutoManager {
    /// Starts with the default options. Returns the handle and the loop's
    /// join handle, which completes after [`AutoManagerHandle::close`].
    pub fn run(settings: AutoSettings) -> Result<(AutoManagerHandle, JoinHandle<()>), RunError> {
        Self::run_with(settings, RunOptions::default())
    }

    /// Starts with `options`.
    pub fn run_with(
        settings: AutoSettings,
        options: RunOptions,
    ) -> Result<(AutoManagerHandle, JoinHandle<()>), RunError> {
        let client = ClientSettings::plaintext(settings.url.clone());
        Self::run_with_client(settings, options, client)
    }

    /// Starts with `options`, reaching Manager as `client` says (TLS, bearer
    /// token, timeouts); `client.url` is used as given.
    pub fn run_with_client(
        settings: AutoSettings,
        options: RunOptions,
        client: ClientSettings,
    ) -> Result<(AutoManagerHandle, JoinHandle<()>), RunError> {
        Self::start(settings, options, client, Role::Active).map(|(handle, _, join)| (handle, join))
    }

    /// [`AutoManager::run_with`] with a subscription taken before the loop
    /// starts: it holds every notification, the first `connecting` and
    /// `ready`, the hydration's replays and the first `spareUnderflow`
    /// included (a [`AutoManagerHandle::subscribe`] after `run` may miss
    /// what the loop sent meanwhile).
    pub fn run_subscribed(
        settings: AutoSettings,
        options: RunOptions,
    ) -> Result<(AutoManagerHandle, broadcast::Receiver<Notification>, JoinHandle<()>), RunError> {
        let client = ClientSettings::plaintext(settings.url.clone());
        Self::start(settings, options, client, Role::Active)
    }

    /// Starts a standby (see the module docs): it follows Manager's stream
    /// and answers queries, but places, recovers and calls nothing until
    /// [`AutoManagerHandle::promote`]. Commands other than the live
    /// settings changes (`set_placement_pools`, `set_template_images`,
    /// `update_hot_spare_specs`) and node intents (`declare_inventory`,
    /// `cordon_node`, `uncordon_node`) wait for the promotion and are then
    /// served in order.
    pub fn standby_with_client(
        settings: AutoSettings,
        options: RunOptions,
        client: ClientSettings,
    ) -> Result<(AutoManagerHandle, JoinHandle<()>), RunError> {
        Self::start(settings, options, client, Role::Standby { snapshot: false })
            .map(|(handle, _, join)| (handle, join))
    }

    fn start(
        settings: AutoSettings,
        options: RunOptions,
        client: ClientSettings,
        role: Role,
    ) -> Result<(AutoManagerHandle, broadcast::Receiver<Notification>, JoinHandle<()>), RunError> {
        let valid = validate_auto_settings(settings)?;
        let client = ManagerClient::connect_lazy(&client)?;
        let (port, told) = Port::new(client);
        let capabilities = port.capabilities();
        let handle_port = port.clone();
        let (requests, requests_rx) = mpsc::channel(256);
        let (notifications, first) = broadcast::channel(NOTIFICATION_BUFFER);
        let (connection, connection_rx) = watch::channel(ConnectionState::Idle);
        let (revision, revision_rx) = watch::channel(0);
        let clock = Clock::new(options.time_scale);
        let shell = Shell {
            // A salt from the process's own random hash keys: a standby
            // started in the same millisecond names other nodes.
            core: AutoManagerCore::new(valid.clone(), clock.now())
                .salted(std::hash::BuildHasher::hash_one(&std::hash::RandomState::new(), 0u8) as u16),
            clock,
            valid,
            port,
            notifications: notifications.clone(),
            replies: HashMap::new(),
            next_command: 0,
            deadline: None,
            role,
            held: Vec::new(),
            connection,
            revision,
        };
        let join = tokio::spawn(shell.run(requests_rx, told));
        Ok((
            AutoManagerHandle {
                requests,
                notifications,
                connection: connection_rx,
                capabilities,
                revision: revision_rx,
                port: handle_port,
            },
            first,
            join,
        ))
    }
}

/// The pending window asked of Manager: `pendingWindow`, widened to the
/// largest placement lead of the pools in force (the cloud default, 5 min,
/// when none is known yet, as in the operator, whose pools arrive later), so
/// Manager announces a scheduled job before its placement must begin.
fn pending_window_s(valid: &ValidSettings) -> i32 {
    let lead_ms = valid
        .pools
        .iter()
        .flat_map(|p| &p.tiers)
        .map(|t| t.effective_placement_lead_ms())
        .max()
        .unwrap_or(crate::model::DEFAULT_CLOUD_PLACEMENT_LEAD_MS);
    let lead_s = u32::try_from(lead_ms.div_ceil(1_000)).unwrap_or(u32::MAX);
    i32::try_from(valid.settings.pending_window.max(lead_s)).unwrap_or(i32::MAX)
}

struct Shell {
    clock: Clock,
    core: AutoManagerCore,
    valid: ValidSettings,
    /// How each call is carried out on this Manager.
    port: Port,
    notifications: broadcast::Sender<Notification>,
    replies: HashMap<CommandId, Replier>,
    next_command: u64,
    deadline: Option<UnixMillis>,
    role: Role,
    /// Requests a standby keeps for its promotion.
    held: Vec<Request>,
    /// What [`AutoManagerHandle::connection`] reads.
    connection: watch::Sender<ConnectionState>,
    /// What [`AutoManagerHandle::changes`] reads.
    revision: watch::Sender<u64>,
}

impl Shell {
    async fn run(mut self, mut requests: mpsc::Receiver<Request>, told: Told) {
        let mut session = StreamSession::through(
            self.port.clone(),
            told,
            StreamSettings {
                pending_window_s: pending_window_s(&self.valid),
                ..StreamSettings::default()
            },
        );
        let mut state = session.state.clone();
        let mut capabilities = self.port.capabilities();
        let (results_tx, mut results) = mpsc::unbounded_channel::<(RequestId, Result<(), RpcFailure>)>();
        loop {
            let wake = self.deadline.map(|at| self.clock.instant_of(at));
            let timer = async {
                match wake {
                    Some(at) => tokio::time::sleep_until(at.into()).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                item = session.items.recv() => match item {
                    Some(StreamItem::Snapshot(events)) => self.hydrate(events, &results_tx),
                    Some(StreamItem::Event(event)) => {
                        let batch = vec![Input::Event(event)];
                        self.feed_batch(batch, &mut session.items, &mut results, &results_tx);
                    }
                    Some(StreamItem::Rejected(e)) => self.rejected(&e),
                    None => break,
                },
                Some((id, result)) = results.recv() => {
                    let batch = vec![Input::RpcResult { id, result }];
                    self.feed_batch(batch, &mut session.items, &mut results, &results_tx);
                }
                request = requests.recv() => {
                    if self.role != Role::Active {
                        match request {
                            Some(Request::Close) | None => break,
                            Some(request) => self.standby_request(request, &results_tx),
                        }
                        continue;
                    }
                    // Commands that arrived together are one step: a burst of
                    // `createBundle`s is not a placement round each. Anything
                    // else met on the way is served after them, in order.
                    let mut batch = Vec::new();
                    let mut next = request;
                    while let Some(Request::Command(command, reply)) = next {
                        batch.push(self.command_input(*command, reply));
                        if batch.len() >= MAX_BATCH {
                            next = None;
                            break;
                        }
                        next = requests.try_recv().ok();
                    }
                    let closed = batch.is_empty() && next.is_none();
                    if !batch.is_empty() {
                        self.feed_batch(batch, &mut session.items, &mut results, &results_tx);
                    }
                    match next {
                        Some(Request::Query(ask)) => ask(&self.core, self.clock.now()),
                        Some(Request::Promote(reply)) => {
                            let _ = reply.send(());
                        }
                        Some(Request::Close) => break,
                        _ if closed => break,
                        _ => {}
                    }
                }
                Ok(()) = state.changed() => {
                    let current = *state.borrow_and_update();
                    // `Ready` is told once the snapshot is applied.
                    if current != ConnectionState::Ready {
                        self.connection.send_replace(current);
                    }
                    let name = serde_json::to_value(current)
                        .ok()
                        .and_then(|v| v.as_str().map(str::to_owned))
                        .unwrap_or_default();
                    self.publish(Notification::ConnectionStateChange { state: name });
                }
                Ok(()) = capabilities.changed() => {
                    let now = capabilities.borrow_and_update().clone();
                    self.capabilities_changed(&now);
                    self.feed(Input::ManagerCapabilities(now), &results_tx);
                }
                () = timer => self.feed(Input::Timer, &results_tx),
            }
        }
        // The aborts of in-flight migrations are sent while the channel is
        // still open, for `CLOSE_ABORT_GRACE_MS` (scaled) at most.
        let step = self.core.handle(Input::Close, self.clock.now());
        let calls = self.carry_out(step, &results_tx);
        if !calls.is_empty() {
            let grace = Duration::from_secs_f64(CLOSE_ABORT_GRACE_MS as f64 / 1_000.0 / self.clock.scale);
            let _ = tokio::time::timeout(grace, futures::future::join_all(calls)).await;
        }
        for (_, reply) in self.replies.drain() {
            let _ = reply.send(Err(CommandError::Closed));
        }
        session.close().await;
        self.publish(Notification::ConnectionStateChange {
            state: "shutdown".to_owned(),
        });
    }

    /// A command as the core's input, its caller waiting for the reply.
    fn command_input(&mut self, command: Command, reply: Replier) -> Input {
        self.next_command += 1;
        let id = CommandId(self.next_command);
        self.replies.insert(id, reply);
        Input::Command { id, command }
    }

    /// A new stream's snapshot: the old core is disposed and a fresh one
    /// hydrated from it, as if every event were fresh (one batch).
    fn hydrate(&mut self, events: Vec<ManagerEvent>, results: &Results) {
        // Settings changed live (pools, template images) carry over.
        self.valid = self.core.valid_settings();
        self.core = AutoManagerCore::succeeding(self.valid.clone(), &self.core);
        // A standby stays in the hydration phase until its promotion.
        let complete = match self.role {
            Role::Active => Some(ManagerEvent::InitialDataComplete),
            Role::Standby { .. } => {
                self.role = Role::Standby { snapshot: true };
                None
            }
        };
        // What this connection found Manager to serve, before its events.
        let capabilities = Input::ManagerCapabilities(self.port.capabilities().borrow().clone());
        let inputs = std::iter::once(capabilities).chain(
            events
                .into_iter()
                .chain(complete)
                .map(|event| Input::Event(Box::new(event))),
        );
        let step = self.core.handle_all(inputs, self.clock.now());
        self.carry_out(step, results);
        self.connection.send_replace(ConnectionState::Ready);
    }

    /// Feeds `batch` plus whatever else has already arrived (events and RPC
    /// results, up to `MAX_BATCH`) as one step; a new snapshot met on the way
    /// is hydrated after it.
    fn feed_batch(
        &mut self,
        mut batch: Vec<Input>,
        items: &mut mpsc::Receiver<StreamItem>,
        arrived: &mut mpsc::UnboundedReceiver<(RequestId, Result<(), RpcFailure>)>,
        results: &Results,
    ) {
        let mut snapshot = None;
        while batch.len() < MAX_BATCH {
            match items.try_recv() {
                Ok(StreamItem::Event(event)) => batch.push(Input::Event(event)),
                Ok(StreamItem::Rejected(e)) => self.rejected(&e),
                Ok(StreamItem::Snapshot(events)) => {
                    snapshot = Some(events);
                    break;
                }
                Err(_) => break,
            }
        }
        while batch.len() < MAX_BATCH {
            match arrived.try_recv() {
                Ok((id, result)) => batch.push(Input::RpcResult { id, result }),
                Err(_) => break,
            }
        }
        let step = self.core.handle_all(batch, self.clock.now());
        self.carry_out(step, results);
        if let Some(events) = snapshot {
            self.hydrate(events, results);
        }
    }

    fn feed(&mut self, input: Input, results: &Results) {
        let step = self.core.handle(input, self.clock.now());
        self.carry_out(step, results);
    }

    /// A request to a standby: queries are answered, live settings changes
    /// (pools, template images, hot-spare specs) and node intents (cordons,
    /// inventories) applied, other commands held for the promotion.
    fn standby_request(&mut self, request: Request, results: &Results) {
        match request {
            Request::Query(ask) => ask(&self.core, self.clock.now()),
            Request::Command(command, reply) if command.applies_in_standby() => {
                let input = self.command_input(*command, reply);
                self.feed(input, results);
            }
            Request::Promote(reply) => {
                self.promote(results);
                let _ = reply.send(());
            }
            held => self.held.push(held),
        }
    }

    /// The standby acts from now on: hydration completes on the state
    /// followed so far (or with the snapshot still to come), then the held
    /// requests are served in the order they came.
    fn promote(&mut self, results: &Results) {
        let Role::Standby { snapshot } = self.role else {
            return;
        };
        self.role = Role::Active;
        if snapshot {
            self.feed(Input::Event(Box::new(ManagerEvent::InitialDataComplete)), results);
        }
        for request in std::mem::take(&mut self.held) {
            match request {
                Request::Command(command, reply) => {
                    let input = self.command_input(*command, reply);
                    self.feed(input, results);
                }
                // Only commands are held.
                Request::Query(_) | Request::Promote(_) | Request::Close => {}
            }
        }
    }

    fn rejected(&self, e: &crate::manager::wire::WireError) {
        self.publish(Notification::Error {
            message: format!("unreadable Manager event skipped: {e}"),
        });
    }

    /// Carries out a step; returns the calls it spawned.
    fn carry_out(&mut self, step: Step, results: &Results) -> Vec<JoinHandle<()>> {
        let Step { actions, next_deadline } = step;
        self.deadline = next_deadline;
        let revision = self.core.revision();
        self.revision
            .send_if_modified(|seen| std::mem::replace(seen, revision) != revision);
        let mut calls = Vec::new();
        for action in actions {
            match action {
                // Nothing a standby's core is fed (events while hydrating,
                // live settings changes) yields a call; should one appear it
                // is not sent — a follower never writes to Manager.
                Action::Call { rpc, .. } if self.role != Role::Active => {
                    tracing::error!(?rpc, "a standby does not call Manager; call dropped");
                }
                // What a standby applies is the leader's news, told by the
                // leader.
                Action::Notify(_) if self.role != Role::Active => {}
                Action::Call { id, rpc } => {
                    let port = self.port.clone();
                    let results = results.clone();
                    let now = self.clock.now();
                    calls.push(tokio::spawn(async move {
                        let result = execute(&port, rpc, now).await.map_err(failure);
                        // The loop may have ended; the result is moot then.
                        let _ = results.send((id, result));
                    }));
                }
                Action::Notify(notification) => self.publish(notification),
                Action::Reply { command, result } => self.answer(command, result.map(|()| None)),
                Action::Answer { command, result } => self.answer(command, result.map(Some)),
            }
        }
        calls
    }

    fn answer(&mut self, command: CommandId, result: Result<Option<Answer>, CommandError>) {
        if let Some(reply) = self.replies.remove(&command) {
            // The caller may have stopped waiting.
            let _ = reply.send(result);
        }
    }

    /// Manager was found to serve other additions than before: said once,
    /// in the log and as a `managerCapabilities` notification.
    fn capabilities_changed(&self, capabilities: &Capabilities) {
        self.publish(Notification::ManagerCapabilities {
            capabilities: capabilities
                .iter()
                .map(|(c, m)| (c.as_str().to_owned(), m.as_str().to_owned()))
                .collect(),
        });
    }

    fn publish(&self, notification: Notification) {
        if let Notification::Error { message } = &notification {
            tracing::warn!(error = %message, "automanager error");
        }
        // No subscriber is not an error: notifications are fire-and-forget.
        let _ = self.notifications.send(notification);
    }
}
