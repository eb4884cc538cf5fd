//! Manager's events fed into the AutoManager core, with the user's commands,
//! RPC results and the clock between them. The input is a script of steps
//! (one byte picks the step, the bytes after it its arguments); Manager's
//! side is played as the daemon would: a started instance reports running,
//! a provisioned node starts with the tags it was created with, a
//! terminated node stops. Any step may also be a raw wire event, decoded
//! and converted as the client does. Nothing may panic, the core must
//! never ask for a timer in the past, and its views (fleet snapshot,
//! placement view, metrics) must stay readable after every step.
#![no_main]

use std::collections::BTreeMap;
use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use norsk_auto_manager::automanager::{
    Action, Answer, AutoManagerCore, AutoSettings, Command, CommandId, DrainAfter, DrainOptions, Input,
    InterruptionNotice, MigrationId, MigrationOptions, MigrationStrategy, RequestId, Rpc, RpcFailure, RpcFailureKind,
    StrategyFor, validate_auto_settings,
};
use norsk_auto_manager::cli::documents::{Kind, Resource, decode_file};
use norsk_auto_manager::manager::proto::manager as pb;
use norsk_auto_manager::manager::wire;
use norsk_auto_manager::model::{
    Bundle, BundleJobRef, Gpu, InstanceKey, InterruptionKind, JobHistoryEntry, JobState, JobStopReason, ManagerEvent,
    MigrationSignal, NodeId, NodeInfo, NodeInventory, NodeStopReason, ProviderKind, ProviderMetadata, RejectionCode,
    RuntimeJob, StartMode, UnixMillis, runtime_job_id, tags,
};
use prost::Message;

/// The examples' pools, hot spares and bundles: what the script works on.
struct Examples {
    settings: AutoSettings,
    bundles: Vec<Bundle>,
}

fn examples() -> &'static Examples {
    static EXAMPLES: OnceLock<Examples> = OnceLock::new();
    EXAMPLES.get_or_init(|| {
        let text = [
            include_str!("../../examples/pools.yaml"),
            include_str!("../../examples/hot-spares.yaml"),
            include_str!("../../examples/bundle-channel.yaml"),
            include_str!("../../examples/bundle-gpu.yaml"),
        ]
        .join("\n---\n");
        let documents = decode_file(&text, &Kind::ALL).expect("the examples decode");
        let mut settings = AutoSettings {
            url: "manager.fuzz:6789".into(),
            trace_placements: false,
            ..Default::default()
        };
        let mut bundles = Vec::new();
        for document in documents {
            match document.resource {
                Resource::PlacementPool(pool) => settings.placement_pools.push(pool.to_model()),
                Resource::HotSparePolicy(policy) => settings.hot_spares.push(policy.spec.0),
                Resource::Bundle(bundle) => bundles.push(Bundle {
                    bundle_id: bundle.bundle_id(),
                    spec: bundle.spec.0,
                    state: Default::default(),
                    terminal_verdict: None,
                    generation: 1,
                }),
                _ => {}
            }
        }
        Examples { settings, bundles }
    })
}

/// The script's bytes; reads past the end are zeros.
struct Script<'a>(&'a [u8]);

impl Script<'_> {
    fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    fn pick(&mut self, n: usize) -> usize {
        if n == 0 { 0 } else { self.byte() as usize % n }
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }

    fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The core, its clock, and Manager's side of the conversation.
struct Driver {
    core: AutoManagerCore,
    now: UnixMillis,
    next_deadline: Option<UnixMillis>,
    /// Calls the core asked for and nobody answered yet.
    pending: Vec<(RequestId, Rpc)>,
    migrations: Vec<MigrationId>,
    next_command: u64,
    generation: u64,
}

const NODES: [&str; 6] = ["n0", "n1", "n2", "n3", "n4", "n5"];

impl Driver {
    fn input(&mut self, input: Input) {
        let step = self.core.handle(input, self.now);
        for action in step.actions {
            match action {
                Action::Call { id, rpc } => self.pending.push((id, rpc)),
                Action::Answer {
                    result: Ok(Answer::Migration(id)),
                    ..
                } => self.migrations.push(id),
                _ => {}
            }
        }
        if let Some(deadline) = step.next_deadline {
            assert!(
                deadline >= self.now,
                "a timer asked for {deadline}, before now ({})",
                self.now
            );
        }
        self.next_deadline = step.next_deadline;
    }

    fn event(&mut self, event: ManagerEvent) {
        self.input(Input::Event(Box::new(event)));
    }

    fn command(&mut self, command: Command) {
        self.next_command += 1;
        let id = CommandId(self.next_command);
        self.input(Input::Command { id, command });
    }

    /// Moves the clock, feeding `Timer` at every deadline on the way.
    fn advance(&mut self, ms: i64) {
        let target = self.now + ms;
        for _ in 0..64 {
            let Some(deadline) = self.next_deadline.filter(|&d| d <= target) else {
                break;
            };
            self.now = self.now.max(deadline);
            self.input(Input::Timer);
            if self.next_deadline == Some(deadline) {
                break;
            }
        }
        self.now = target;
        self.input(Input::Timer);
    }

    fn node(&self, s: &mut Script) -> NodeId {
        let known: Vec<NodeId> = self.core.fleet().iter().map(|n| n.id.clone()).collect();
        match s.byte() {
            b if b < 200 && !known.is_empty() => known[b as usize % known.len()].clone(),
            b => NodeId::from(NODES[b as usize % NODES.len()]),
        }
    }

    fn job(&self, s: &mut Script) -> Option<RuntimeJob> {
        let jobs: Vec<&RuntimeJob> = self.core.jobs().map(|r| &r.job).collect();
        (!jobs.is_empty()).then(|| jobs[s.pick(jobs.len())].clone())
    }

    fn instance_of(&self, job: &RuntimeJob, s: &mut Script) -> (InstanceKey, Option<NodeId>) {
        let bound = self.core.job(&job.job_id).and_then(|r| r.binding.clone());
        match (bound, s.byte() % 4) {
            (Some(binding), 0..=2) => (binding.instance_key, Some(binding.node_id)),
            (_, k) => (
                InstanceKey(["primary", "backup", "primary@00000001"][k as usize % 3].into()),
                Some(self.node(s)),
            ),
        }
    }

    fn history(&mut self, mut job: RuntimeJob, entry: JobHistoryEntry) {
        job.history.push(entry);
        self.event(ManagerEvent::JobUpdated(job));
    }

    fn step(&mut self, s: &mut Script) {
        match s.byte() % 16 {
            0 => {
                let len = s.byte() as usize;
                if let Ok(event) = pb::EventStreamEvent::decode(s.take(len))
                    && let Ok(event) = wire::event_from_pb(&event, &mut wire::Notes::new())
                {
                    self.event(event);
                }
            }
            1 => {
                let node_id = NodeId::from(NODES[s.pick(NODES.len())]);
                let mut node_tags = BTreeMap::new();
                if s.byte() % 4 != 0 {
                    node_tags.insert(tags::POOL.to_owned(), "production".to_owned());
                }
                if s.byte() % 4 == 0 {
                    node_tags.insert(tags::SPARE.to_owned(), "true".to_owned());
                }
                let info = node_info(node_id.clone(), node_tags);
                if s.byte() % 2 == 0 {
                    self.event(ManagerEvent::NodeStarting(info.clone()));
                }
                self.event(ManagerEvent::NodeStarted(info));
                let inventory = inventory(ProviderKind::LocalServers, s);
                self.event(ManagerEvent::NodeInventory { node_id, inventory });
            }
            2 => {
                let node_id = self.node(s);
                let kind = [ProviderKind::LocalServers, ProviderKind::Aws, ProviderKind::Oci][s.pick(3)];
                let inventory = inventory(kind, s);
                self.event(ManagerEvent::NodeInventory { node_id, inventory });
            }
            3 => {
                let node_id = self.node(s);
                let reason = [
                    NodeStopReason::ProviderTerminate,
                    NodeStopReason::HealthPingTimeExceeded,
                    NodeStopReason::UserRequested,
                    NodeStopReason::CreateFailed,
                ][s.pick(4)];
                self.event(ManagerEvent::NodeStopping { node_id, reason });
            }
            4 => {
                let node_id = self.node(s);
                self.event(ManagerEvent::NodeStopped(node_id));
            }
            5 => self.bundle_updated(s),
            6 => {
                let Some(job) = self.job(s) else { return };
                let (role, node_id) = self.instance_of(&job, s);
                let at = Some(self.now);
                let entry = match s.byte() % 6 {
                    0 | 1 => JobHistoryEntry::Running { at, role, node_id },
                    2 => JobHistoryEntry::Stopping {
                        at,
                        role,
                        node_id,
                        reason: [
                            JobStopReason::JobFailed,
                            JobStopReason::NodeStopped,
                            JobStopReason::UserRequested,
                            JobStopReason::UnknownJob,
                        ][s.pick(4)],
                    },
                    3 => JobHistoryEntry::Stopped { at, role, node_id },
                    4 => JobHistoryEntry::Provisioned { at, role, node_id },
                    _ => JobHistoryEntry::Completed { at },
                };
                self.history(job, entry);
            }
            7 => {
                let Some(job) = self.job(s) else { return };
                let (role, node_id) = self.instance_of(&job, s);
                let code = [
                    RejectionCode::InvalidSpec,
                    RejectionCode::InsufficientCapacity,
                    RejectionCode::PortInUse,
                    RejectionCode::GpuUnavailable,
                    RejectionCode::ImageUnavailable,
                    RejectionCode::NodeShuttingDown,
                ][s.pick(6)];
                self.event(ManagerEvent::JobRejected {
                    job_id: job.job_id,
                    role,
                    node_id: node_id.unwrap_or_else(|| NodeId::from("n0")),
                    code,
                    detail: "refused".into(),
                    inventory: None,
                });
            }
            8 => self.event(ManagerEvent::InitialDataComplete),
            9 => {
                let ms = i64::from(s.byte()) * [100, 1_000, 60_000][s.pick(3)];
                self.advance(ms);
            }
            10 => self.answer(s),
            11 => self.user_command(s),
            12 => match s.byte() % 3 {
                0 => {
                    if let Some(job) = self.job(s) {
                        self.event(ManagerEvent::JobDeleted(job.job_id));
                    }
                }
                1 => {
                    let bundles = &examples().bundles;
                    let id = bundles[s.pick(bundles.len())].bundle_id.clone();
                    self.event(ManagerEvent::BundleDeleted(id));
                }
                _ => {
                    if let Some(mut job) = self.job(s) {
                        job.state = [JobState::Pre, JobState::Active, JobState::Post][s.pick(3)];
                        self.event(ManagerEvent::JobOutOfWindow(job));
                    }
                }
            },
            13 => {
                let Some(migration) = self.migrations.get(s.pick(self.migrations.len().max(1))).cloned() else {
                    return;
                };
                let Some(state) = self.core.migrations().into_iter().find(|m| m.migration_id == migration) else {
                    return;
                };
                let (from_key, signal) = match s.byte() % 4 {
                    0 => (state.target_key.clone(), MigrationSignal::TargetReady(vec![s.byte()])),
                    1 => (state.source_key.clone(), MigrationSignal::SourceStoppedAt("42".into())),
                    2 => (state.target_key.clone(), MigrationSignal::TargetApplied),
                    _ => (state.source_key.clone(), MigrationSignal::Refused("no".into())),
                };
                let job_id = state.job_id.clone();
                self.event(ManagerEvent::MigrationSignal {
                    migration_id: migration.0,
                    job_id,
                    from_key,
                    signal,
                });
            }
            14 => {
                let node_id = self.node(s);
                let kind = [InterruptionKind::SpotInterruption, InterruptionKind::Rebalance][s.pick(2)];
                let deadline = (s.byte() % 2 == 0).then(|| self.now + i64::from(s.byte()) * 1_000);
                self.event(ManagerEvent::NodeInterruptionNotice {
                    node_id,
                    kind,
                    deadline,
                    noticed_at: Some(self.now),
                });
            }
            _ => {
                if s.byte() == 255 {
                    self.input(Input::Close);
                }
            }
        }
    }

    /// Manager stores a bundle and expands it into its jobs.
    fn bundle_updated(&mut self, s: &mut Script) {
        let bundles = &examples().bundles;
        let mut bundle = bundles[s.pick(bundles.len())].clone();
        self.generation += 1;
        bundle.generation = self.generation;
        if s.byte() % 4 == 0
            && let Some(job) = bundle.spec.jobs.first_mut()
        {
            job.start_mode = StartMode::Manual;
        }
        if s.byte() % 4 == 0
            && let Some(job) = bundle.spec.jobs.first_mut()
        {
            job.requirements.required_capacity = f64::from(s.byte() % 12);
        }
        self.event(ManagerEvent::BundleUpdated(bundle.clone()));
        for replica_index in 0..bundle.spec.replica_count() {
            for spec in &bundle.spec.jobs {
                let mut spec = spec.clone();
                spec.parameters = bundle.spec.parameters_for(replica_index, &spec);
                let job = RuntimeJob {
                    job_id: runtime_job_id(&bundle.bundle_id, replica_index, &spec.job_name),
                    state: JobState::Active,
                    tags: BTreeMap::new(),
                    start_date_time: None,
                    bundle_ref: Some(BundleJobRef {
                        bundle_id: bundle.bundle_id.clone(),
                        replica_index,
                        job_name: spec.job_name.clone(),
                    }),
                    dormant: spec.start_mode == StartMode::Manual,
                    spec,
                    context: None,
                    terminal_verdict: None,
                    history: vec![JobHistoryEntry::Created { at: None }],
                };
                self.event(ManagerEvent::JobActive(job));
            }
        }
    }

    /// Answers one outstanding call, then plays what Manager would report.
    fn answer(&mut self, s: &mut Script) {
        if self.pending.is_empty() {
            return;
        }
        let (id, rpc) = self.pending.remove(s.pick(self.pending.len()));
        let outcome = s.byte();
        if outcome % 4 == 3 {
            let kind = [
                RpcFailureKind::Transient,
                RpcFailureKind::InsufficientCapacity,
                RpcFailureKind::NotFound,
                RpcFailureKind::AlreadyExists,
                RpcFailureKind::Rejected,
            ][s.pick(5)];
            self.input(Input::RpcResult {
                id,
                result: Err(RpcFailure {
                    kind,
                    message: format!("{kind:?}"),
                }),
            });
            return;
        }
        self.input(Input::RpcResult { id, result: Ok(()) });
        if outcome % 4 == 2 {
            return; // Manager accepted it and has said nothing since.
        }
        match rpc {
            Rpc::StartJob {
                job_id,
                instance_key,
                node_id,
                ..
            }
            | Rpc::StartPreparedJob {
                job_id,
                instance_key,
                node_id,
            } => {
                if let Some(record) = self.core.job(&job_id) {
                    let job = record.job.clone();
                    self.history(
                        job,
                        JobHistoryEntry::Running {
                            at: Some(self.now),
                            role: instance_key,
                            node_id: Some(node_id),
                        },
                    );
                }
            }
            Rpc::StartMigrationTarget {
                job_id,
                instance_key,
                node_id,
                defer_start,
                ..
            } => {
                if defer_start {
                    self.event(ManagerEvent::JobPrepared {
                        job_id,
                        role: instance_key,
                        node_id,
                    });
                } else if let Some(record) = self.core.job(&job_id) {
                    let job = record.job.clone();
                    self.history(
                        job,
                        JobHistoryEntry::Running {
                            at: Some(self.now),
                            role: instance_key,
                            node_id: Some(node_id),
                        },
                    );
                }
            }
            Rpc::StopJob {
                job_id,
                instance_key,
                node_id,
            } => {
                if let Some(record) = self.core.job(&job_id) {
                    let job = record.job.clone();
                    self.history(
                        job,
                        JobHistoryEntry::Stopped {
                            at: Some(self.now),
                            role: instance_key,
                            node_id: Some(node_id),
                        },
                    );
                }
            }
            Rpc::CreateNode {
                provider,
                node_id,
                tags: node_tags,
                ..
            } => {
                let info = node_info(node_id.clone(), node_tags);
                self.event(ManagerEvent::NodeStarting(info.clone()));
                self.event(ManagerEvent::NodeStarted(info));
                let inventory = inventory(provider, s);
                self.event(ManagerEvent::NodeInventory { node_id, inventory });
            }
            Rpc::TerminateNode { node_id } => {
                self.event(ManagerEvent::NodeStopping {
                    node_id: node_id.clone(),
                    reason: NodeStopReason::UserRequested,
                });
                self.event(ManagerEvent::NodeStopped(node_id));
            }
            Rpc::UpdateNodeTags { node_id, set, remove } => {
                if let Some(node) = self.core.fleet().get(&node_id) {
                    let mut node_tags = node.tags.clone();
                    node_tags.extend(set);
                    for key in remove {
                        node_tags.remove(&key);
                    }
                    self.event(ManagerEvent::NodeTagsUpdated {
                        node_id,
                        tags: node_tags,
                    });
                }
            }
            Rpc::StartBundleJob(job) | Rpc::StopBundleJob(job) => {
                let dormant = matches!(s.byte() % 2, 0);
                let id = runtime_job_id(&job.bundle_id, job.replica_index, &job.job_name);
                if let Some(record) = self.core.job(&id) {
                    let mut job = record.job.clone();
                    job.dormant = dormant;
                    self.event(ManagerEvent::JobUpdated(job));
                }
            }
            _ => {}
        }
    }

    fn user_command(&mut self, s: &mut Script) {
        let strategy = |b: u8| {
            [
                MigrationStrategy::StopThenStart,
                MigrationStrategy::Overlap,
                MigrationStrategy::Handover,
            ][b as usize % 3]
        };
        let command = match s.byte() % 12 {
            0 => Command::CordonNode(self.node(s)),
            1 => Command::UncordonNode(self.node(s)),
            2 => Command::TerminateNode(self.node(s)),
            3 => Command::EvictNode(self.node(s)),
            4 => Command::DrainNode {
                node_id: self.node(s),
                options: DrainOptions {
                    timeout_ms: Some(u64::from(s.byte()) * 1_000),
                    force: s.byte() % 2 == 0,
                    strategy_for: StrategyFor::all(strategy(s.byte())),
                    after: [None, Some(DrainAfter::Keep), Some(DrainAfter::Terminate)][s.pick(3)],
                },
            },
            5 => Command::HandleNodeInterruption {
                node_id: self.node(s),
                notice: InterruptionNotice {
                    kind: [InterruptionKind::SpotInterruption, InterruptionKind::Rebalance][s.pick(2)],
                    deadline: (s.byte() % 2 == 0).then(|| self.now + i64::from(s.byte()) * 1_000),
                    strategy_for: StrategyFor::default(),
                },
            },
            6 => {
                let Some(job) = self.job(s) else { return };
                let target_node_id = (s.byte() % 3 == 0).then(|| self.node(s));
                Command::MigrateJob {
                    job_id: job.job_id,
                    options: MigrationOptions {
                        strategy: Some(strategy(s.byte())),
                        target_node_id,
                        override_reservation: s.byte() % 2 == 0,
                    },
                }
            }
            7 => {
                let Some(migration_id) = self.migrations.get(s.pick(self.migrations.len().max(1))).cloned() else {
                    return;
                };
                Command::AbortMigration {
                    migration_id,
                    reason: "operator changed mind".into(),
                }
            }
            8 => {
                let bundles = &examples().bundles;
                Command::DeleteBundle(bundles[s.pick(bundles.len())].bundle_id.clone())
            }
            9 => {
                let bundles = &examples().bundles;
                let bundle = bundles[s.pick(bundles.len())].clone();
                if s.byte() % 2 == 0 {
                    Command::UpdateBundle(bundle)
                } else {
                    Command::CreateBundle(bundle)
                }
            }
            10 => {
                let Some(job) = self.job(s) else { return };
                let Some(job_ref) = job.bundle_ref else { return };
                if s.byte() % 2 == 0 {
                    Command::StartBundleJob(job_ref)
                } else {
                    Command::StopBundleJob(job_ref)
                }
            }
            _ => match s.byte() % 2 {
                0 => Command::SetPlacementPools(examples().settings.placement_pools.clone()),
                _ => Command::SetTemplateImages(BTreeMap::from([(
                    "encoder".to_owned(),
                    vec!["registry.example/encoder:1".to_owned()],
                )])),
            },
        };
        self.command(command);
    }

    /// What the edges read after every step.
    fn check_views(&self) {
        let _ = self.core.fleet_snapshot();
        let _ = self.core.view();
        let metrics = self.core.metrics(self.now);
        assert!(metrics.counters.placements_succeeded <= metrics.counters.placements_attempted);
    }
}

fn node_info(node_id: NodeId, tags: BTreeMap<String, String>) -> NodeInfo {
    NodeInfo {
        node_id,
        tags,
        created_at: None,
        provider: ProviderMetadata::Unknown,
    }
}

fn inventory(kind: ProviderKind, s: &mut Script) -> NodeInventory {
    let capacity = f64::from(s.byte() % 17);
    let gpus = if s.byte() % 4 == 0 {
        vec![Gpu {
            model: "t4".into(),
            total_capacity: 1.0,
        }]
    } else {
        Vec::new()
    };
    NodeInventory {
        kind,
        region: "eu-west-1".into(),
        az: ["az1", "az2", ""][s.pick(3)].into(),
        instance_type: "m5.xlarge".into(),
        total_capacity: capacity,
        total_cores: capacity as u32,
        utilization_cap: [1.0, 0.75, 0.5][s.pick(3)],
        reserved_capacity: 0.0,
        capabilities: if gpus.is_empty() {
            Vec::new()
        } else {
            vec!["norsk.io/nvidia-gpu".into()]
        },
        gpus,
        images: vec!["registry.example/encoder:1".into()],
        nics: Vec::new(),
    }
}

fuzz_target!(|data: &[u8]| {
    let examples = examples();
    let Ok(valid) = validate_auto_settings(examples.settings.clone()) else {
        panic!("the examples' settings are valid");
    };
    let now = 1_000_000;
    let mut driver = Driver {
        core: AutoManagerCore::new(valid, now),
        now,
        next_deadline: None,
        pending: Vec::new(),
        migrations: Vec::new(),
        next_command: 0,
        generation: 1,
    };
    let mut script = Script(data);
    for _ in 0..512 {
        if script.is_empty() {
            break;
        }
        driver.step(&mut script);
        driver.check_views();
    }
});
