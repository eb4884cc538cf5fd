//! A virtual-clock harness for the AutoManager core: Manager's side is
//! played by the test (events built here, RPC results answered by hand), the
//! clock only moves when the test says so, and every action the core emits
//! is kept for assertions.

pub mod migration;
pub mod runtime;
pub mod scenario;

use std::collections::BTreeMap;

use norsk_auto_manager::automanager::{
    Action, Answer, AutoManagerCore, AutoSettings, Command, CommandError, CommandId, Input, Notification, RequestId,
    Rpc, RpcFailure, RpcFailureKind, validate_auto_settings,
};
use norsk_auto_manager::model::{
    Bundle, BundleId, BundleJobRef, BundleSpec, InstanceKey, JobHistoryEntry, JobId, JobState, JobStopReason,
    ManagerEvent, NodeId, NodeInfo, NodeInventory, NodeStopReason, ProviderKind, ProviderMetadata, RuntimeJob,
    UnixMillis, runtime_job_id, tags,
};

/// Pool `production`: a fixed cluster tier `cluster`, then an elastic AWS
/// tier `aws` (m5.xlarge, 4 vCPUs), then an elastic OCI tier `oci`.
pub const POOLS: &str = "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
    - name: aws
      kind: aws
      region: eu-west-1
      provisionTimeoutMs: 600000
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]
    - name: oci
      kind: oci
      region: eu-frankfurt-1
      candidateInstanceTypes: [{instanceType: VM.Standard3.Flex, totalCapacity: 4, totalCores: 4}]
";

/// Settings over [`POOLS`] with the spec's defaults.
pub fn settings() -> AutoSettings {
    AutoSettings {
        url: "manager.test:6789".into(),
        placement_pools: yaml_serde::from_str(POOLS).expect("pools parse"),
        trace_placements: false,
        ..Default::default()
    }
}

/// The core under test, with its clock and everything it emitted.
pub struct Harness {
    pub core: AutoManagerCore,
    pub now: UnixMillis,
    /// Every action emitted and not yet taken, with the time it was emitted.
    pub actions: Vec<(UnixMillis, Action)>,
    pub next_deadline: Option<UnixMillis>,
    /// Every input and action is written to stderr as it happens (a
    /// readable trace of a replayed run).
    pub trace: bool,
    next_command: u64,
}

impl Harness {
    /// A core on [`settings`], not yet hydrated, at t = 1,000,000.
    pub fn new() -> Self {
        Self::with(settings())
    }

    /// A core on `settings`.
    pub fn with(settings: AutoSettings) -> Self {
        let valid = validate_auto_settings(settings).expect("settings are valid");
        let now = 1_000_000;
        Self {
            core: AutoManagerCore::new(valid, now),
            now,
            actions: Vec::new(),
            next_deadline: None,
            trace: false,
            next_command: 0,
        }
    }

    /// A hydrated core with cluster nodes `a` and `b` (4 vCPUs each).
    pub fn hydrated() -> Self {
        let mut h = Self::new();
        h.cluster_node("a", 4.0);
        h.cluster_node("b", 4.0);
        h.event(ManagerEvent::InitialDataComplete);
        h
    }

    /// Feeds one input at the current time.
    pub fn input(&mut self, input: Input) {
        if self.trace {
            eprintln!("{} <- {}", self.now, describe_input(&input));
        }
        let step = self.core.handle(input, self.now);
        self.took(step);
    }

    /// Feeds inputs that arrived together (one step, as a snapshot is).
    pub fn input_all(&mut self, inputs: Vec<Input>) {
        if self.trace {
            for input in &inputs {
                eprintln!("{} <= {}", self.now, describe_input(input));
            }
        }
        let step = self.core.handle_all(inputs, self.now);
        self.took(step);
    }

    /// Keeps what a step emitted (traced) and when the core wakes next.
    fn took(&mut self, step: norsk_auto_manager::automanager::Step) {
        let now = self.now;
        if self.trace {
            for action in &step.actions {
                eprintln!("{now}    -> {}", describe_action(action));
            }
        }
        self.actions.extend(step.actions.into_iter().map(|a| (now, a)));
        self.next_deadline = step.next_deadline;
    }

    /// The event stream breaks and a new one opens: the core is disposed
    /// and a successor (as the runtime builds it) hydrates from Manager's
    /// snapshot — here what the core had heard: its nodes, bundles and
    /// jobs as Manager last sent them.
    pub fn reconnect(&mut self) {
        let mut events = Vec::new();
        for node in self.core.fleet().iter() {
            let info = NodeInfo {
                node_id: node.id.clone(),
                tags: node.tags.clone(),
                ..node_info(node.id.as_str(), &[])
            };
            // Manager forgets a stopped node; a stopping one is announced
            // as started, then stopping.
            use norsk_auto_manager::model::NodePhase;
            events.push(match node.phase {
                NodePhase::Stopped => continue,
                NodePhase::Running | NodePhase::Stopping => ManagerEvent::NodeStarted(info),
                NodePhase::Prospective | NodePhase::Starting => ManagerEvent::NodeStarting(info),
            });
            if let Some(inventory) = &node.inventory {
                events.push(ManagerEvent::NodeInventory {
                    node_id: node.id.clone(),
                    inventory: inventory.clone(),
                });
            }
            if node.phase == NodePhase::Stopping {
                events.push(ManagerEvent::NodeStopping {
                    node_id: node.id.clone(),
                    reason: norsk_auto_manager::model::NodeStopReason::HealthPingTimeExceeded,
                });
            }
        }
        events.extend(self.core.bundles().cloned().map(ManagerEvent::BundleUpdated));
        events.extend(self.core.jobs().map(|r| ManagerEvent::JobActive(r.job.clone())));
        events.push(ManagerEvent::InitialDataComplete);
        let valid = validate_auto_settings(self.core.settings().clone()).expect("settings are valid");
        self.core = AutoManagerCore::succeeding(valid, &self.core);
        self.input_all(events.into_iter().map(|e| Input::Event(Box::new(e))).collect());
    }

    /// Feeds one Manager event.
    pub fn event(&mut self, event: ManagerEvent) {
        self.input(Input::Event(Box::new(event)));
    }

    /// Issues a command; returns its id.
    pub fn command(&mut self, command: Command) -> CommandId {
        self.next_command += 1;
        let id = CommandId(self.next_command);
        self.input(Input::Command { id, command });
        id
    }

    /// Moves the clock by `ms`, feeding `Timer` at every deadline on the way
    /// (as the runtime does).
    pub fn advance(&mut self, ms: i64) {
        let target = self.now + ms;
        while let Some(deadline) = self.next_deadline.filter(|&d| d <= target) {
            self.now = self.now.max(deadline);
            self.input(Input::Timer);
            if self.next_deadline == Some(deadline) {
                break;
            }
        }
        self.now = target;
        self.input(Input::Timer);
    }

    /// Every RPC emitted so far (drained), in order.
    pub fn take_calls(&mut self) -> Vec<(RequestId, Rpc)> {
        let mut calls = Vec::new();
        self.actions.retain(|(_, a)| match a {
            Action::Call { id, rpc } => {
                calls.push((*id, rpc.clone()));
                false
            }
            _ => true,
        });
        calls
    }

    /// Every notification emitted so far (drained), in order.
    pub fn take_notifications(&mut self) -> Vec<Notification> {
        let mut out = Vec::new();
        self.actions.retain(|(_, a)| match a {
            Action::Notify(n) => {
                out.push(n.clone());
                false
            }
            _ => true,
        });
        out
    }

    /// Every command reply so far (drained).
    pub fn take_replies(&mut self) -> Vec<(CommandId, Result<(), CommandError>)> {
        let mut out = Vec::new();
        self.actions.retain(|(_, a)| match a {
            Action::Reply { command, result } => {
                out.push((*command, result.clone()));
                false
            }
            _ => true,
        });
        out
    }

    /// `updateHotSpareSpecs(list)` as a command; its answer, taken.
    pub fn update_hot_spare_specs(
        &mut self,
        specs: Vec<norsk_auto_manager::model::HotSpareSpec>,
    ) -> Result<norsk_auto_manager::automanager::spares::HotSpareSpecsDiff, CommandError> {
        let id = self.command(Command::UpdateHotSpareSpecs(specs));
        let answers = self.take_answers();
        let [(answered, result)] = answers.as_slice() else {
            panic!("one answer for updateHotSpareSpecs, got {answers:?}");
        };
        assert_eq!(*answered, id);
        result.clone().map(|answer| match answer {
            Answer::HotSpares(diff) => diff,
            other => panic!("updateHotSpareSpecs answered {other:?}"),
        })
    }

    /// `updateHotSpareNode` as a command; its reply, taken.
    pub fn update_hot_spare_node(
        &mut self,
        node_id: &NodeId,
        spec: norsk_auto_manager::model::SpareSpec,
    ) -> Result<(), CommandError> {
        let id = self.command(Command::UpdateHotSpareNode {
            node_id: node_id.clone(),
            spec,
        });
        let replies = self.take_replies();
        let [(replied, result)] = replies.as_slice() else {
            panic!("one reply for updateHotSpareNode, got {replies:?}");
        };
        assert_eq!(*replied, id);
        result.clone()
    }

    /// Every command answer carrying a value so far (drained).
    pub fn take_answers(&mut self) -> Vec<(CommandId, Result<Answer, CommandError>)> {
        let mut out = Vec::new();
        self.actions.retain(|(_, a)| match a {
            Action::Answer { command, result } => {
                out.push((*command, result.clone()));
                false
            }
            _ => true,
        });
        out
    }

    /// Answers an RPC with success.
    pub fn ok(&mut self, id: RequestId) {
        self.input(Input::RpcResult { id, result: Ok(()) });
    }

    /// Answers an RPC with a failure of `kind`.
    pub fn fail(&mut self, id: RequestId, kind: RpcFailureKind) {
        self.input(Input::RpcResult {
            id,
            result: Err(RpcFailure {
                kind,
                message: format!("{kind:?}"),
            }),
        });
    }

    /// Answers every outstanding call with success; returns them.
    pub fn ok_all(&mut self) -> Vec<Rpc> {
        let calls = self.take_calls();
        for (id, _) in &calls {
            self.ok(*id);
        }
        calls.into_iter().map(|(_, rpc)| rpc).collect()
    }

    /// A registered cluster node of pool `production` with `capacity` vCPUs.
    pub fn cluster_node(&mut self, id: &str, capacity: f64) {
        self.event(ManagerEvent::NodeStarted(node_info(id, &[(tags::POOL, "production")])));
        self.event(ManagerEvent::NodeInventory {
            node_id: NodeId::from(id),
            inventory: inventory(ProviderKind::LocalServers, capacity),
        });
    }

    /// Manager reports a node this core provisioned as started, with an
    /// inventory.
    pub fn provisioned_node_starts(&mut self, id: &str, kind: ProviderKind, tags: &[(&str, &str)]) {
        self.event(ManagerEvent::NodeStarting(node_info(id, tags)));
        self.event(ManagerEvent::NodeStarted(node_info(id, tags)));
        self.event(ManagerEvent::NodeInventory {
            node_id: NodeId::from(id),
            inventory: inventory(kind, 4.0),
        });
    }

    /// Stores a bundle on "Manager" and expands it into its jobs (active, or
    /// pending before a schedule's start, as Manager announces them).
    pub fn bundle(&mut self, id: &str, spec_yaml: &str) -> Bundle {
        let bundle = bundle(id, spec_yaml);
        self.event(ManagerEvent::BundleUpdated(bundle.clone()));
        for job in jobs_at(&bundle, self.now) {
            let event = if job.state == JobState::Pre {
                ManagerEvent::JobPending(job)
            } else {
                ManagerEvent::JobActive(job)
            };
            self.event(event);
        }
        bundle
    }

    /// Manager's answer to a `StartBundleJob` / `StopBundleJob` it accepted:
    /// the job's dormant flag as `dormant`.
    pub fn dormant(&mut self, job: &JobId, dormant: bool) {
        let mut runtime = self.core.job(job).expect("job known").job.clone();
        runtime.dormant = dormant;
        self.event(ManagerEvent::JobUpdated(runtime));
    }

    /// The core's record of where `job` is bound.
    pub fn bound_node(&self, job: &JobId) -> Option<NodeId> {
        self.core
            .job(job)
            .and_then(|r| r.binding.as_ref())
            .map(|b| b.node_id.clone())
    }

    /// Appends `entry` to a job's history and sends it as `JobUpdated`.
    pub fn history(&mut self, job: &JobId, entry: JobHistoryEntry) {
        let mut runtime = self.core.job(job).expect("job known").job.clone();
        runtime.history.push(entry);
        self.event(ManagerEvent::JobUpdated(runtime));
    }

    /// The instance of `job` reached running on `node`.
    pub fn running(&mut self, job: &JobId, node: &NodeId) {
        let role = self.role(job);
        self.history(
            job,
            JobHistoryEntry::Running {
                at: Some(self.now),
                role,
                node_id: Some(node.clone()),
            },
        );
    }

    /// The instance of `job` on `node` failed at runtime, as Manager reports
    /// a crash: `Stopping` (job failed), then `Stopped`.
    pub fn failed(&mut self, job: &JobId, node: &NodeId) {
        let role = self.role(job);
        self.failing(job, node);
        self.stopped(job, node, role);
    }

    /// The instance of `job` on `node` failed at runtime and Manager is
    /// stopping it (`Stopping`, job failed; no `Stopped` yet).
    pub fn failing(&mut self, job: &JobId, node: &NodeId) {
        let role = self.role(job);
        self.history(
            job,
            JobHistoryEntry::Stopping {
                at: Some(self.now),
                role,
                node_id: Some(node.clone()),
                reason: JobStopReason::JobFailed,
            },
        );
    }

    /// The instance `role` of `job` on `node` has stopped.
    pub fn stopped(&mut self, job: &JobId, node: &NodeId, role: InstanceKey) {
        self.history(
            job,
            JobHistoryEntry::Stopped {
                at: Some(self.now),
                role,
                node_id: Some(node.clone()),
            },
        );
    }

    /// Starts every pending `StartJob` successfully and reports each
    /// instance running; returns (job, node) per start.
    pub fn start_all(&mut self) -> Vec<(JobId, NodeId)> {
        let mut started = Vec::new();
        for (id, rpc) in self.take_calls() {
            self.ok(id);
            if let Rpc::StartJob { job_id, node_id, .. } = rpc {
                started.push((job_id, node_id));
            }
        }
        for (job, node) in &started {
            self.running(job, node);
        }
        started
    }

    fn role(&self, job: &JobId) -> InstanceKey {
        self.core
            .job(job)
            .and_then(|r| r.binding.as_ref())
            .map(|b| b.instance_key.clone())
            .unwrap_or_else(|| InstanceKey("primary".into()))
    }

    /// The node stops with `reason`.
    pub fn node_stopping(&mut self, id: &str, reason: NodeStopReason) {
        self.event(ManagerEvent::NodeStopping {
            node_id: NodeId::from(id),
            reason,
        });
    }
}

impl Default for Harness {
    fn default() -> Self {
        Self::new()
    }
}

/// Node metadata with tags.
pub fn node_info(id: &str, node_tags: &[(&str, &str)]) -> NodeInfo {
    NodeInfo {
        node_id: NodeId::from(id),
        tags: node_tags
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect(),
        created_at: None,
        provider: ProviderMetadata::Unknown,
    }
}

/// An inventory of `capacity` vCPUs (and as many cores).
pub fn inventory(kind: ProviderKind, capacity: f64) -> NodeInventory {
    NodeInventory {
        kind,
        region: String::new(),
        az: "az1".into(),
        instance_type: String::new(),
        total_capacity: capacity,
        total_cores: capacity as u32,
        utilization_cap: 1.0,
        reserved_capacity: 0.0,
        capabilities: vec![],
        gpus: vec![],
        images: vec![],
        nics: vec![],
    }
}

/// A bundle from YAML.
pub fn bundle(id: &str, spec_yaml: &str) -> Bundle {
    let spec: BundleSpec = yaml_serde::from_str(spec_yaml).expect("bundle parses");
    Bundle {
        bundle_id: BundleId::from(id),
        spec,
        state: Default::default(),
        terminal_verdict: None,
        generation: 1,
    }
}

/// The runtime jobs Manager expands a bundle into (one per replica and
/// job), active unless the job is `startMode: manual`.
pub fn jobs_of(bundle: &Bundle) -> Vec<RuntimeJob> {
    let mut jobs = Vec::new();
    for replica_index in 0..bundle.spec.replica_count() {
        for spec in &bundle.spec.jobs {
            let mut spec = spec.clone();
            spec.parameters = bundle.spec.parameters_for(replica_index, &spec);
            jobs.push(RuntimeJob {
                job_id: runtime_job_id(&bundle.bundle_id, replica_index, &spec.job_name),
                state: JobState::Active,
                tags: BTreeMap::new(),
                start_date_time: None,
                bundle_ref: Some(BundleJobRef {
                    bundle_id: bundle.bundle_id.clone(),
                    replica_index,
                    job_name: spec.job_name.clone(),
                }),
                dormant: spec.start_mode == norsk_auto_manager::model::StartMode::Manual,
                spec,
                context: None,
                terminal_verdict: None,
                history: vec![JobHistoryEntry::Created { at: None }],
            });
        }
    }
    jobs
}

/// What Manager expands a bundle into at `now`: [`jobs_of`], each job
/// dated with the schedule's start and `Pre` before it.
pub fn jobs_at(bundle: &Bundle, now: UnixMillis) -> Vec<RuntimeJob> {
    let start = bundle.spec.schedule.map(|s| s.start.millis());
    jobs_of(bundle)
        .into_iter()
        .map(|mut job| {
            job.start_date_time = start;
            if start.is_some_and(|start| start > now) {
                job.state = JobState::Pre;
            }
            job
        })
        .collect()
}

/// An RFC 3339 instant `ms` after the Unix epoch, for bundle YAML.
pub fn rfc3339(ms: UnixMillis) -> String {
    norsk_auto_manager::model::DateTime::from_millis(ms).to_string()
}

/// `<bundle>/<replica>/<job>`.
pub fn job_id(bundle: &str, replica: u32, job: &str) -> JobId {
    runtime_job_id(&BundleId::from(bundle), replica, job)
}

/// The kind names of notifications, for compact assertions.
pub fn kinds(notifications: &[Notification]) -> Vec<String> {
    notifications
        .iter()
        .map(|n| {
            serde_json::to_value(n).expect("notifications serialise")["kind"]
                .as_str()
                .unwrap_or_default()
                .to_owned()
        })
        .collect()
}

/// An input in one line: a job change by its newest history entry, an RPC
/// answer by its request id, the rest as they debug-print.
pub fn describe_input(input: &Input) -> String {
    match input {
        Input::Event(event) => match event.as_ref() {
            ManagerEvent::JobActive(job)
            | ManagerEvent::JobPending(job)
            | ManagerEvent::JobUpdated(job)
            | ManagerEvent::JobOutOfWindow(job) => {
                format!("job {} {:?}: {:?}", job.job_id, job.state, job.history.last())
            }
            ManagerEvent::BundleUpdated(bundle) => {
                format!("bundle {} updated, generation {}", bundle.bundle_id, bundle.generation)
            }
            event => format!("{event:?}"),
        },
        Input::RpcResult { id, result: Ok(()) } => format!("answer {}: ok", id.0),
        Input::RpcResult { id, result: Err(e) } => format!("answer {}: {:?} {}", id.0, e.kind, e.message),
        Input::Command { command, .. } => format!("command {command:?}"),
        other => format!("{other:?}"),
    }
}

/// An action in one line (long notifications cut short).
pub fn describe_action(action: &Action) -> String {
    let text = match action {
        Action::Call { id, rpc } => match rpc {
            Rpc::CreateBundle(b) | Rpc::UpdateBundle(b) => format!("call {}: bundle {}", id.0, b.bundle_id),
            rpc => format!("call {}: {rpc:?}", id.0),
        },
        Action::Notify(Notification::JobUpdated { job }) => format!("notify jobUpdated {}", job.job_id),
        Action::Notify(Notification::BundleUpdated { bundle }) => format!("notify bundleUpdated {}", bundle.bundle_id),
        // Why a placement found nowhere, in full.
        Action::Notify(Notification::PlacementFailed { job_id, reason }) => {
            return format!("notify placementFailed {job_id}: {reason}");
        }
        Action::Notify(Notification::PlacementDecision(info)) => {
            let why = match (&info.decision, &info.trace) {
                // Every node's verdict but the stopped ones'.
                (norsk_auto_manager::automanager::Decision::NoCapacityInAnyPool, Some(trace)) => trace
                    .tiers
                    .iter()
                    .flat_map(|t| &t.nodes)
                    .map(|n| format!("{}: {:?}", n.node_id, n.verdict))
                    .filter(|v| !v.contains("Stopped"))
                    .collect::<Vec<_>>()
                    .join("; "),
                _ => String::new(),
            };
            return format!(
                "notify placementDecision {}: {:?} (recovery {}) {why}",
                info.job_id, info.decision, info.recovery
            );
        }
        Action::Notify(Notification::MigrationPhase(m)) => format!(
            "notify migrationPhase {} of {}: {:?} ({} {} -> {} {})",
            m.migration_id, m.job_id, m.phase, m.source_node_id, m.source_key, m.target_node_id, m.target_key
        ),
        other => format!("{other:?}"),
    };
    match text.char_indices().nth(400) {
        Some((cut, _)) => format!("{}...", &text[..cut]),
        None => text,
    }
}
