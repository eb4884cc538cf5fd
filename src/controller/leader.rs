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
        namespace: String,
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

/// Watches the Lease until aborted and turns `seen` true once it names a
/// holder other than `identity`: a predecessor whose calls to Manager may
/// still be in flight when this process takes over (see
/// [`fence`](super::process)). A Lease that is absent or held by no one
/// (a first install, a holder that released it on its way out) leaves
/// `seen` false.
pub async fn watch_predecessor(client: Client, settings: LeaseSettings, seen: watch::Sender<bool>) {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::Api;
    use kube::runtime::{WatchStreamExt, watcher};

    let leases = Api::<Lease>::namespaced(client, &settings.namespace);
    let config = watcher::Config::default().fields(&format!("metadata.name={}", settings.name));
    let mut leases = std::pin::pin!(watcher(leases, config).default_backoff().applied_objects());
    while let Some(lease) = leases.next().await {
        let lease = match lease {
            Ok(lease) => lease,
            Err(e) => {
                // The watcher retries by itself (with backoff); until it
                // reads the Lease a predecessor goes unseen.
                tracing::warn!(error = %e, lease = %settings.name, "watching the Lease for a predecessor");
                continue;
            }
        };
        let holder = lease.spec.and_then(|s| s.holder_identity);
        if holder.is_some_and(|h| !h.is_empty() && h != settings.identity) {
            seen.send_replace(true);
        }
    }
}
