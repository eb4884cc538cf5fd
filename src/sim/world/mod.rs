//! The simulated Manager's state and every rule that changes it: nodes and
//! their lifecycle, the job store and job instances, bundles and their
//! expansion, what workers answer, and the timers that make things happen
//! later. Manager's own data is kept as the protobuf messages Manager would
//! store, so what a stream replays is exactly what was stored.
//!
//! Everything here is synchronous and runs under one lock (held by the
//! server); nothing in this module waits, sleeps or does I/O. Randomness
//! comes from one seeded generator and every map is ordered, so a given
//! seed and request sequence produce the same fleet.

mod bundles;
mod instances;
mod jobs;
mod nodes;
mod outages;
mod replay;
mod timers;
mod workers;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::ops::RangeInclusive;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::{Notify, broadcast};

use super::catalog::Catalog;
use super::clock::SimClock;
use super::faults::RpcFaults;
use super::published::Api;
use crate::manager::proto::manager::{self as pb, event_stream_event::Event};
use crate::manager::proto::{common, sim_admin};
use crate::model::{NodePhase, ProviderKind};

pub(crate) use instances::{Instance, InstancePhase};
pub(crate) use timers::Action;

/// Simulated milliseconds a killed or dropped worker stays "running" before
/// Manager notices the missing keepalive and reports the node stopped.
pub const KEEPALIVE_TIMEOUT_MS: i64 = 30_000;
/// A spot interruption's default warning: EC2's two minutes.
pub const SPOT_INTERRUPTION_DEADLINE_MS: i64 = 120_000;

/// How long a cloud node takes from create to started ("tens of seconds").
const PROVISIONING_MS: RangeInclusive<i64> = 20_000..=60_000;
/// How long an instance takes from provisioned to running (or prepared).
const START_MS: RangeInclusive<i64> = 2_000..=6_000;
/// How long an instance takes from stopping to stopped.
const STOP_MS: RangeInclusive<i64> = 1_000..=3_000;
/// How long a terminated cloud node takes from stopping to stopped.
const TERMINATE_MS: RangeInclusive<i64> = 5_000..=15_000;
/// How long a reclaimed node takes from the provider's stop to stopped.
const RECLAIM_MS: RangeInclusive<i64> = 2_000..=5_000;
/// How long an image pull takes.
const PREFETCH_MS: RangeInclusive<i64> = 5_000..=20_000;
/// How long an instance takes to answer a handover step.
const SIGNAL_MS: RangeInclusive<i64> = 500..=2_000;
/// Audit entries kept for the admin snapshot (older ones are dropped; the
/// stream already carried them).
const AUDIT_KEPT: usize = 10_000;
/// Events a stream may fall behind before it is ended (the client then
/// reconnects and gets a fresh snapshot, so nothing is silently lost).
const LIVE_EVENT_BUFFER: usize = 65_536;

/// One node the simulated Manager knows.
#[derive(Debug, Clone)]
pub(crate) struct SimNode {
    /// Manager's metadata: id, tags, creation time, provider.
    pub metadata: common::NodeMetadata,
    /// Set once the node started.
    pub running: Option<common::RunningNodeMetadata>,
    /// What the worker advertises (set once it started).
    pub inventory: Option<pb::NodeInventory>,
    /// Starting, running or stopping (stopped nodes are forgotten).
    pub phase: NodePhase,
    /// Why it is stopping.
    pub stopping_reason: Option<pb::node_stopping::Reason>,
    /// The worker is gone but Manager has not noticed yet (keepalive).
    pub silent: bool,
    /// Who provides it.
    pub provider: ProviderKind,
    /// Region (cluster nodes: the site their inventory names).
    pub region: String,
    /// Availability zone / domain.
    pub zone: String,
    /// Instance type or shape.
    pub instance_type: String,
    /// `on-demand`, `spot`, `reserved` (cloud nodes).
    pub launch_mode: String,
    /// The root volume it was launched with (GiB, EBS type), when the
    /// request named one (an addition).
    pub root_volume: Option<(u32, String)>,
    /// The provider's pending interruption notice.
    pub interruption: Option<pb::NodeInterruptionNotice>,
}

impl SimNode {
    /// A node just asked for: starting, with nothing advertised yet.
    pub fn starting(
        metadata: common::NodeMetadata,
        provider: ProviderKind,
        region: String,
        zone: String,
        instance_type: String,
        launch_mode: String,
    ) -> Self {
        Self {
            metadata,
            running: None,
            inventory: None,
            phase: NodePhase::Starting,
            stopping_reason: None,
            silent: false,
            provider,
            region,
            zone,
            instance_type,
            launch_mode,
            root_volume: None,
            interruption: None,
        }
    }
}

/// One job of the store with its history.
#[derive(Debug, Clone)]
pub(crate) struct SimJob {
    /// The job as last created or updated.
    pub job: pb::Job,
    /// History, oldest first.
    pub history: Vec<pb::JobHistoryEntry>,
}

impl SimJob {
    /// The job and its history, as events carry it.
    pub fn with_history(&self) -> pb::JobWithHistory {
        pb::JobWithHistory {
            job: Some(self.job.clone()),
            history_entry: self.history.clone(),
        }
    }
}

/// A rejection armed by `reject-job`.
#[derive(Debug, Clone)]
pub(crate) struct ArmedRejection {
    /// The typed code.
    pub code: pb::JobRejectionCode,
    /// The worker's words.
    pub detail: String,
    /// Starts left to reject.
    pub remaining: u32,
}

/// The simulated Manager.
pub(crate) struct World {
    catalog: Catalog,
    clock: SimClock,
    /// Set while a timer fires: the simulated instant it was due, so chains
    /// of delays add up exactly in simulated time.
    firing_at: Option<i64>,
    rng: StdRng,
    /// Live events, shared between streams (each stream sends its own copy).
    events: broadcast::Sender<Arc<pb::EventStreamEvent>>,
    wake: Arc<Notify>,
    timers: timers::Timers,
    incarnations: u64,
    nodes: BTreeMap<String, SimNode>,
    jobs: BTreeMap<String, SimJob>,
    /// Keyed by (job id, instance key): a migration target and its source
    /// coexist.
    instances: BTreeMap<(String, String), Instance>,
    bundles: BTreeMap<String, pb::Bundle>,
    /// Bundles whose stop-then-delete saga is running.
    deleting: BTreeSet<String>,
    /// Jobs to delete once their last instance has stopped.
    doomed: BTreeSet<String>,
    /// (region, instance type) -> (launch limit, nodes in use).
    launches: BTreeMap<(String, String), Launches>,
    rejections: BTreeMap<String, ArmedRejection>,
    behaviours: BTreeMap<String, sim_admin::JobBehaviour>,
    audit: VecDeque<pb::AuditEntry>,
    /// The pending window (seconds) each event stream asked for, in the
    /// order they were opened.
    pending_windows: Vec<i32>,
    faults: RpcFaults,
    /// The API the Manager speaks: with the published API alone, what only
    /// an added event would tell is shown the published way, or not at all.
    api: Api,
}

/// Launch accounting for one (region, instance type).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Launches {
    /// How many nodes may run at once; `None` is unlimited.
    pub limit: Option<i64>,
    /// How many run (or are starting or stopping).
    pub in_use: i64,
}

impl World {
    /// An empty Manager over `catalog`.
    pub fn new(catalog: Catalog, seed: u64, time_scale: f64, wake: Arc<Notify>, api: Api) -> Self {
        let (events, _) = broadcast::channel(LIVE_EVENT_BUFFER);
        Self {
            catalog,
            clock: SimClock::start(time_scale),
            firing_at: None,
            rng: StdRng::seed_from_u64(seed),
            events,
            wake,
            timers: timers::Timers::default(),
            incarnations: 0,
            nodes: BTreeMap::new(),
            jobs: BTreeMap::new(),
            instances: BTreeMap::new(),
            bundles: BTreeMap::new(),
            deleting: BTreeSet::new(),
            doomed: BTreeSet::new(),
            launches: BTreeMap::new(),
            rejections: BTreeMap::new(),
            behaviours: BTreeMap::new(),
            audit: VecDeque::new(),
            pending_windows: Vec::new(),
            faults: RpcFaults::default(),
            api,
        }
    }

    /// The API this Manager speaks.
    pub fn api(&self) -> Api {
        self.api
    }

    /// A new Manager version on the same database (`SetApi`). Downgraded to
    /// the published API, what only the additions store is gone: the bundle
    /// store (with its verdicts and deletions under way) and the added
    /// fields of every stored job. Nodes, jobs and instances stay as they
    /// are. The caller ends the open streams.
    pub fn set_api(&mut self, api: Api) {
        if api == Api::Published && self.api == Api::Full {
            self.bundles.clear();
            self.deleting.clear();
            for job in self.jobs.values_mut() {
                // A message that cannot be stripped (it cannot happen for a
                // job the world stored) is kept whole.
                if let Ok(stripped) = Api::Published.carry(job.job.clone()) {
                    job.job = stripped;
                }
            }
        }
        self.api = api;
    }

    /// Simulated now, in Unix milliseconds.
    pub fn now(&self) -> i64 {
        self.firing_at.unwrap_or_else(|| self.clock.now_ms())
    }

    /// Simulated seconds per real second.
    pub fn time_scale(&self) -> f64 {
        self.clock.scale()
    }

    /// `set-time-scale`: delays from now on are divided by `scale`. The
    /// timer task must be woken to re-plan its sleep.
    pub fn set_time_scale(&mut self, scale: f64) -> Result<(), super::RequestError> {
        if !super::clock::valid_scale(scale) {
            return Err(super::RequestError::InvalidField {
                field: "time_scale",
                why: format!("{scale} is not a positive number"),
            });
        }
        self.clock.set_scale(scale);
        Ok(())
    }

    /// `rpc-fault`: sets or clears an RPC's injected fault.
    pub fn set_rpc_fault(&mut self, req: sim_admin::RpcFaultRequest) -> Result<(), super::RequestError> {
        self.faults.apply(req)
    }

    /// What a call to `rpc` suffers now (drawn from the seeded generator).
    pub fn rpc_fault(&mut self, rpc: &str) -> super::faults::Verdict {
        self.faults.decide(rpc, &mut self.rng)
    }

    /// A new receiver of live events. Taken under the same lock as the
    /// snapshot it follows, so a stream neither misses nor repeats an event.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<pb::EventStreamEvent>> {
        self.events.subscribe()
    }

    /// A seeded delay from `range` (simulated ms).
    fn delay(&mut self, range: RangeInclusive<i64>) -> i64 {
        self.rng.random_range(range)
    }

    /// Publishes a live event.
    /// Sends a raw event to the live streams without touching the world
    /// (the admin `InjectEvent`).
    pub fn inject(&self, event: pb::EventStreamEvent) {
        // No receiver is not an error: nobody is watching.
        let _ = self.events.send(Arc::new(event));
    }

    fn emit(&self, event: Event) {
        // A send only fails when no stream is open; the event is then
        // nobody's to lose (a later stream starts from the snapshot).
        let _ = self.events.send(Arc::new(pb::EventStreamEvent { event: Some(event) }));
    }

    /// Runs `action` `delay_ms` simulated milliseconds from now.
    fn schedule(&mut self, delay_ms: i64, action: Action) {
        let at = self.now().saturating_add(delay_ms.max(0));
        if self.timers.push(at, action) {
            self.wake.notify_one();
        }
    }

    /// A fresh incarnation number: a timer for an instance that was stopped
    /// and started again must not act on the new one.
    fn next_incarnation(&mut self) -> u64 {
        self.incarnations += 1;
        self.incarnations
    }

    /// Appends to Manager's audit log and streams the entry. The published
    /// API has no audit log, so a Manager serving only it keeps none.
    fn audit(&mut self, action: &str, subject: &str, details: &[(&str, String)]) {
        if self.api == Api::Published {
            return;
        }
        let entry = pb::AuditEntry {
            timestamp: Some(timestamp(self.now())),
            actor: "manager".to_owned(),
            action: action.to_owned(),
            subject: subject.to_owned(),
            details: details.iter().map(|(k, v)| ((*k).to_owned(), v.clone())).collect(),
        };
        if self.audit.len() == AUDIT_KEPT {
            self.audit.pop_front();
        }
        self.audit.push_back(entry.clone());
        self.emit(Event::AuditAppended(pb::AuditAppended { entry: Some(entry) }));
    }

    /// Streams a job's current state.
    fn emit_job_updated(&self, job_id: &str) {
        if let Some(job) = self.jobs.get(job_id) {
            self.emit(Event::JobUpdated(pb::JobUpdated {
                job_with_history: Some(job.with_history()),
            }));
        }
    }

    /// Every node.
    pub fn nodes(&self) -> &BTreeMap<String, SimNode> {
        &self.nodes
    }

    /// Every job.
    pub fn jobs(&self) -> &BTreeMap<String, SimJob> {
        &self.jobs
    }

    /// Every live instance, keyed by (job id, instance key).
    pub fn instances(&self) -> &BTreeMap<(String, String), Instance> {
        &self.instances
    }

    /// Every bundle.
    pub fn bundles(&self) -> &BTreeMap<String, pb::Bundle> {
        &self.bundles
    }

    /// Launch accounting per (region, instance type).
    pub fn launches(&self) -> &BTreeMap<(String, String), Launches> {
        &self.launches
    }

    /// An event stream was opened asking for `pending_window_s`.
    pub(crate) fn stream_opened(&mut self, pending_window_s: i32) {
        self.pending_windows.push(pending_window_s);
    }

    /// The pending window each event stream asked for, oldest first.
    pub fn pending_windows(&self) -> &[i32] {
        &self.pending_windows
    }

    /// The audit log, oldest first.
    pub fn audit_log(&self) -> impl Iterator<Item = &pb::AuditEntry> {
        self.audit.iter()
    }
}

/// A protobuf timestamp of a simulated instant.
pub(crate) fn timestamp(ms: i64) -> prost_types::Timestamp {
    prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        // In 0..1e9 by construction, so the cast cannot truncate.
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    }
}

/// A simulated instant of a protobuf timestamp.
pub(crate) fn millis(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds
        .saturating_mul(1000)
        .saturating_add(i64::from(ts.nanos) / 1_000_000)
}

/// The id inside an optional `NodeId`.
pub(crate) fn node_id_of(id: &Option<common::NodeId>) -> &str {
    id.as_ref().map(|n| n.node_id.as_str()).unwrap_or_default()
}

/// The id inside an optional `JobId`.
pub(crate) fn job_id_of(id: &Option<common::JobId>) -> &str {
    id.as_ref().map(|j| j.job_id.as_str()).unwrap_or_default()
}

/// Wraps a node id.
pub(crate) fn node_ref(id: &str) -> Option<common::NodeId> {
    Some(common::NodeId { node_id: id.to_owned() })
}

/// Wraps a job id.
pub(crate) fn job_ref(id: &str) -> Option<common::JobId> {
    Some(common::JobId { job_id: id.to_owned() })
}

/// Refuses an empty required field.
pub(crate) fn required<'a>(value: &'a str, field: &'static str) -> Result<&'a str, super::RequestError> {
    if value.is_empty() {
        Err(super::RequestError::MissingField(field))
    } else {
        Ok(value)
    }
}
