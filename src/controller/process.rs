//! The operator process's life: join the election, and for every term of
//! leadership run a [`session`](super::session) until the Lease is lost or
//! the process is told to stop. Followers only keep the election going.

use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;

use crate::automanager::RunError;
use crate::telemetry::{Health, OperatorMetrics};

use super::leader::{LeaderError, LeaseSettings, elect};
use super::session::{SessionSettings, lead};

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The election could not start.
    #[error(transparent)]
    Leader(#[from] LeaderError),
    /// The core refused to start.
    #[error(transparent)]
    Core(#[from] RunError),
}

/// Runs until `stop` turns true: leads whenever the Lease is won.
pub async fn run(
    client: Client,
    lease: LeaseSettings,
    session: SessionSettings,
    metrics: Arc<OperatorMetrics>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ProcessError> {
    let mut election = elect(client.clone(), &lease).await?;
    // A follower is ready: it has joined the election and can take over.
    crate::telemetry::set(&health.hydrated, true);
    crate::telemetry::set(&health.serving, true);
    loop {
        tokio::select! {
            won = election.leading.wait_for(|l| *l) => if won.is_err() { break },
            _ = stop.wait_for(|s| *s) => break,
        }
        tracing::info!(identity = %lease.identity, "leading: starting the core and the controllers");
        metrics.leader.set(1);
        // Ready again once the core's stream to Manager is ready.
        crate::telemetry::set(&health.serving, false);
        let (end, ended) = watch::channel(false);
        let mut leading = election.leading.clone();
        let mut stopping = stop.clone();
        let watcher = tokio::spawn(async move {
            tokio::select! {
                _ = leading.wait_for(|l| !*l) => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
            let _ = end.send(true);
        });
        let term = lead(client.clone(), session.clone(), metrics.clone(), health.clone(), ended).await;
        watcher.abort();
        metrics.leader.set(0);
        crate::telemetry::set(&health.serving, true);
        term?;
        tracing::info!(identity = %lease.identity, "no longer leading");
        if *stop.borrow() {
            break;
        }
    }
    // Dropping the receiver releases the Lease for the next leader.
    drop(election.leading);
    let _ = election.task.await;
    Ok(())
}
