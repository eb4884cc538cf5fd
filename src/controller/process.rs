//! The operator process's life: join the election; while following, keep a
//! standby core hydrated from Manager's stream with the cluster's pools and
//! hot-spare policies (see [`standby`](super::standby)), so the process is
//! ready to lead at once; for every term of leadership,
//! promote that core and run a [`session`](super::session) until the Lease
//! is lost or the process is told to stop. After a term the core is closed
//! and a fresh standby follows again.

use std::collections::BTreeMap;
use std::sync::Arc;

use kube::Client;
use tokio::sync::watch;

use crate::automanager::{AutoManager, AutoManagerHandle, CommandError, RunError};
use crate::manager::port::Mode;
use crate::manager::stream::ConnectionState;
use crate::telemetry::{CapabilityLabels, Health, OperatorMetrics};

use super::leader::{LeaseSettings, elect};
use super::lease::Predecessor;
use super::session::{SessionSettings, lead};
use super::standby::keep_settings;

/// Why the operator stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    /// The core refused to start.
    #[error(transparent)]
    Core(#[from] RunError),
}

/// Runs until `stop` turns true: follows with a standby core, leads
/// whenever the Lease is won.
pub async fn run(
    client: Client,
    lease: LeaseSettings,
    session: SessionSettings,
    metrics: Arc<OperatorMetrics>,
    health: Arc<Health>,
    mut stop: watch::Receiver<bool>,
) -> Result<(), ProcessError> {
    let mut election = elect(client.clone(), &lease);
    loop {
        let (core, core_task) = AutoManager::standby_with_client(
            session.settings.clone(),
            session.options.clone(),
            session.manager.clone(),
        )?;
        let readiness = tokio::spawn(track_connection(core.clone(), health.clone(), metrics.clone()));
        let images = session
            .template_images
            .clone()
            .map(|images| tokio::spawn(keep_template_images(core.clone(), images)));
        let (synced_tx, mut synced) = watch::channel(false);
        let settings = tokio::spawn(keep_settings(
            client.clone(),
            core.clone(),
            session.fleet.clone(),
            synced_tx,
        ));
        // Leads once the Lease is won and the standby has the cluster's
        // pools and policies (a core promoted without them would place
        // nothing and take every live spare for an orphan) and the cordons
        // and inventories people declared on its nodes.
        let won = tokio::select! {
            won = async {
                election.leading.wait_for(|l| *l).await.is_ok() && synced.wait_for(|s| *s).await.is_ok()
            } => won,
            _ = stop.wait_for(|s| *s) => false,
        };
        settings.abort();
        // The fence: a predecessor's calls may still take effect at
        // Manager until their timeout has passed, and the standby, still
        // following, sees what they did before it decides anything.
        let predecessor = election.took_over.borrow().clone();
        let won = won
            && match predecessor {
                Some(predecessor) => fence(&predecessor, session.manager.request_timeout, &mut stop).await,
                None => true,
            };
        if !won {
            core.close().await;
            let _ = core_task.await;
            readiness.abort();
            if let Some(images) = &images {
                images.abort();
            }
            break;
        }
        tracing::info!(identity = %lease.identity, "leading: promoting the standby core and starting the controllers");
        metrics.leader.set(1);
        crate::telemetry::set(&health.leading, true);
        let (end, ended) = watch::channel(false);
        let mut leading = election.leading.clone();
        let mut stopping = stop.clone();
        let (term_metrics, term_health, identity) = (metrics.clone(), health.clone(), lease.identity.clone());
        let watcher = tokio::spawn(async move {
            tokio::select! {
                _ = leading.wait_for(|l| !*l) => {}
                _ = stopping.wait_for(|s| *s) => {}
            }
            // Said and shown the moment the term ends, when the core stops
            // driving Manager: the controllers wind down after.
            term_metrics.leader.set(0);
            crate::telemetry::set(&term_health.leading, false);
            tracing::info!(%identity, "no longer leading");
            let _ = end.send(true);
        });
        lead(client.clone(), session.clone(), core, core_task, metrics.clone(), ended).await;
        // The term ended by the watcher's word (it has finished).
        let _ = watcher.await;
        readiness.abort();
        if let Some(images) = &images {
            images.abort();
        }
        if *stop.borrow() {
            break;
        }
    }
    // Dropping the receiver releases the Lease for the next leader.
    drop(election.leading);
    let _ = election.task.await;
    Ok(())
}

/// Waits out `timeout` (Manager's request timeout) past the moment the
/// predecessor stopped acting, before a promotion that follows it without
/// the Lease being released: its last calls may still be carried out by
/// Manager until then, and a leader deciding before they land would place
/// beside starts it cannot see (over-committing a node), re-place a job
/// Manager is about to start, or miss a verdict on its way. The standby
/// keeps following Manager's stream meanwhile, so what those calls did is
/// in its state when it acts. A predecessor long gone (an API server
/// outage outlasted its Lease) is waited for no longer than that. False
/// when told to stop first.
async fn fence(predecessor: &Predecessor, timeout: std::time::Duration, stop: &mut watch::Receiver<bool>) -> bool {
    let until = predecessor.acting_until + timeout;
    let wait = until.saturating_duration_since(tokio::time::Instant::now());
    tracing::info!(
        wait_s = (wait.as_secs_f64() * 10.0).round() / 10.0,
        predecessor = %predecessor.holder,
        "won the Lease from another leader: waiting out its calls to Manager before acting"
    );
    tokio::select! {
        () = tokio::time::sleep_until(until) => true,
        _ = stop.wait_for(|s| *s) => false,
    }
}

/// Keeps `core`'s template images those of the settings file as it
/// changes (a live setting: a standby takes it too). Ends with the core.
async fn keep_template_images(core: AutoManagerHandle, mut images: watch::Receiver<BTreeMap<String, Vec<String>>>) {
    loop {
        let wanted = images.borrow_and_update().clone();
        let Ok(in_force) = core.template_images().await else {
            return;
        };
        if in_force != wanted && matches!(core.set_template_images(wanted).await, Err(CommandError::Closed)) {
            return;
        }
        if images.changed().await.is_err() {
            return;
        }
    }
}

/// Follows one core's stream for `/readyz` and the connection gauge:
/// hydrated from its first applied snapshot on, connected while the stream
/// is up.
async fn track_connection(core: AutoManagerHandle, health: Arc<Health>, metrics: Arc<OperatorMetrics>) {
    crate::telemetry::set(&health.hydrated, false);
    crate::telemetry::set(&health.connected, false);
    let mut capabilities = core.capabilities();
    let capability_metrics = metrics.clone();
    // Ends with the core (its sender dropped), like the loop below.
    tokio::spawn(async move {
        loop {
            let now = capabilities.borrow_and_update().clone();
            for (capability, mode) in now.iter() {
                for other in [Mode::Served, Mode::Published] {
                    let labels = CapabilityLabels {
                        capability: capability.as_str().to_owned(),
                        mode: other.as_str().to_owned(),
                    };
                    capability_metrics
                        .manager_capability
                        .get_or_create(&labels)
                        .set(i64::from(other == mode));
                }
            }
            if capabilities.changed().await.is_err() {
                return;
            }
        }
    });
    let mut connection = core.connection();
    loop {
        let ready = *connection.borrow_and_update() == ConnectionState::Ready;
        if ready {
            crate::telemetry::set(&health.hydrated, true);
        }
        crate::telemetry::set(&health.connected, ready);
        metrics.manager_connected.set(i64::from(ready));
        if connection.changed().await.is_err() {
            return;
        }
    }
}
