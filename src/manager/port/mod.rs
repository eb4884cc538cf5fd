//! The Manager port: how each thing the core asks of Manager is carried out
//! on the Manager at hand. The published Norsk Manager API (1.0.384) is the
//! floor; every addition in `proto/` is optional. On each connection the
//! port asks Manager which additions it serves ([`Capability::probe`]), and
//! [`Port::mode`] is the one place that decides, per capability, which way
//! a thing is done: with the addition, or with the published API and what
//! the operator keeps itself ([`bundles`], [`nodes`], the deferred starts
//! below). An addition answered `UNIMPLEMENTED` later (a Manager downgraded
//! under a live connection) moves its capability to the published way and
//! the call is carried out that way at once.
//!
//! Whatever way is taken, the core reads the same events: what the port
//! does for Manager is told as the events Manager's addition would have
//! sent, through the stream session (`super::stream`), before Manager's own
//! events that follow from it, and every Manager event passes through
//! [`Port::incoming`] so that what the port keeps is added to it. The
//! core's policy is one; only the port's way of carrying it out differs.

pub mod bundles;
pub mod nodes;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::{mpsc, watch};

use super::client::{CreateNode, ManagerClient, RpcError, StartJob};
use super::proto::common;
use super::proto::manager::{self as pb, event_stream_event::Event};
use super::wire;
pub use crate::model::manager::{Capabilities, Capability, KeptTags, Mode};
use crate::model::{Bundle, BundleId, BundleJobRef, InstanceKey, JobId, NodeId, TerminalVerdict, UnixMillis};
use bundles::{BundleStore, Call, Plan, Refusal};
use nodes::NodeTags;

/// Events the port tells in Manager's place, for the stream session.
pub type Told = mpsc::UnboundedReceiver<pb::EventStreamEvent>;

/// What the port keeps for a Manager without the additions.
#[derive(Debug, Default)]
struct Kept {
    bundles: BundleStore,
    nodes: NodeTags,
    /// Deferred starts not yet made, by (job, instance key): a Manager
    /// without deferred start is asked to start them, as they were asked
    /// for, only at `StartPreparedJob`.
    prepared: BTreeMap<(String, String), StartJob>,
}

/// The port. Cheap to clone; clones share what is kept.
#[derive(Clone)]
pub struct Port {
    client: ManagerClient,
    kept: Arc<Mutex<Kept>>,
    capabilities: Arc<watch::Sender<Capabilities>>,
    /// The node tag changes kept here, for the `NorskNode`s' status.
    kept_tags: Arc<watch::Sender<BTreeMap<NodeId, KeptTags>>>,
    tell: mpsc::UnboundedSender<pb::EventStreamEvent>,
}

impl Port {
    /// A port on `client`, and what it tells for the stream session to
    /// deliver. Until Manager has been asked every capability is taken as
    /// served: an addition answered `UNIMPLEMENTED` corrects that, a
    /// published way taken wrongly would not.
    pub fn new(client: ManagerClient) -> (Self, Told) {
        let (tell, told) = mpsc::unbounded_channel();
        let (capabilities, _) = watch::channel(Capabilities::all_served());
        let (kept_tags, _) = watch::channel(BTreeMap::new());
        let port = Self {
            client,
            kept: Arc::default(),
            capabilities: Arc::new(capabilities),
            kept_tags: Arc::new(kept_tags),
            tell,
        };
        (port, told)
    }

    /// The client under the port, for the published calls that need no
    /// decision.
    pub fn client(&self) -> &ManagerClient {
        &self.client
    }

    /// How `capability` is carried out now.
    pub fn mode(&self, capability: Capability) -> Mode {
        self.capabilities.borrow().mode(capability)
    }

    /// Follows the mode of every capability.
    pub fn capabilities(&self) -> watch::Receiver<Capabilities> {
        self.capabilities.subscribe()
    }

    /// Follows the node tag changes the port keeps for a Manager that
    /// cannot store them.
    pub fn kept_tags(&self) -> watch::Receiver<BTreeMap<NodeId, KeptTags>> {
        self.kept_tags.subscribe()
    }

    /// Node tag changes a predecessor kept, read back from the resources
    /// it recorded them in: shown on their nodes as this port's own. Taken
    /// whatever Manager is found to serve (a standby may read them before
    /// it has asked): on a Manager that stores tags they are written to it
    /// on the next connection, as a predecessor's changes would be after
    /// an upgrade.
    pub fn keep_node_tags(&self, kept: BTreeMap<NodeId, KeptTags>) {
        let told = {
            let mut kept_here = self.kept();
            let told = kept_here.nodes.keep(kept);
            self.publish_kept_tags(&kept_here);
            told
        };
        self.tell(told);
    }

    fn publish_kept_tags(&self, kept: &Kept) {
        let now = kept.nodes.kept();
        self.kept_tags.send_if_modified(|shown| {
            let changed = *shown != now;
            *shown = now;
            changed
        });
    }

    fn kept(&self) -> MutexGuard<'_, Kept> {
        // Nothing panics while holding the lock; a poisoned lock still
        // holds consistent state.
        self.kept.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_mode(&self, capability: Capability, mode: Mode) {
        self.capabilities.send_if_modified(|c| c.set(capability, mode));
    }

    /// Asks Manager which additions it serves (each connection, before its
    /// stream opens). Every capability must be answered: an addition that
    /// is only a field (a deferred start's flag) would be dropped without a
    /// word by a published Manager, so a connection whose probes Manager
    /// could not all answer (it is still starting, or went away) is not
    /// opened; the stream session retries it. What was answered is kept.
    pub async fn probe(&self) -> Result<(), RpcError> {
        let mut unanswered = None;
        for capability in Capability::ALL {
            match self.client.probe(capability.probe()).await {
                Ok(served) => self.set_mode(capability, if served { Mode::Served } else { Mode::Published }),
                Err(e) => {
                    tracing::debug!(%capability, error = %e, "could not ask Manager about a capability");
                    unanswered.get_or_insert(e);
                }
            }
        }
        if let Some(e) = unanswered {
            return Err(e);
        }
        tracing::info!(
            manager = self.client.url(),
            capabilities = %self.capabilities.borrow().summary(),
            "Manager capabilities"
        );
        if self.mode(Capability::BundleStore) == Mode::Published {
            self.kept().bundles.manager_forgot();
        } else {
            self.hand_over().await?;
        }
        if self.mode(Capability::NodeTags) == Mode::Served {
            self.hand_over_tags().await?;
        }
        Ok(())
    }

    /// Manager stores node tags now: the changes kept here are written to
    /// it, and no longer kept (a change whose write fails stays kept, and
    /// is written on the next connection).
    async fn hand_over_tags(&self) -> Result<(), RpcError> {
        let kept = self.kept().nodes.kept();
        let mut result = Ok(());
        for (node_id, tags) in kept {
            let removed: Vec<String> = tags.removed.iter().cloned().collect();
            match self.client.update_node_tags(&node_id, &tags.set, &removed).await {
                // A node gone meanwhile has nothing left to tag.
                Ok(()) => {}
                Err(e) if e.code == tonic::Code::NotFound => {}
                Err(e) => {
                    result = Err(e);
                    continue;
                }
            }
            let mut kept_here = self.kept();
            kept_here.nodes.forget(&node_id);
            self.publish_kept_tags(&kept_here);
        }
        result
    }

    /// Manager has a bundle store now (it was upgraded under a running
    /// operator): the bundles the operator stored are created in it —
    /// Manager adopts the jobs they run as, where they run — with the
    /// verdicts, started manual jobs and dropped jobs kept for them, and a
    /// deletion under way is finished by Manager's store. Done
    /// before the stream opens, so its snapshot tells them as Manager's.
    /// Every call is idempotent: a hand-over cut short is made again on the
    /// next connection.
    async fn hand_over(&self) -> Result<(), RpcError> {
        let pending = self.kept().bundles.to_hand_over();
        let verdicts = self.mode(Capability::TerminalVerdicts) == Mode::Served;
        for handover in pending {
            let bundle_id = handover.bundle.bundle_id.clone();
            self.client.create_bundle(&handover.bundle).await?;
            if handover.deleting {
                self.client.delete_bundle(&bundle_id).await?;
                self.kept().bundles.handed_over(&bundle_id.0);
                continue;
            }
            for job in &handover.started {
                self.client.start_bundle_job(job).await?;
            }
            if verdicts {
                if let Some(verdict) = &handover.verdict {
                    self.client.set_terminal_verdict(&bundle_id, None, verdict, 0).await?;
                }
                for (job, verdict) in &handover.dropped {
                    self.client
                        .set_terminal_verdict(&bundle_id, Some(job), verdict, 0)
                        .await?;
                }
            }
            tracing::info!(bundle = %bundle_id, "bundle handed to Manager's bundle store");
            self.kept().bundles.handed_over(&bundle_id.0);
        }
        Ok(())
    }

    /// A new stream is opening: Manager's snapshot tells every job again.
    pub fn reconnecting(&self) {
        self.kept().bundles.reconnecting();
    }

    /// A Manager event, with what the port keeps added: a job of a bundle
    /// the port stores gains its spec, a node the tags asked for; a job
    /// of a bundle not stored yet is kept back (nothing is returned).
    pub fn incoming(&self, event: pb::EventStreamEvent) -> Vec<pb::EventStreamEvent> {
        let Some(mut event) = event.event else {
            return vec![event];
        };
        let mut kept = self.kept();
        if !self.capabilities.borrow().serves(Capability::NodeTags) && kept.nodes.seen(&mut event) {
            self.publish_kept_tags(&kept);
        }
        let events = if self.capabilities.borrow().serves(Capability::BundleStore) {
            kept.bundles.mirror(&event);
            vec![event]
        } else {
            kept.bundles.seen(event)
        };
        events
            .into_iter()
            .map(|e| pb::EventStreamEvent { event: Some(e) })
            .collect()
    }

    /// What a new stream's snapshot lacks: the bundles the port stores,
    /// told before their jobs.
    pub fn snapshot(&self) -> Vec<pb::EventStreamEvent> {
        if self.capabilities.borrow().serves(Capability::BundleStore) {
            return Vec::new();
        }
        self.kept().bundles.snapshot()
    }

    fn tell(&self, events: impl IntoIterator<Item = pb::EventStreamEvent>) {
        for event in events {
            // The session may have closed: nobody listens any more.
            let _ = self.tell.send(event);
        }
    }

    /// Carries out a plan of the bundle store: its events told first, then
    /// its calls in order (the first failure ends it).
    async fn carry_out(&self, rpc: &'static str, plan: Result<Plan, Refusal>) -> Result<(), RpcError> {
        let plan = plan.map_err(|refusal| RpcError {
            rpc,
            code: refusal.code(),
            message: refusal.to_string(),
        })?;
        self.tell(plan.events);
        for call in plan.calls {
            match call {
                Call::Create(job) => match self.client.create_job_as(job.clone()).await {
                    // A Manager that stores the job already (a call whose
                    // answer was lost) holds it as written.
                    Err(e) if e.code == tonic::Code::AlreadyExists => self.client.update_job(job).await?,
                    other => other?,
                },
                Call::Update(job) => self.client.update_job(job).await?,
                Call::Stop { job_id, role, node_id } => {
                    let stopped = self
                        .client
                        .stop_job(&JobId(job_id), &InstanceKey(role), &NodeId(node_id))
                        .await;
                    match stopped {
                        Err(e) if e.code == tonic::Code::NotFound => {}
                        other => other?,
                    }
                }
                Call::Delete(job_id) => match self.client.delete_job(&JobId(job_id)).await {
                    Err(e) if e.code == tonic::Code::NotFound => {}
                    other => other?,
                },
            }
        }
        Ok(())
    }

    /// Runs `served` when Manager serves `capability`; when it does not, or
    /// answers the addition `UNIMPLEMENTED`, runs `published` instead.
    async fn either<S, P>(&self, capability: Capability, served: S, published: P) -> Result<(), RpcError>
    where
        S: std::future::Future<Output = Result<(), RpcError>>,
        P: std::future::Future<Output = Result<(), RpcError>>,
    {
        if self.mode(capability) == Mode::Served {
            match served.await {
                Err(e) if e.is_missing_extension() => {
                    tracing::warn!(%capability, rpc = e.rpc, "Manager no longer serves {}: carried out with the published API", e.rpc);
                    self.set_mode(capability, Mode::Published);
                }
                other => return other,
            }
        }
        published.await
    }

    /// `CreateBundle`, or the operator's own expansion into Manager jobs.
    pub async fn create_bundle(&self, bundle: &Bundle, now: UnixMillis) -> Result<(), RpcError> {
        self.either(
            Capability::BundleStore,
            async { self.client.create_bundle(bundle).await.map(drop) },
            async {
                let plan = self.kept().bundles.create(bundle, now);
                self.carry_out("CreateBundle", plan).await
            },
        )
        .await
    }

    /// `UpdateBundle`, or the jobs brought to the new revision.
    pub async fn update_bundle(&self, bundle: &Bundle, now: UnixMillis) -> Result<(), RpcError> {
        self.either(
            Capability::BundleStore,
            async { self.client.update_bundle(bundle).await.map(drop) },
            async {
                let plan = self.kept().bundles.update(bundle, now);
                self.carry_out("UpdateBundle", plan).await
            },
        )
        .await
    }

    /// `DeleteBundle`, or the jobs stopped and deleted.
    pub async fn delete_bundle(&self, bundle_id: &BundleId) -> Result<(), RpcError> {
        self.either(Capability::BundleStore, self.client.delete_bundle(bundle_id), async {
            let plan = self.kept().bundles.delete(&bundle_id.0);
            self.carry_out("DeleteBundle", plan).await
        })
        .await
    }

    /// `StartBundleJob` / `StopBundleJob`, or the job's dormancy kept here.
    pub async fn toggle_bundle_job(&self, job: &BundleJobRef, start: bool) -> Result<(), RpcError> {
        let rpc = if start { "StartBundleJob" } else { "StopBundleJob" };
        self.either(
            Capability::BundleStore,
            async {
                if start {
                    self.client.start_bundle_job(job).await
                } else {
                    self.client.stop_bundle_job(job).await
                }
            },
            async {
                let plan = self.kept().bundles.toggle(job, start);
                self.carry_out(rpc, plan).await
            },
        )
        .await
    }

    /// `SetTerminalVerdict`, or the verdict kept here.
    pub async fn set_terminal_verdict(
        &self,
        bundle_id: &BundleId,
        job_id: Option<&JobId>,
        verdict: &TerminalVerdict,
        generation: u64,
    ) -> Result<(), RpcError> {
        // Bundles the port stores have their verdicts kept with them.
        let capability = if self.mode(Capability::BundleStore) == Mode::Published {
            Capability::BundleStore
        } else {
            Capability::TerminalVerdicts
        };
        self.either(
            capability,
            self.client.set_terminal_verdict(bundle_id, job_id, verdict, generation),
            async {
                let plan = self.kept().bundles.verdict(&bundle_id.0, job_id, verdict, generation);
                self.carry_out("SetTerminalVerdict", plan).await
            },
        )
        .await
    }

    /// `UpdateNodeTags`, or the change kept here and told as
    /// `node_tags_updated`.
    pub async fn update_node_tags(
        &self,
        node_id: &NodeId,
        set: &BTreeMap<String, String>,
        remove: &[String],
    ) -> Result<(), RpcError> {
        self.either(
            Capability::NodeTags,
            self.client.update_node_tags(node_id, set, remove),
            async {
                let told = {
                    let mut kept = self.kept();
                    let told = kept.nodes.update(&node_id.0, set, remove);
                    self.publish_kept_tags(&kept);
                    told
                };
                match told {
                    Some(event) => {
                        self.tell([event]);
                        Ok(())
                    }
                    None => Err(RpcError {
                        rpc: "UpdateNodeTags",
                        code: tonic::Code::NotFound,
                        message: format!("node {node_id} is not known"),
                    }),
                }
            },
        )
        .await
    }

    /// `PrefetchImages`; without it nothing is pulled and the request is
    /// settled as it is (a spare is warm with what it holds).
    pub async fn prefetch_images(&self, node_id: &NodeId, images: &[String]) -> Result<(), RpcError> {
        self.either(
            Capability::ImagePrefetch,
            self.client.prefetch_images(node_id, images),
            async { Ok(()) },
        )
        .await
    }

    /// `StartJob`. A deferred start on a Manager without deferred start is
    /// kept here and told prepared at once; `StartPreparedJob` starts it.
    pub async fn start_job(&self, start: &StartJob) -> Result<(), RpcError> {
        if !start.defer_start {
            return self.client.start_job(start).await;
        }
        self.either(Capability::DeferredStart, self.client.start_job(start), async {
            let deferred = StartJob {
                defer_start: false,
                ..start.clone()
            };
            self.kept()
                .prepared
                .insert((start.job_id.0.clone(), start.instance_key.0.clone()), deferred);
            self.tell([prepared(&start.job_id, &start.instance_key, &start.node_id)]);
            Ok(())
        })
        .await
    }

    /// `StartPreparedJob`, or the kept deferred start made now.
    pub async fn start_prepared_job(
        &self,
        job_id: &JobId,
        key: &InstanceKey,
        node_id: &NodeId,
    ) -> Result<(), RpcError> {
        // A start kept here is made here, whatever Manager serves now (it
        // gained deferred start since, and never prepared this one).
        let kept = self.kept().prepared.remove(&(job_id.0.clone(), key.0.clone()));
        if let Some(start) = kept.clone().filter(|s| &s.node_id == node_id) {
            return self.client.start_job(&start).await;
        }
        self.either(
            Capability::DeferredStart,
            self.client.start_prepared_job(job_id, key, node_id),
            async {
                match kept {
                    Some(start) if &start.node_id == node_id => self.client.start_job(&start).await,
                    _ => Err(RpcError {
                        rpc: "StartPreparedJob",
                        code: tonic::Code::NotFound,
                        message: format!("no prepared instance {key} of job {job_id} on {node_id}"),
                    }),
                }
            },
        )
        .await
    }

    /// `StopJob`. A deferred start kept here and not made yet is simply
    /// forgotten: nothing runs.
    pub async fn stop_job(&self, job_id: &JobId, key: &InstanceKey, node_id: &NodeId) -> Result<(), RpcError> {
        let kept = self.kept().prepared.remove(&(job_id.0.clone(), key.0.clone()));
        if kept.is_some() {
            return Ok(());
        }
        self.client.stop_job(job_id, key, node_id).await
    }

    /// `SendMigrationSignal` (no published stand-in: the core runs a
    /// handover as overlap when Manager lacks it).
    pub async fn send_migration_signal(&self, signal: pb::MigrationSignalRequest) -> Result<(), RpcError> {
        let result = self.client.send_migration_signal(signal).await;
        if matches!(&result, Err(e) if e.is_missing_extension()) {
            self.set_mode(Capability::MigrationSignals, Mode::Published);
        }
        result
    }

    /// `CreateAwsNode` / `CreateOciNode` (published).
    pub async fn create_node(&self, oci: bool, node: &CreateNode) -> Result<(), RpcError> {
        if oci {
            self.client.create_oci_node(node).await
        } else {
            self.client.create_aws_node(node).await
        }
    }
}

fn prepared(job_id: &JobId, key: &InstanceKey, node_id: &NodeId) -> pb::EventStreamEvent {
    pb::EventStreamEvent {
        event: Some(Event::JobPrepared(pb::JobPrepared {
            job_key: Some(common::ActiveJobKey {
                job_id: Some(wire::job_id_to_pb(job_id)),
                role: key.0.clone(),
            }),
            node_id: Some(wire::node_id_to_pb(node_id)),
        })),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::extensions::is_published;

    #[test]
    fn the_compatibility_doc_names_every_capability() {
        let doc = include_str!("../../../docs/manager-compatibility.md");
        for c in Capability::ALL {
            assert!(
                doc.contains(&format!("| `{c}` |")),
                "docs/manager-compatibility.md lacks {c}"
            );
        }
    }

    #[test]
    fn every_addition_rpc_belongs_to_one_capability_and_no_published_rpc_does() {
        let published = include_str!("../../../proto/published-api.txt");
        let proto = include_str!("../../../proto/norsk/api/manager.proto");
        let rpcs: Vec<&str> = proto
            .lines()
            .filter_map(|l| l.trim().strip_prefix("rpc "))
            .filter_map(|l| l.split('(').next())
            .collect();
        assert!(rpcs.len() > 13, "the service's RPCs are read");
        for rpc in rpcs {
            let addition = !is_published(rpc);
            assert_eq!(Capability::of_rpc(rpc).is_some(), addition, "{rpc}");
        }
        assert!(published.contains("rpc norsk.api.manager.Manager.CreateJob "));
        for c in Capability::ALL {
            assert_eq!(Capability::of_rpc(c.probe()), Some(c), "{c} is probed with its own RPC");
        }
    }
}
