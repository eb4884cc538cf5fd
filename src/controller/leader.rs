//! Leader election on a `coordination.k8s.io` Lease: several operator
//! processes may run; only the one holding the Lease talks to Manager and
//! writes status. The others read the Lease, ready to take it over once its
//! holder can no longer be acting (the rules are [`super::lease`]'s).
//!
//! Every write is conditional on the version of the record last read (a
//! merge patch carrying `resourceVersion`), so of two candidates writing
//! at once one fails and reads again. A holder that cannot renew — the API
//! server gone, or this process alone cut off from it — stops leading at
//! [`Timing::stop_at`](super::lease::Timing::stop_at), before anyone else
//! may take the Lease, and leads again if a later renewal still finds the
//! record its own. Every read and write retries on a jittered, capped
//! backoff; a failed attempt is logged at debug level only (the API
//! server's outage is said once, by [`super::api_server`]).

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::backoff::{self, Backoff};

use super::lease::{Predecessor, Sighting, Timing, Verdict, judge};

/// The first retry of a failed read or write of the Lease.
const FIRST_RETRY: Duration = Duration::from_millis(100);
/// The longest wait between retries: a holder that stopped leading renews
/// within this of the API server's return.
const MAX_RETRY: Duration = Duration::from_secs(2);
/// The longest one read or write of the Lease may take: a request that
/// hangs (a partition drops packets) must not hold up the next attempt.
const MAX_REQUEST: Duration = Duration::from_secs(5);

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

impl LeaseSettings {
    fn timing(&self) -> Timing {
        Timing {
            duration: Duration::from_secs(self.duration_s),
            grace: Duration::from_secs(self.grace_s),
        }
    }
}

/// Why a read or write of the Lease failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// Another candidate wrote the record since it was read (or created it
    /// first).
    #[error("Lease {lease} changed since it was read")]
    Changed {
        /// `namespace/name`.
        lease: String,
    },
    /// The API server did not answer, or refused.
    #[error("failed to {action} Lease {lease}: {source}")]
    Request {
        /// `read`, `create` or `write`.
        action: &'static str,
        /// `namespace/name`.
        lease: String,
        /// Why.
        source: kube::Error,
    },
    /// The API server took longer than [`MAX_REQUEST`] to answer.
    #[error("failed to {action} the Lease: no answer within {MAX_REQUEST:?}")]
    TimedOut {
        /// `read`, `create` or `write`.
        action: &'static str,
    },
}

/// Where the record lives: the API server (or a stand-in in tests).
pub trait LeaseStore: Send + Sync + 'static {
    /// The record, `None` when there is none.
    fn read(&self) -> impl Future<Output = Result<Option<Lease>, LeaseError>> + Send;
    /// Creates the record with `spec`; [`LeaseError::Changed`] when it
    /// exists already.
    fn create(&self, spec: LeaseSpec) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
    /// Writes `spec` over the record only if it is still at `version`.
    fn write(&self, version: &str, spec: &LeaseSpec) -> impl Future<Output = Result<Lease, LeaseError>> + Send;
}

/// The Lease on the API server.
struct KubeLease {
    api: Api<Lease>,
    name: String,
    /// `namespace/name`, for errors.
    lease: String,
}

impl KubeLease {
    fn failed(&self, action: &'static str) -> impl Fn(kube::Error) -> LeaseError + '_ {
        move |source| match source {
            kube::Error::Api(status) if status.code == 409 => LeaseError::Changed {
                lease: self.lease.clone(),
            },
            source => LeaseError::Request {
                action,
                lease: self.lease.clone(),
                source,
            },
        }
    }
}

impl LeaseStore for KubeLease {
    async fn read(&self) -> Result<Option<Lease>, LeaseError> {
        self.api.get_opt(&self.name).await.map_err(self.failed("read"))
    }

    async fn create(&self, spec: LeaseSpec) -> Result<Lease, LeaseError> {
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                ..ObjectMeta::default()
            },
            spec: Some(spec),
        };
        self.api
            .create(&PostParams::default(), &lease)
            .await
            .map_err(self.failed("create"))
    }

    async fn write(&self, version: &str, spec: &LeaseSpec) -> Result<Lease, LeaseError> {
        // `resourceVersion` in a patch is a precondition: the API server
        // answers 409 when the record moved on since it was read.
        let mut body = serde_json::json!({
            "metadata": { "resourceVersion": version },
            "spec": spec,
        });
        // A released Lease names nobody: the field is removed, not left out.
        if spec.holder_identity.is_none() {
            body["spec"]["holderIdentity"] = serde_json::Value::Null;
        }
        let params = PatchParams {
            field_manager: Some(format!("{}/leader", crate::decide::OPERATOR_NAME)),
            ..PatchParams::default()
        };
        self.api
            .patch(&self.name, &params, &Patch::Merge(&body))
            .await
            .map_err(self.failed("write"))
    }
}

/// The election: `leading` turns true while this process may act as the
/// leader. Dropping `leading` (every receiver of it) releases the Lease.
pub struct Election {
    /// Whether this process leads now.
    pub leading: watch::Receiver<bool>,
    /// Whom this process last took the Lease from without it being
    /// released; set before `leading` turns true.
    pub took_over: watch::Receiver<Option<Predecessor>>,
    /// The candidate; it ends once the Lease is released.
    pub task: JoinHandle<()>,
}

/// Joins the election for the Lease `settings` names.
pub fn elect(client: Client, settings: &LeaseSettings) -> Election {
    let store = KubeLease {
        api: Api::namespaced(client, &settings.namespace),
        name: settings.name.clone(),
        lease: format!("{}/{}", settings.namespace, settings.name),
    };
    campaign(store, settings)
}

/// Joins the election for the Lease in `store`.
pub fn campaign(store: impl LeaseStore, settings: &LeaseSettings) -> Election {
    let (leading_tx, leading) = watch::channel(false);
    let (took_over_tx, took_over) = watch::channel(None);
    let candidate = Candidate {
        store,
        identity: settings.identity.clone(),
        timing: settings.timing(),
        held: None,
        seen: None,
        backoff: Backoff::new(FIRST_RETRY, MAX_RETRY).with_jitter(backoff::seed()),
        term: Term {
            leading: leading_tx,
            took_over: took_over_tx,
            stop_at: None,
        },
    };
    Election {
        leading,
        took_over,
        task: tokio::spawn(candidate.run()),
    }
}

/// The record this candidate last wrote, and when it sent that write.
struct Held {
    lease: Lease,
    wrote: Instant,
}

impl Held {
    fn version(&self) -> &str {
        self.lease.metadata.resource_version.as_deref().unwrap_or_default()
    }
}

/// Whether this candidate leads, and until when.
struct Term {
    leading: watch::Sender<bool>,
    took_over: watch::Sender<Option<Predecessor>>,
    /// When leading stops unless a renewal gets through first.
    stop_at: Option<Instant>,
}

impl Term {
    /// Runs `work`; should this candidate lead and its stop time pass
    /// meanwhile, it stops leading then (and `work` goes on).
    async fn guard<T>(&mut self, work: impl Future<Output = T>) -> T {
        let mut work = std::pin::pin!(work);
        if let Some(stop_at) = self.stop_at {
            tokio::select! {
                out = &mut work => return out,
                () = sleep_until(stop_at) => {
                    tracing::warn!(
                        "could not renew the Lease in time: stopped leading before it expires; \
                         leading again once a renewal gets through and no one else took it"
                    );
                    self.stop();
                }
            }
        }
        work.await
    }

    fn stop(&mut self) {
        self.stop_at = None;
        self.leading.send_replace(false);
    }

    /// A write sent at `wrote` went through: lead until the next stop time
    /// (a new term, after `predecessor`, if not leading already).
    fn renewed(&mut self, timing: &Timing, wrote: Instant, predecessor: Option<Predecessor>) {
        let stop_at = timing.stop_at(wrote);
        if stop_at <= Instant::now() {
            // An answer so late that the term would already be over.
            return;
        }
        if self.stop_at.replace(stop_at).is_none() {
            self.took_over.send_replace(predecessor);
            self.leading.send_replace(true);
        }
    }
}

struct Candidate<S> {
    store: S,
    identity: String,
    timing: Timing,
    /// What this candidate last wrote, while the record may still be its.
    held: Option<Held>,
    /// The record as last read, while another holds it.
    seen: Option<Sighting>,
    backoff: Backoff,
    term: Term,
}

impl<S: LeaseStore> Candidate<S> {
    async fn run(mut self) {
        let leading = self.term.leading.clone();
        tokio::select! {
            () = leading.closed() => {}
            () = async { loop { self.step().await } } => {}
        }
        self.release().await;
    }

    /// One read or write, and the wait after it. The record held stays in
    /// `held` throughout: a step cut short (the Lease released meanwhile)
    /// leaves it there to be released.
    async fn step(&mut self) {
        match &self.held {
            Some(held) => {
                let (version, spec, wrote) = (held.version().to_owned(), held.lease.spec.clone(), held.wrote);
                self.renew(&version, spec.unwrap_or_default(), wrote).await;
            }
            None => self.look().await,
        }
    }

    /// Renews at the renewal time the record at `version` (`spec`, written
    /// at `wrote`); on a conflict the record is read again.
    async fn renew(&mut self, version: &str, spec: LeaseSpec, wrote: Instant) {
        self.term.guard(sleep_until(self.timing.renew_at(wrote))).await;
        let spec = LeaseSpec {
            renew_time: Some(MicroTime(Timestamp::now())),
            lease_duration_seconds: Some(duration_s(&self.timing)),
            ..spec
        };
        let sent = Instant::now();
        let written = self
            .term
            .guard(bounded("write", self.store.write(version, &spec)))
            .await;
        match written {
            Ok(lease) => self.hold(lease, sent, None),
            // Written by someone else since (or by a write of ours whose
            // answer was lost): whose it is now decides.
            Err(LeaseError::Changed { .. }) => self.held = None,
            Err(e) => {
                tracing::debug!(error = %e, "renewing the Lease");
                self.wait().await;
            }
        }
    }

    /// Reads the record and takes it when [`judge`] says so.
    async fn look(&mut self) {
        let read = self.term.guard(bounded("read", self.store.read())).await;
        let lease = match read {
            Ok(Some(lease)) => lease,
            Ok(None) => {
                let spec = self.acquisition(None, Timestamp::now());
                let sent = Instant::now();
                match self.term.guard(bounded("create", self.store.create(spec))).await {
                    Ok(lease) => self.hold(lease, sent, None),
                    Err(LeaseError::Changed { .. }) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "creating the Lease");
                        self.wait().await;
                    }
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, "reading the Lease");
                self.wait().await;
                return;
            }
        };
        let seen = Sighting::of(&lease, self.seen.as_ref(), Instant::now());
        match judge(&seen, &self.identity, &self.timing, Instant::now(), Timestamp::now()) {
            Verdict::Take { predecessor } => {
                let spec = self.acquisition(lease.spec.as_ref(), Timestamp::now());
                let sent = Instant::now();
                match self
                    .term
                    .guard(bounded("write", self.store.write(&seen.version, &spec)))
                    .await
                {
                    Ok(lease) => self.hold(lease, sent, predecessor),
                    // Another candidate got there first: read again.
                    Err(LeaseError::Changed { .. }) => {}
                    Err(e) => {
                        tracing::debug!(error = %e, "taking the Lease");
                        self.wait().await;
                    }
                }
            }
            Verdict::LookAgain { holder, at } => {
                if self.term.stop_at.is_some() {
                    tracing::warn!(%holder, "the Lease passed to another holder: stopped leading");
                    self.term.stop();
                }
                self.backoff.reset();
                self.seen = Some(seen);
                sleep_until(at).await;
            }
        }
    }

    /// The record naming this candidate, from `before`.
    fn acquisition(&self, before: Option<&LeaseSpec>, now: Timestamp) -> LeaseSpec {
        let before = before.cloned().unwrap_or_default();
        let ours = before.holder_identity.as_deref() == Some(self.identity.as_str());
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(duration_s(&self.timing)),
            acquire_time: if ours {
                before.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(
                before.lease_transitions.unwrap_or(0) + i32::from(!ours && before.holder_identity.is_some()),
            ),
            ..LeaseSpec::default()
        }
    }

    fn hold(&mut self, lease: Lease, wrote: Instant, predecessor: Option<Predecessor>) {
        self.backoff.reset();
        self.seen = None;
        self.term.renewed(&self.timing, wrote, predecessor);
        self.held = Some(Held { lease, wrote });
    }

    /// The pause after a failed request (the stop time still applies).
    async fn wait(&mut self) {
        let delay = self.backoff.next_delay();
        self.term.guard(sleep(delay)).await;
    }

    /// Lets the Lease go, if the record still names this candidate: the
    /// next candidate takes it at once, without waiting for it to expire.
    async fn release(&mut self) {
        self.term.stop_at = None;
        let Some(held) = self.held.take() else {
            return;
        };
        let spec = LeaseSpec {
            holder_identity: None,
            ..held.lease.spec.clone().unwrap_or_default()
        };
        if let Err(e) = bounded("write", self.store.write(held.version(), &spec)).await {
            // It expires by itself.
            tracing::info!(error = %e, "the Lease was not released");
        }
    }
}

/// `work`, failing after [`MAX_REQUEST`].
async fn bounded<T>(action: &'static str, work: impl Future<Output = Result<T, LeaseError>>) -> Result<T, LeaseError> {
    timeout(MAX_REQUEST, work)
        .await
        .unwrap_or(Err(LeaseError::TimedOut { action }))
}

fn duration_s(timing: &Timing) -> i32 {
    i32::try_from(timing.duration.as_secs()).unwrap_or(i32::MAX)
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex, PoisonError};

    use super::*;

    /// A Lease record in memory that can be made unreachable.
    #[derive(Clone, Default)]
    struct Memory(Arc<Mutex<Record>>);

    #[derive(Default)]
    struct Record {
        lease: Option<Lease>,
        version: u64,
        unreachable: bool,
        /// When each successful write (or create) arrived.
        writes: Vec<Instant>,
    }

    impl Memory {
        fn record(&self) -> std::sync::MutexGuard<'_, Record> {
            self.0.lock().unwrap_or_else(PoisonError::into_inner)
        }

        fn holder(&self) -> Option<String> {
            self.record().lease.as_ref()?.spec.as_ref()?.holder_identity.clone()
        }

        /// Another candidate writes the record.
        fn taken_by(&self, holder: &str) {
            let mut record = self.record();
            record.version += 1;
            let version = record.version.to_string();
            if let Some(lease) = &mut record.lease {
                lease.metadata.resource_version = Some(version);
                if let Some(spec) = &mut lease.spec {
                    spec.holder_identity = Some(holder.to_owned());
                    spec.renew_time = Some(MicroTime(Timestamp::now()));
                }
            }
        }

        fn put(record: &mut Record, spec: LeaseSpec) -> Result<Lease, LeaseError> {
            if record.unreachable {
                return Err(LeaseError::Request {
                    action: "write",
                    lease: "test/lease".to_owned(),
                    source: kube::Error::Service("connection refused".into()),
                });
            }
            record.version += 1;
            record.writes.push(Instant::now());
            let lease = Lease {
                metadata: ObjectMeta {
                    resource_version: Some(record.version.to_string()),
                    ..ObjectMeta::default()
                },
                spec: Some(spec),
            };
            record.lease = Some(lease.clone());
            Ok(lease)
        }
    }

    impl LeaseStore for Memory {
        async fn read(&self) -> Result<Option<Lease>, LeaseError> {
            let record = self.record();
            if record.unreachable {
                return Err(LeaseError::TimedOut { action: "read" });
            }
            Ok(record.lease.clone())
        }

        async fn create(&self, spec: LeaseSpec) -> Result<Lease, LeaseError> {
            let mut record = self.record();
            if record.lease.is_some() {
                return Err(LeaseError::Changed { lease: String::new() });
            }
            Self::put(&mut record, spec)
        }

        async fn write(&self, version: &str, spec: &LeaseSpec) -> Result<Lease, LeaseError> {
            let mut record = self.record();
            if !record.unreachable && record.version.to_string() != version {
                return Err(LeaseError::Changed { lease: String::new() });
            }
            Self::put(&mut record, spec.clone())
        }
    }

    /// Duration 2 s, grace 1 s: renewed 1 s after each write, leading
    /// stops 1.5 s after it unless a renewal got through.
    fn settings() -> LeaseSettings {
        LeaseSettings {
            namespace: "test".to_owned(),
            name: "lease".to_owned(),
            identity: "me".to_owned(),
            duration_s: 2,
            grace_s: 1,
        }
    }

    async fn until(leading: &mut watch::Receiver<bool>, wanted: bool) -> Instant {
        tokio::time::timeout(Duration::from_secs(10), leading.wait_for(|l| *l == wanted))
            .await
            .expect("in time")
            .expect("the election runs");
        Instant::now()
    }

    #[tokio::test]
    async fn a_leader_that_cannot_renew_stops_before_its_lease_expires_and_leads_again_once_it_renews() {
        let store = Memory::default();
        let mut election = campaign(store.clone(), &settings());
        until(&mut election.leading, true).await;
        assert_eq!(store.holder().as_deref(), Some("me"));
        assert_eq!(*election.took_over.borrow(), None, "a fresh Lease has no predecessor");
        // Renewals keep it leading.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        assert!(*election.leading.borrow());
        let last_write = {
            let mut record = store.record();
            record.unreachable = true;
            *record.writes.last().expect("written")
        };
        let stopped = until(&mut election.leading, false).await;
        let expiry = last_write + Duration::from_secs(2);
        assert!(
            stopped < expiry,
            "stopped {:?} after the last write",
            stopped - last_write
        );
        assert!(
            stopped >= last_write + Duration::from_secs(1),
            "stopped before the renewal was even due"
        );
        // The record is still ours: the first renewal that gets through
        // leads again, with no predecessor to wait for.
        store.record().unreachable = false;
        until(&mut election.leading, true).await;
        assert_eq!(*election.took_over.borrow(), None);
        // Dropping the election releases the Lease for the next leader.
        drop(election.leading);
        election.task.await.expect("the candidate ends");
        assert_eq!(store.holder(), None);
    }

    #[tokio::test]
    async fn a_leader_whose_lease_another_wrote_stops_at_its_next_renewal_and_waits_for_the_holder() {
        let store = Memory::default();
        let mut election = campaign(store.clone(), &settings());
        until(&mut election.leading, true).await;
        store.taken_by("other");
        let taken = Instant::now();
        let stopped = until(&mut election.leading, false).await;
        assert!(stopped - taken < Duration::from_millis(1500), "{:?}", stopped - taken);
        // It looks again and takes the Lease once `other` has left it
        // unrenewed for its duration, naming it as the predecessor.
        let retaken = until(&mut election.leading, true).await;
        assert!(retaken - taken >= Duration::from_secs(2), "{:?}", retaken - taken);
        let predecessor = election.took_over.borrow().clone().expect("a predecessor");
        assert_eq!(predecessor.holder, "other");
        assert!(predecessor.acting_until <= retaken);
    }
}
