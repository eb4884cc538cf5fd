//! Manager's event stream as a long-lived session: connect, deliver the
//! initial snapshot as one batch, then live events; when the stream breaks,
//! reconnect with capped exponential backoff and jitter and deliver a fresh
//! snapshot. The connection state (`idle | connecting | ready |
//! transientFailure | shutdown`) is published on a watch channel.
//!
//! Messages that cannot be read are reported as [`StreamItem::Rejected`]
//! and the stream goes on; normalised values are logged.

use std::time::Duration;

use futures::StreamExt;
use rand::{Rng, SeedableRng, rngs::StdRng};
use serde::Serialize;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use super::client::{ManagerClient, RpcError};
use super::wire::{self, WireError};
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

/// Reconnect backoff: `base × 2^attempt`, capped, with full jitter in
/// [50 %, 100 %] so a fleet of operators does not reconnect in lock-step.
#[derive(Clone, Debug)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
    rng: StdRng,
}

impl Backoff {
    /// A backoff starting at `base` and never exceeding `cap`.
    pub fn new(base: Duration, cap: Duration, seed: u64) -> Self {
        Self {
            base,
            cap,
            attempt: 0,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// The next delay.
    pub fn next_delay(&mut self) -> Duration {
        let exp = self.base.saturating_mul(1u32 << self.attempt.min(20));
        self.attempt = self.attempt.saturating_add(1);
        let ceiling = exp.min(self.cap);
        ceiling.mul_f64(self.rng.random_range(0.5..=1.0))
    }

    /// Back to the base delay (after a stream delivered its snapshot).
    pub fn reset(&mut self) {
        self.attempt = 0;
    }
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
    /// Starts the session on a client.
    pub fn start(client: ManagerClient, settings: StreamSettings) -> Self {
        let (items_tx, items) = mpsc::channel(4096);
        let (state_tx, state) = watch::channel(ConnectionState::Idle);
        let (shutdown, shutdown_rx) = watch::channel(false);
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        let task = tokio::spawn(run(client, settings, items_tx, state_tx, shutdown_rx, seed));
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
    settings: StreamSettings,
    items: mpsc::Sender<StreamItem>,
    state: watch::Sender<ConnectionState>,
    mut shutdown: watch::Receiver<bool>,
    seed: u64,
) {
    let mut backoff = Backoff::new(settings.backoff_base, settings.backoff_cap, seed);
    loop {
        state.send_replace(ConnectionState::Connecting);
        let ended = tokio::select! {
            ended = session(&client, &settings, &items, &state, &mut backoff) => ended,
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
    settings: &StreamSettings,
    items: &mpsc::Sender<StreamItem>,
    state: &watch::Sender<ConnectionState>,
    backoff: &mut Backoff,
) -> Ended {
    let mut stream = match client.event_stream(settings.pending_window_s).await {
        Ok(s) => s,
        Err(RpcError { code, message, .. }) => return Ended::Unreachable(format!("{code:?}: {message}")),
    };
    let mut snapshot = Some(Vec::new());
    while let Some(msg) = stream.next().await {
        let msg = match msg {
            Ok(m) => m,
            Err(status) => return Ended::Broken(format!("{:?}: {}", status.code(), status.message())),
        };
        let mut notes = wire::Notes::new();
        let converted = wire::event_from_pb(&msg, &mut notes);
        for n in &notes {
            tracing::warn!(detail = n.message, field = n.field, what = %n.what, "normalised a value from Manager");
        }
        let item = match converted {
            Ok(ManagerEvent::InitialDataComplete) => match snapshot.take() {
                Some(batch) => {
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
                    continue;
                }
                // A second completion marker carries nothing new.
                None => continue,
            },
            Ok(event) => match snapshot.as_mut() {
                Some(batch) => {
                    batch.push(event);
                    continue;
                }
                None => StreamItem::Event(Box::new(event)),
            },
            Err(e) => {
                tracing::warn!(error = %e, reason = e.reason(), "skipped an unreadable Manager event");
                StreamItem::Rejected(e)
            }
        };
        if items.send(item).await.is_err() {
            return Ended::Closed;
        }
    }
    Ended::Broken("stream ended".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_exponentially_with_jitter_and_is_capped() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(2), 7);
        let delays: Vec<_> = (0..8).map(|_| b.next_delay()).collect();
        assert!(delays[0] >= Duration::from_millis(50) && delays[0] <= Duration::from_millis(100));
        assert!(delays[3] >= Duration::from_millis(400) && delays[3] <= Duration::from_millis(800));
        assert!(delays.iter().all(|d| *d <= Duration::from_secs(2)));
        assert!(delays[7] >= Duration::from_secs(1));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(100));
    }
}
