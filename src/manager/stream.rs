//! Manager's event stream as a long-lived session: connect, deliver the
//! initial snapshot as one batch, then live events; when the stream breaks,
//! reconnect with capped exponential backoff and jitter and deliver a fresh
//! snapshot. The connection state (`idle | connecting | ready |
//! transientFailure | shutdown`) is published on a watch channel.
//!
//! Messages that cannot be read are reported as [`StreamItem::Rejected`]
//! and the stream goes on; normalised values are logged.
//!
//! Through a [`Port`] ([`StreamSession::through`]) each connection first
//! asks Manager which additions it serves, every event passes the port
//! (which adds what it keeps for a Manager without them), a snapshot is
//! completed with what the port stores, and what the port tells in
//! Manager's place is delivered in order with Manager's own events.

use std::time::Duration;

use futures::StreamExt;
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::client::{ManagerClient, RpcError};
use super::port::{Port, Told};
use super::proto::manager as pb;
use super::wire::{self, WireError};
use crate::backoff::Backoff;
use crate::model::ManagerEvent;

/// The seed's `onConnectionStateChange` states.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum ConnectionState {
    /// Not started.
    Idle,
    /// Opening the stream.
    Connecting,
    /// The stream is open and its snapshot delivered.
    Ready,
    /// The stream broke; waiting to reconnect.
    TransientFailure,
    /// Closed for good.
    Shutdown,
}

/// What the session delivers.
#[derive(Debug)]
pub enum StreamItem {
    /// A new stream's full initial snapshot: every event up to and
    /// excluding `InitialDataComplete`. Whatever was known before is
    /// superseded (the core disposes its old instance and hydrates a fresh
    /// one from this).
    Snapshot(Vec<ManagerEvent>),
    /// A live event.
    Event(Box<ManagerEvent>),
    /// A message that could not be read; it was skipped.
    Rejected(WireError),
}

/// Settings of a stream session.
#[derive(Clone, Debug)]
pub struct StreamSettings {
    /// `pendingWindow` in seconds, sent to Manager.
    pub pending_window_s: i32,
    /// First reconnect delay.
    pub backoff_base: Duration,
    /// Longest reconnect delay.
    pub backoff_cap: Duration,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            pending_window_s: 60,
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(30),
        }
    }
}

/// A running stream session.
pub struct StreamSession {
    /// Items in order.
    pub items: mpsc::Receiver<StreamItem>,
    /// The connection state.
    pub state: watch::Receiver<ConnectionState>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl StreamSession {
    /// Starts the session on a client: Manager's events as it sends them.
    pub fn start(client: ManagerClient, settings: StreamSettings) -> Self {
        Self::spawn(client, None, settings)
    }

    /// Starts the session through `port`, delivering what it tells.
    pub fn through(port: Port, told: Told, settings: StreamSettings) -> Self {
        Self::spawn(port.client().clone(), Some((port, told)), settings)
    }

    fn spawn(client: ManagerClient, port: Option<(Port, Told)>, settings: StreamSettings) -> Self {
        let (items_tx, items) = mpsc::channel(4096);
        let (state_tx, state) = watch::channel(ConnectionState::Idle);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let task = tokio::spawn(run(client, port, settings, items_tx, state_tx, shutdown_rx, seed));
        Self {
            items,
            state,
            shutdown,
            task,
        }
    }

    /// Closes the session: the stream ends, the state becomes `shutdown`.
    /// Idempotent.
    pub async fn close(self) {
        let _ = self.shutdown.send(true);
        let _ = self.task.await;
    }
}

enum Ended {
    /// The stream could not be opened; retry.
    Unreachable(String),
    /// The stream broke after it opened; reconnect.
    Broken(String),
    /// Shut down, or nobody listens any more.
    Closed,
}

async fn run(
    client: ManagerClient,
    mut port: Option<(Port, Told)>,
    settings: StreamSettings,
    items: mpsc::Sender<StreamItem>,
    state: watch::Sender<ConnectionState>,
    mut shutdown: watch::Receiver<bool>,
    seed: u64,
) {
    let mut backoff = Backoff::new(settings.backoff_base, settings.backoff_cap).with_jitter(seed);
    loop {
        state.send_replace(ConnectionState::Connecting);
        let ended = tokio::select! {
            ended = session(&client, port.as_mut(), &settings, &items, &state, &mut backoff) => ended,
            _ = shutdown.wait_for(|s| *s) => Ended::Closed,
        };
        match ended {
            Ended::Closed => break,
            Ended::Unreachable(ref why) | Ended::Broken(ref why) => {
                state.send_replace(ConnectionState::TransientFailure);
                let delay = backoff.next_delay();
                let retry_in_ms = delay.as_millis() as u64;
                let manager = client.url();
                if matches!(ended, Ended::Broken(_)) {
                    tracing::warn!(manager, reason = %why, retry_in_ms, "Manager event stream lost");
                } else {
                    tracing::warn!(manager, reason = %why, retry_in_ms, "could not open the Manager event stream");
                }
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = shutdown.wait_for(|s| *s) => break,
                }
            }
        }
    }
    state.send_replace(ConnectionState::Shutdown);
}

async fn session(
    client: &ManagerClient,
    mut port: Option<&mut (Port, Told)>,
    settings: &StreamSettings,
    items: &mpsc::Sender<StreamItem>,
    state: &watch::Sender<ConnectionState>,
    backoff: &mut Backoff,
) -> Ended {
    if let Some((port, _)) = port.as_deref() {
        if let Err(RpcError { code, message, .. }) = port.probe().await {
            return Ended::Unreachable(format!("{code:?}: {message}"));
        }
        port.reconnecting();
    }
    let mut stream = match client.event_stream(settings.pending_window_s).await {
        Ok(s) => s,
        Err(RpcError { code, message, .. }) => return Ended::Unreachable(format!("{code:?}: {message}")),
    };
    let mut snapshot = Some(Vec::new());
    // What the port told while the snapshot was being read: delivered
    // after it, as live events.
    let mut told_meanwhile = Vec::new();
    loop {
        let told = async {
            match port.as_deref_mut() {
                Some((_, told)) => told.recv().await,
                None => std::future::pending().await,
            }
        };
        let msg = tokio::select! {
            biased;
            Some(event) = told => {
                if snapshot.is_some() {
                    told_meanwhile.push(event);
                    continue;
                }
                if let Some(ended) = deliver(items, decode(&event)).await {
                    return ended;
                }
                continue;
            }
            msg = stream.next() => msg,
        };
        let Some(msg) = msg else {
            break;
        };
        let msg = match msg {
            Ok(m) => m,
            Err(status) => return Ended::Broken(format!("{:?}: {}", status.code(), status.message())),
        };
        let passed = match port.as_deref() {
            Some((port, _)) => port.incoming(msg),
            None => vec![msg],
        };
        for msg in passed {
            let converted = decode(&msg);
            if matches!(converted, Ok(ManagerEvent::InitialDataComplete)) {
                // A second completion marker carries nothing new.
                let Some(mut batch) = snapshot.take() else {
                    continue;
                };
                if let Some((port, _)) = port.as_deref() {
                    let kept: Vec<ManagerEvent> = port.snapshot().iter().filter_map(|e| decode(e).ok()).collect();
                    batch.splice(0..0, kept);
                }
                backoff.reset();
                tracing::info!(
                    manager = client.url(),
                    snapshot_events = batch.len(),
                    "Manager event stream open, snapshot received"
                );
                let sent = items.send(StreamItem::Snapshot(batch)).await;
                state.send_replace(ConnectionState::Ready);
                if sent.is_err() {
                    return Ended::Closed;
                }
                for event in std::mem::take(&mut told_meanwhile) {
                    if let Some(ended) = deliver(items, decode(&event)).await {
                        return ended;
                    }
                }
                continue;
            }
            match (converted, snapshot.as_mut()) {
                (Ok(event), Some(batch)) => batch.push(event),
                (converted, _) => {
                    if let Some(ended) = deliver(items, converted).await {
                        return ended;
                    }
                }
            }
        }
    }
    Ended::Broken("stream ended".into())
}

/// A Manager event in domain form; normalised values are logged.
fn decode(msg: &pb::EventStreamEvent) -> Result<ManagerEvent, WireError> {
    let mut notes = wire::Notes::new();
    let converted = wire::event_from_pb(msg, &mut notes);
    for n in &notes {
        tracing::warn!(detail = n.message, field = n.field, what = %n.what, "normalised a value from Manager");
    }
    converted
}

/// Delivers a live event (or the word that one could not be read); `Some`
/// when nobody listens any more.
async fn deliver(items: &mpsc::Sender<StreamItem>, converted: Result<ManagerEvent, WireError>) -> Option<Ended> {
    let item = match converted {
        Ok(event) => StreamItem::Event(Box::new(event)),
        Err(e) => {
            tracing::warn!(error = %e, reason = e.reason(), "skipped an unreadable Manager event");
            StreamItem::Rejected(e)
        }
    };
    items.send(item).await.is_err().then_some(Ended::Closed)
}
