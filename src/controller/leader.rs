//! Leader election on a `coordination.k8s.io` Lease (kube-lease-manager):
//! several operator processes may run; only the one holding the Lease talks
//! to Manager and writes status. The others wait, ready to take over when
//! the Lease expires (its duration bounds the hand-over).

use kube::Client;
use kube_lease_manager::{LeaseManagerBuilder, LeaseManagerError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How the Lease is held.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaseSettings {
    /// The Lease's namespace.
    pub namespace: String,
    /// The Lease's name.
    pub name: String,
    /// This process's identity (the pod name in a cluster).
    pub identity: String,
    /// Seconds the Lease is valid without renewal.
    pub duration_s: u64,
    /// Seconds before expiry the holder renews.
    pub grace_s: u64,
}

/// Why the election could not start.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The Lease could not be read or created.
    #[error("failed to prepare Lease {namespace}/{name}: {source}")]
    PrepareLease {
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
        /// Why.
        source: LeaseManagerError,
    },
}

/// The election: `leading` turns true while this process holds the Lease.
/// Dropping `leading` releases the Lease.
pub struct Election {
    /// Whether this process leads now.
    pub leading: watch::Receiver<bool>,
    /// The task renewing the Lease.
    pub task: JoinHandle<Result<kube_lease_manager::LeaseManager, LeaseManagerError>>,
}

/// Joins the election for the Lease `settings` names.
pub async fn elect(client: Client, settings: &LeaseSettings) -> Result<Election, LeaderError> {
    let manager = LeaseManagerBuilder::new(client, &settings.name)
        .with_namespace(&settings.namespace)
        .with_identity(&settings.identity)
        .with_duration(settings.duration_s)
        .with_grace(settings.grace_s)
        // One field manager per candidate: the Lease is locked by
        // server-side apply, and two candidates under one manager would
        // both "win" (no conflict between a manager and itself) and lead
        // at once until their next renewal.
        .with_field_manager(format!("{}/leader/{}", super::OPERATOR_NAME, settings.identity))
        .build()
        .await
        .map_err(|source| LeaderError::PrepareLease {
            namespace: settings.namespace.clone(),
            name: settings.name.clone(),
            source,
        })?;
    let (leading, task) = manager.watch().await;
    Ok(Election { leading, task })
}
