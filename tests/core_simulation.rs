//! Randomised simulation of the AutoManager core: a small Manager model
//! answers the core's RPCs and throws random events and faults at it from
//! the spec's vocabulary (nodes starting, stopping with and without
//! `NodeStopping`, jobs running, failing, rejected — invalid specs included
//! — provisions refused, dispatches failing, bundles updated, windows
//! ending, time passing, jobs migrated under each strategy and migrations
//! aborted; nodes cordoned, uncordoned, drained and interrupted; workers
//! that drop, whose node stays stopping — its instances still held, so a
//! start elsewhere is refused `AlreadyExists` — until its `NodeStopped`).
//! After every step the invariants are checked.
//!
//! `CORE_SIM_SEEDS` / `CORE_SIM_STEPS` size the run (default 2,000 × 300);
//! a failure prints its seed, and `CORE_SIM_SEED=<seed>` replays just that
//! one.

mod core_simulation_migration;
mod core_support;

use std::collections::{BTreeMap, BTreeSet};

use core_support::*;
use norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS;
use norsk_auto_manager::automanager::{
    Action, Command, DrainAfter, DrainOptions, DrainPhase, InterruptionNotice, Notification, RequestId, Rpc,
    RpcFailureKind,
};
use norsk_auto_manager::model::{
    Bundle, BundleId, HotSpareSpec, InstanceKey, InterruptionKind, JobHistoryEntry, JobId, JobState, JobStopReason,
    ManagerEvent, NodeId, NodeStopReason, ProviderKind, RejectionCode, UnixMillis,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One instance the model runs.
#[derive(Clone, Debug)]
struct Instance {
    key: InstanceKey,
    node: NodeId,
    running: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum NodePhase {
    Starting,
    Running,
    /// Its worker dropped (`NodeStopping`); Manager still holds its
    /// instances until `NodeStopped`.
    Stopping,
}

/// The Manager model.
struct Model {
    rng: StdRng,
    h: Harness,
    pending: Vec<(RequestId, Rpc)>,
    nodes: BTreeMap<NodeId, (NodePhase, Vec<(String, String)>)>,
    instances: BTreeMap<JobId, Instance>,
    /// Instances Manager still holds on a stopping node: a start of the
    /// same instance elsewhere is refused `AlreadyExists`.
    held: BTreeMap<JobId, Instance>,
    /// Spare-untagging calls the core has made (what it counts consumed).
    spares_untagged: u64,
    /// Starts refused because the instance was still held on a stopping
    /// node.
    refused_held: u64,
    /// Migration targets, beside their job's instance, by job and instance
    /// key: (instance, created with a deferred start and not yet started).
    /// A job may have several: the target of a live migration and those of
    /// aborted ones whose creation or stop is still on its way, each
    /// answered on its own.
    targets: BTreeMap<(JobId, InstanceKey), (Instance, bool)>,
    /// Sources a completed migration left running (its stop not yet
    /// handled).
    displaced: BTreeMap<JobId, Instance>,
    bundles: BTreeMap<BundleId, Bundle>,
    ended: BTreeSet<JobId>,
    last_recovery: BTreeMap<JobId, UnixMillis>,
    next_cluster: u32,
    /// Broken rules the model saw while answering (checked with the rest).
    violations: Vec<String>,
    /// No faults are injected (while spares are left to converge).
    calm: bool,
    /// The running drain of each node, by when it started (from
    /// `drainProgress`).
    running_drains: BTreeMap<NodeId, UnixMillis>,
    /// This step cordoned, drained or interrupted a node.
    took_out_of_service: bool,
}

fn random_bundle(rng: &mut StdRng, id: usize) -> Bundle {
    let jobs = rng.random_range(1..=3);
    let mut yaml = String::from("pool: production\n");
    if rng.random_bool(0.3) {
        yaml.push_str("resiliencePolicy: {sameNode: forbid}\n");
    }
    // Co-located groups: every rule-less job together, or jobs joining j0.
    let same_node_default = jobs > 1 && rng.random_bool(0.15);
    if same_node_default {
        yaml.push_str("intraReplicaPlacement: {sameNodeDefault: true}\n");
    }
    yaml.push_str("jobs:\n");
    for j in 0..jobs {
        let capacity = [0.5, 1.0, 1.5, 2.0, 3.0][rng.random_range(0..5)];
        let policy = ["preferSpare", "avoidSpare", "drop"][rng.random_range(0..3)];
        let ports = if rng.random_bool(0.3) { "[\"1935/tcp\"]" } else { "[]" };
        let essential = rng.random_bool(0.7);
        let ceiling = rng.random_range(0..4);
        let single = if rng.random_bool(0.1) {
            ", exclusive: true, singleUse: true"
        } else {
            ""
        };
        let co_located = if j > 0 && !same_node_default && rng.random_bool(0.3) {
            ", coLocateWith: [j0]"
        } else {
            ""
        };
        yaml.push_str(&format!(
            "  - {{jobName: j{j}{single}{co_located}, requirements: {{requiredCapacity: {capacity}, requiredHostPorts: {ports}, onRuntimeFailure: {policy}, essential: {essential}, maxRestartsPerHour: {ceiling}}}}}\n"
        ));
    }
    bundle(&format!("b{id}"), &yaml)
}

impl Model {
    fn new(seed: u64, trace: bool) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let mut settings = settings();
        settings.placement_pools = yaml_serde::from_str(
            "- name: production\n  tiers:\n    - {name: cluster, kind: local-servers, scaleOut: fixed}\n    - name: aws\n      kind: aws\n      region: eu-west-1\n      maxNodes: 4\n      provisionTimeoutMs: 120000\n      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]\n",
        )
        .expect("pools parse");
        settings.hot_spares = vec![random_hot_spares(&mut rng)];
        let mut h = Harness::with(settings);
        h.trace = trace;
        let mut model = Model {
            h,
            pending: Vec::new(),
            nodes: BTreeMap::new(),
            instances: BTreeMap::new(),
            held: BTreeMap::new(),
            spares_untagged: 0,
            refused_held: 0,
            targets: BTreeMap::new(),
            displaced: BTreeMap::new(),
            bundles: BTreeMap::new(),
            ended: BTreeSet::new(),
            last_recovery: BTreeMap::new(),
            next_cluster: 0,
            violations: Vec::new(),
            calm: false,
            running_drains: BTreeMap::new(),
            took_out_of_service: false,
            rng: StdRng::seed_from_u64(rng.random()),
        };
        for _ in 0..rng.random_range(1..=3) {
            model.register_cluster_node();
        }
        for id in 0..rng.random_range(2..=6) {
            let bundle = random_bundle(&mut rng, id);
            model.bundles.insert(bundle.bundle_id.clone(), bundle.clone());
            model.h.bundle(
                bundle.bundle_id.as_str(),
                &yaml_serde::to_string(&bundle.spec).expect("spec serialises"),
            );
        }
        model.h.event(ManagerEvent::InitialDataComplete);
        model
    }

    fn register_cluster_node(&mut self) {
        self.next_cluster += 1;
        let id = format!("cluster-{}", self.next_cluster);
        let capacity = [2.0, 4.0, 8.0][self.rng.random_range(0..3)];
        self.h.cluster_node(&id, capacity);
        self.nodes.insert(NodeId(id), (NodePhase::Running, vec![]));
    }

    fn fail(&mut self, id: RequestId, kind: RpcFailureKind) {
        self.h.fail(id, kind);
    }

    /// Answers one outstanding RPC, as Manager would (with random faults).
    fn answer(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let (id, rpc) = self.pending.remove(self.rng.random_range(0..self.pending.len()));
        if !self.calm && self.rng.random_bool(0.05) {
            return self.fail(id, RpcFailureKind::Transient);
        }
        match rpc {
            Rpc::StartJob {
                job_id,
                instance_key,
                node_id,
                ..
            } => {
                let usable = self.nodes.get(&node_id).is_some_and(|(p, _)| *p == NodePhase::Running);
                if !usable || self.ended.contains(&job_id) {
                    return self.fail(id, RpcFailureKind::NotFound);
                }
                if let Some(held) = self.held.get(&job_id).filter(|i| i.key == instance_key)
                    && held.node != node_id
                {
                    let message = format!("instance {instance_key} already exists: it runs on node {}", held.node);
                    self.refused_held += 1;
                    return self.h.input(norsk_auto_manager::automanager::Input::RpcResult {
                        id,
                        result: Err(norsk_auto_manager::automanager::RpcFailure {
                            kind: RpcFailureKind::AlreadyExists,
                            message,
                        }),
                    });
                }
                self.h.ok(id);
                if self
                    .displaced
                    .get(&job_id)
                    .is_some_and(|d| d.key == instance_key && d.node == node_id)
                {
                    self.violations.push(format!(
                        "{job_id} started as {instance_key} over its source still stopping"
                    ));
                }
                if let Some(existing) = self.instances.get(&job_id) {
                    self.violations.push(format!(
                        "{job_id} started on {node_id} while running on {}",
                        existing.node
                    ));
                }
                self.instances.insert(
                    job_id.clone(),
                    Instance {
                        key: instance_key.clone(),
                        node: node_id.clone(),
                        running: false,
                    },
                );
                self.h.history(
                    &job_id,
                    JobHistoryEntry::Provisioned {
                        at: Some(self.h.now),
                        role: instance_key,
                        node_id: Some(node_id),
                    },
                );
            }
            Rpc::CreateNode { node_id, tags, .. } => {
                if !self.calm && self.rng.random_bool(0.15) {
                    return self.fail(id, RpcFailureKind::InsufficientCapacity);
                }
                self.h.ok(id);
                let tags: Vec<(String, String)> = tags.into_iter().collect();
                let t: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                self.h
                    .event(ManagerEvent::NodeStarting(node_info(node_id.as_str(), &t)));
                self.nodes.insert(node_id, (NodePhase::Starting, tags));
            }
            Rpc::TerminateNode { node_id } => {
                self.h.ok(id);
                if self.nodes.contains_key(&node_id) {
                    self.h.node_stopping(node_id.as_str(), NodeStopReason::UserRequested);
                    self.node_gone(&node_id);
                }
            }
            Rpc::UpdateNodeTags { node_id, set, remove } => {
                self.h.ok(id);
                if let Some((_, tags)) = self.nodes.get_mut(&node_id) {
                    tags.retain(|(k, _)| !set.contains_key(k) && !remove.contains(k));
                    tags.extend(set);
                }
            }
            Rpc::StartMigrationTarget { .. }
            | Rpc::StartPreparedJob { .. }
            | Rpc::StopJob { .. }
            | Rpc::SendMigrationSignal { .. } => self.answer_migration(id, rpc),
            _ => self.h.ok(id),
        }
    }

    fn node_gone(&mut self, node: &NodeId) {
        self.nodes.remove(node);
        self.instances.retain(|_, i| &i.node != node);
        self.held.retain(|_, i| &i.node != node);
        self.targets.retain(|_, (t, _)| &t.node != node);
        self.displaced.retain(|_, i| &i.node != node);
        self.h.event(ManagerEvent::NodeStopped(node.clone()));
    }

    /// The node's worker dropped: `NodeStopping` now, `NodeStopped` only on
    /// a later step. Its instances are held by Manager meanwhile.
    fn worker_drops(&mut self, node: &NodeId) {
        if let Some(entry) = self.nodes.get_mut(node) {
            entry.0 = NodePhase::Stopping;
        }
        let on_node: Vec<JobId> = self
            .instances
            .iter()
            .filter(|(_, i)| &i.node == node)
            .map(|(j, _)| j.clone())
            .collect();
        for job in on_node {
            if let Some(instance) = self.instances.remove(&job) {
                self.held.insert(job, instance);
            }
        }
        self.targets.retain(|_, (t, _)| &t.node != node);
        self.displaced.retain(|_, i| &i.node != node);
        self.h
            .node_stopping(node.as_str(), NodeStopReason::HealthPingTimeExceeded);
    }

    fn pick<T: Clone>(&mut self, items: Vec<T>) -> Option<T> {
        if items.is_empty() {
            return None;
        }
        let i = self.rng.random_range(0..items.len());
        Some(items[i].clone())
    }

    /// Cordon, uncordon, drain (forced or not) or interrupt a random node.
    fn take_out_of_service(&mut self) {
        let nodes: Vec<NodeId> = self.h.core.fleet().iter().map(|n| n.id.clone()).collect();
        let Some(node_id) = self.pick(nodes) else { return };
        let command = match self.rng.random_range(0..4) {
            0 => Command::CordonNode(node_id),
            1 => Command::UncordonNode(node_id),
            2 => Command::DrainNode {
                node_id,
                options: DrainOptions {
                    timeout_ms: Some(self.rng.random_range(0..300_000)),
                    force: self.rng.random_bool(0.5),
                    // The node's default, a maintenance drain, or the
                    // spec's drain-then-terminate.
                    after: [None, Some(DrainAfter::Keep), Some(DrainAfter::Terminate)][self.rng.random_range(0..3)],
                    ..DrainOptions::default()
                },
            },
            _ => Command::HandleNodeInterruption {
                node_id,
                notice: InterruptionNotice {
                    kind: if self.rng.random_bool(0.5) {
                        InterruptionKind::SpotInterruption
                    } else {
                        InterruptionKind::Rebalance
                    },
                    deadline: self
                        .rng
                        .random_bool(0.5)
                        .then(|| self.h.now + self.rng.random_range(0..180_000)),
                    strategy_for: Default::default(),
                },
            },
        };
        self.took_out_of_service = true;
        self.h.command(command);
    }

    /// One random step.
    fn step(&mut self) {
        if self.rng.random_bool(0.04) {
            self.take_out_of_service();
        } else {
            self.random_step();
        }
        self.adopt_completed_targets();
    }

    fn random_step(&mut self) {
        match self.rng.random_range(0..108) {
            0..=34 => self.answer(),
            35..=44 => {
                let starting: Vec<NodeId> = self
                    .nodes
                    .iter()
                    .filter(|(_, (p, _))| *p == NodePhase::Starting)
                    .map(|(id, _)| id.clone())
                    .collect();
                if let Some(node) = self.pick(starting) {
                    let tags = self.nodes[&node].1.clone();
                    let t: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                    self.h.event(ManagerEvent::NodeStarted(node_info(node.as_str(), &t)));
                    self.h.event(ManagerEvent::NodeInventory {
                        node_id: node.clone(),
                        inventory: inventory(ProviderKind::Aws, 4.0),
                    });
                    if let Some(entry) = self.nodes.get_mut(&node) {
                        entry.0 = NodePhase::Running;
                    }
                }
            }
            45..=56 => {
                let provisioned: Vec<JobId> = self
                    .instances
                    .iter()
                    .filter(|(_, i)| !i.running)
                    .map(|(j, _)| j.clone())
                    .collect();
                if let Some(job) = self.pick(provisioned) {
                    let instance = self.instances.get_mut(&job).map(|i| {
                        i.running = true;
                        i.clone()
                    });
                    if let Some(i) = instance {
                        self.h.history(
                            &job,
                            JobHistoryEntry::Running {
                                at: Some(self.h.now),
                                role: i.key,
                                node_id: Some(i.node),
                            },
                        );
                    }
                }
            }
            57..=63 => {
                let running: Vec<JobId> = self
                    .instances
                    .iter()
                    .filter(|(_, i)| i.running)
                    .map(|(j, _)| j.clone())
                    .collect();
                if let Some(job) = self.pick(running)
                    && let Some(i) = self.instances.remove(&job)
                {
                    self.h.history(
                        &job,
                        JobHistoryEntry::Stopping {
                            at: Some(self.h.now),
                            role: i.key.clone(),
                            node_id: Some(i.node.clone()),
                            reason: JobStopReason::JobFailed,
                        },
                    );
                    self.h.history(
                        &job,
                        JobHistoryEntry::Stopped {
                            at: Some(self.h.now),
                            role: i.key,
                            node_id: Some(i.node),
                        },
                    );
                }
            }
            64..=67 => {
                let provisioned: Vec<JobId> = self
                    .instances
                    .iter()
                    .filter(|(_, i)| !i.running)
                    .map(|(j, _)| j.clone())
                    .collect();
                if let Some(job) = self.pick(provisioned)
                    && let Some(i) = self.instances.remove(&job)
                {
                    let code = if self.rng.random_bool(0.1) {
                        RejectionCode::InvalidSpec
                    } else {
                        RejectionCode::PortInUse
                    };
                    self.h.event(ManagerEvent::JobRejected {
                        job_id: job,
                        role: i.key,
                        node_id: i.node,
                        code,
                        detail: "refused by the worker".into(),
                        inventory: None,
                    });
                }
            }
            68..=70 => {
                let nodes: Vec<NodeId> = self.nodes.keys().cloned().collect();
                if let Some(node) = self.pick(nodes) {
                    let stopping = self.nodes.get(&node).is_some_and(|(p, _)| *p == NodePhase::Stopping);
                    if stopping {
                        self.node_gone(&node);
                    } else if self.rng.random_bool(0.3) {
                        self.worker_drops(&node);
                    } else {
                        if self.rng.random_bool(0.5) {
                            self.h
                                .node_stopping(node.as_str(), NodeStopReason::HealthPingTimeExceeded);
                        }
                        self.node_gone(&node);
                    }
                }
            }
            71..=88 => {
                let ms = self.rng.random_range(0..30_000);
                self.h.advance(ms);
            }
            89..=90 => {
                let specs = vec![random_hot_spares(&mut self.rng)];
                let (result, step) = self.h.core.update_hot_spare_specs(specs, self.h.now);
                let now = self.h.now;
                self.h.actions.extend(step.actions.into_iter().map(|a| (now, a)));
                self.h.next_deadline = step.next_deadline;
                if let Err(e) = result {
                    self.violations.push(format!("a valid hot-spare list was refused: {e}"));
                }
            }
            91..=92 => self.register_cluster_node(),
            93..=95 => {
                let ids: Vec<BundleId> = self.bundles.keys().cloned().collect();
                if let Some(id) = self.pick(ids)
                    && let Some(bundle) = self.bundles.get_mut(&id)
                {
                    bundle.generation += 1;
                    let bundle = bundle.clone();
                    self.h.command(Command::UpdateBundle(bundle.clone()));
                    self.h.event(ManagerEvent::BundleUpdated(bundle));
                }
            }
            100..=102 => self.migration_command(),
            103..=107 => self.target_progresses(),
            _ => {
                let live: Vec<JobId> = self
                    .h
                    .core
                    .jobs()
                    .filter(|r| r.job.state == JobState::Active)
                    .map(|r| r.job.job_id.clone())
                    .collect();
                if let Some(job) = self.pick(live) {
                    self.instances.remove(&job);
                    self.ended.insert(job.clone());
                    let mut runtime = self.h.core.job(&job).expect("known").job.clone();
                    runtime.state = JobState::Post;
                    self.h.event(ManagerEvent::JobOutOfWindow(runtime));
                }
            }
        }
    }

    /// Collects this step's actions and checks every invariant.
    fn check(&mut self, broken_before: &BTreeSet<BundleId>, dropped_before: &BTreeSet<JobId>) -> Result<(), String> {
        let now = self.h.now;
        let actions = std::mem::take(&mut self.h.actions);
        let took_out_of_service = std::mem::take(&mut self.took_out_of_service);
        for (at, action) in actions {
            match action {
                Action::Call { id, rpc } => {
                    // No spare is consumed without a job Manager accepted
                    // on it.
                    if let Rpc::UpdateNodeTags { node_id, remove, .. } = &rpc
                        && remove.iter().any(|t| t == "spare")
                    {
                        self.spares_untagged += 1;
                        let carries = self.instances.values().any(|i| &i.node == node_id)
                            || self.targets.values().any(|(t, _)| &t.node == node_id);
                        if !carries {
                            return Err(format!("spare {node_id} consumed with no job accepted on it"));
                        }
                    }
                    if let Rpc::StartJob { job_id, .. } = &rpc
                        && self
                            .pending
                            .iter()
                            .any(|(_, r)| matches!(r, Rpc::StartJob { job_id: j, .. } if j == job_id))
                    {
                        return Err(format!("second StartJob for {job_id} while one is in flight"));
                    }
                    self.pending.push((id, rpc));
                }
                Action::Notify(Notification::DrainProgress(state)) => {
                    let running = self.running_drains.get(&state.node_id);
                    if state.phase.is_final() {
                        self.running_drains.remove(&state.node_id);
                    } else if running.is_some_and(|&started| started != state.started) {
                        return Err(format!("a second drain of {} while one runs", state.node_id));
                    } else {
                        self.running_drains.insert(state.node_id.clone(), state.started);
                    }
                }
                Action::Notify(Notification::PlacementDecision(info)) => {
                    if let norsk_auto_manager::automanager::Decision::Placed { node_id, .. } = &info.decision
                        && self.h.core.is_cordoned(node_id)
                    {
                        return Err(format!("{} placed on cordoned node {node_id}", info.job_id));
                    }
                    if broken_before.contains(&info.bundle_id)
                        && self.h.core.broken_bundles().contains_key(&info.bundle_id)
                    {
                        return Err(format!("broken bundle {} got a placement", info.bundle_id));
                    }
                    if dropped_before.contains(&info.job_id) && self.h.core.job(&info.job_id).is_some_and(|r| r.dropped)
                    {
                        return Err(format!("dropped job {} got a placement", info.job_id));
                    }
                    // A drain's migration targets are re-placements but
                    // not recoveries from a failure.
                    if info.recovery && !took_out_of_service {
                        if let Some(last) = self.last_recovery.get(&info.job_id)
                            && at - last < MIN_RECOVERY_INTERVAL_MS
                        {
                            return Err(format!("recoveries of {} {}ms apart", info.job_id, at - last));
                        }
                        self.last_recovery.insert(info.job_id.clone(), at);
                    }
                }
                _ => {}
            }
        }
        // Capacity and ports per node, from the core's bindings.
        let mut used: BTreeMap<NodeId, (f64, Vec<String>)> = BTreeMap::new();
        for record in self.h.core.jobs() {
            let Some(binding) = &record.binding else { continue };
            let entry = used.entry(binding.node_id.clone()).or_default();
            entry.0 += record.job.spec.requirements.required_capacity;
            for port in &record.job.spec.requirements.required_host_ports {
                let port = port.to_string();
                if entry.1.contains(&port) {
                    return Err(format!("port {port} over-committed on {}", binding.node_id));
                }
                entry.1.push(port);
            }
            let ceiling = self
                .h
                .core
                .settings()
                .restart_ceiling(&record.job.spec.requirements)
                .unwrap_or(0);
            if record.restarts.count(now) > ceiling {
                return Err(format!(
                    "{} restarted {} times, ceiling {ceiling}",
                    record.job.job_id,
                    record.restarts.count(now)
                ));
            }
        }
        for (node_id, (capacity, _)) in &used {
            let Some(node) = self.h.core.fleet().get(node_id) else {
                return Err(format!("job bound to unknown node {node_id}"));
            };
            // A node terminated with jobs on it (a forced drain, an
            // eviction) keeps them until Manager reports it stopping.
            let drained = self.h.core.drain_status(node_id).is_some();
            if (node.terminated && !node.cordoned && !drained) || node.is_going() {
                return Err(format!("job bound to a node that is gone: {node_id}"));
            }
            let usable = node.inventory.as_ref().map_or(4.0, |i| i.usable_capacity());
            if *capacity > usable + 1e-9 {
                return Err(format!("{node_id} over-committed: {capacity} of {usable}"));
            }
        }
        // No leaked node: a node this core provisioned that is still
        // launching carries a job or is within its timeout.
        for node in self.h.core.fleet().iter() {
            if let Some(p) = &node.provisioned
                && node.is_launching()
                && !node.terminated
                && !used.contains_key(&node.id)
                && now > p.start_deadline
            {
                return Err(format!("leaked node {}: launching, empty, past its timeout", node.id));
            }
        }
        // A spare that took a job (Manager accepted its start there) is an
        // ordinary node from then on.
        let accepted: BTreeSet<&NodeId> = self.h.core.jobs().filter_map(|r| r.accepted_on()).collect();
        if let Some(node) = accepted.iter().find(|n| self.h.core.spare_spec(n).is_some()) {
            return Err(format!("{node} carries an accepted job and is still a spare"));
        }
        // The reconciler's count, the status and the pool gauge agree, and
        // nothing is counted consumed that was not untagged for a job.
        let core = &self.h.core;
        let status = core.hot_spare_status();
        let metrics = core.metrics(now);
        let gauge = metrics.pools.iter().find(|p| p.pool_name == "production");
        if let (Some(status), Some(gauge)) = (status.first(), gauge) {
            let spares: Vec<&NodeId> = core
                .fleet()
                .iter()
                .filter(|n| core.spare_spec(&n.id).is_some() && !accepted.contains(&n.id))
                .map(|n| &n.id)
                .collect();
            if gauge.live_spares != status.live || status.live + status.provisioning != spares.len() as u32 {
                return Err(format!(
                    "spare counts disagree: status {status:?}, gauge {}, spares {spares:?}",
                    gauge.live_spares
                ));
            }
            if status.consumed != self.spares_untagged {
                return Err(format!(
                    "{} spares counted consumed, {} untagged for a job",
                    status.consumed, self.spares_untagged
                ));
            }
        }
        // At most one drain per node, and a drain `done` terminated its node
        // unless it was a maintenance drain (`after: keep`), which keeps it.
        let mut drained = BTreeSet::new();
        for drain in self.h.core.drains() {
            if !drained.insert(drain.node_id.clone()) {
                return Err(format!("two drains of {}", drain.node_id));
            }
            if drain.phase == DrainPhase::Done
                && drain.after == DrainAfter::Terminate
                && self.h.core.fleet().get(&drain.node_id).is_some_and(|n| !n.terminated)
            {
                return Err(format!("drain of {} done, the node not terminated", drain.node_id));
            }
            // "Done" only if every job moved: none went down with the node.
            if drain.phase == DrainPhase::Done && drain.jobs.iter().any(|j| !j.status.left_the_node()) {
                return Err(format!(
                    "drain of {} done with a job left behind: {drain:?}",
                    drain.node_id
                ));
            }
        }
        // A co-located group is never split across nodes, but for the
        // cut-over of a migration of it.
        for bundle in self.bundles.values() {
            for replica in 0..bundle.spec.replica_count() {
                let members: Vec<_> = co_located_group(&bundle.spec)
                    .into_iter()
                    .filter_map(|name| self.h.core.job(&job_id(bundle.bundle_id.as_str(), replica, &name)))
                    .collect();
                if members.iter().any(|r| r.migration.is_some()) {
                    continue;
                }
                let nodes: BTreeSet<&NodeId> = members
                    .iter()
                    .filter_map(|r| r.binding.as_ref().map(|b| &b.node_id))
                    .collect();
                if nodes.len() > 1 {
                    return Err(format!(
                        "co-located group of {}/{replica} split across {nodes:?}",
                        bundle.bundle_id
                    ));
                }
            }
        }
        // A job is never left running nowhere before the point of no
        // return: its source still runs where its binding says.
        for m in self.h.core.migrations() {
            if !m.is_in_flight() || m.past_point_of_no_return {
                continue;
            }
            let source_runs = self
                .instances
                .get(&m.job_id)
                .is_some_and(|i| i.running && i.key == m.source_key && i.node == m.source_node_id);
            let bound_there = self
                .h
                .core
                .job(&m.job_id)
                .and_then(|r| r.binding.as_ref())
                .is_some_and(|b| b.node_id == m.source_node_id && b.instance_key == m.source_key);
            if !source_runs || !bound_there {
                return Err(format!(
                    "{} left running nowhere before the point of no return of {} ({:?})",
                    m.job_id, m.migration_id, m.phase
                ));
            }
        }
        // No job runs on two nodes.
        match self.violations.pop() {
            Some(violation) => Err(violation),
            None => Ok(()),
        }
    }
}

/// The jobs of the co-located group [`random_bundle`] may give a bundle:
/// every job with `sameNodeDefault`, else `j0` and the jobs joining it.
fn co_located_group(spec: &norsk_auto_manager::model::BundleSpec) -> Vec<String> {
    spec.jobs
        .iter()
        .filter(|j| {
            spec.intra_replica_placement.same_node_default
                || j.job_name == "j0"
                || j.co_locate_with.iter().any(|peer| peer == "j0")
        })
        .map(|j| j.job_name.clone())
        .collect()
}

/// A `hotSpares` entry for `production` with a random target and warmth.
fn random_hot_spares(rng: &mut StdRng) -> HotSpareSpec {
    HotSpareSpec {
        pool: "production".into(),
        target_count: rng.random_range(0..=2),
        spec: yaml_serde::from_str("{instanceType: m5.xlarge}").expect("spec parses"),
        warm_for: if rng.random_bool(0.5) {
            vec!["xyz".into()]
        } else {
            vec![]
        },
        ..Default::default()
    }
}

impl Model {
    /// Lets the fleet settle without faults (every RPC answered, every node
    /// started, time passing beyond every backoff), then checks that the
    /// spare count reached its target wherever capacity allowed.
    fn spares_converge(&mut self) -> Result<(), String> {
        self.calm = true;
        for _ in 0..6 {
            // Dropped workers' nodes finish stopping.
            let stopping: Vec<NodeId> = self
                .nodes
                .iter()
                .filter(|(_, (p, _))| *p == NodePhase::Stopping)
                .map(|(id, _)| id.clone())
                .collect();
            for node in stopping {
                self.node_gone(&node);
            }
            self.check(&BTreeSet::new(), &BTreeSet::new())?;
            while !self.pending.is_empty() {
                self.answer();
                self.check(&BTreeSet::new(), &BTreeSet::new())?;
            }
            let starting: Vec<NodeId> = self
                .nodes
                .iter()
                .filter(|(_, (p, _))| *p == NodePhase::Starting)
                .map(|(id, _)| id.clone())
                .collect();
            for node in starting {
                let tags = self.nodes[&node].1.clone();
                let t: Vec<(&str, &str)> = tags.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                self.h.event(ManagerEvent::NodeStarted(node_info(node.as_str(), &t)));
                if let Some(entry) = self.nodes.get_mut(&node) {
                    entry.0 = NodePhase::Running;
                }
            }
            self.h.advance(61_000);
        }
        self.check(&BTreeSet::new(), &BTreeSet::new())?;
        let core = &self.h.core;
        let target = core.settings().hot_spares.first().map_or(0, |e| e.target_count);
        let spares = core
            .fleet()
            .iter()
            .filter(|n| core.spare_spec(&n.id).is_some() && !core.jobs().any(|r| r.is_bound_to(&n.id)))
            .count() as u32;
        let aws_nodes = core
            .fleet()
            .iter()
            .filter(|n| {
                n.tags.get("tier").is_some_and(|t| t == "aws")
                    && n.phase != norsk_auto_manager::model::NodePhase::Stopped
            })
            .count();
        if spares > target || (spares < target && aws_nodes < 4) {
            return Err(format!(
                "spares did not converge: {spares} of {target} with {aws_nodes} of 4 aws nodes"
            ));
        }
        Ok(())
    }
}

fn run_seed(seed: u64, steps: usize) -> Result<(), String> {
    let trace = std::env::var("CORE_SIM_TRACE").is_ok();
    let mut model = Model::new(seed, trace);
    model
        .check(&BTreeSet::new(), &BTreeSet::new())
        .map_err(|e| format!("setup: {e}"))?;
    for step in 0..steps {
        if trace {
            eprintln!("--- step {step} at {}", model.h.now);
        }
        let broken: BTreeSet<BundleId> = model.h.core.broken_bundles().keys().cloned().collect();
        let dropped: BTreeSet<JobId> = model
            .h
            .core
            .jobs()
            .filter(|r| r.dropped)
            .map(|r| r.job.job_id.clone())
            .collect();
        model.step();
        model
            .check(&broken, &dropped)
            .map_err(|e| format!("step {step}: {e}"))?;
    }
    model.spares_converge().map_err(|e| format!("settling: {e}"))
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

#[test]
fn core_invariants_hold_under_random_events_and_faults() {
    let steps = env("CORE_SIM_STEPS", 300) as usize;
    let seeds: Vec<u64> = match std::env::var("CORE_SIM_SEED").ok().and_then(|v| v.parse().ok()) {
        Some(seed) => vec![seed],
        None => (0..env("CORE_SIM_SEEDS", 2_000)).collect(),
    };
    // Every seed runs (on as many threads as there are cores), so a wide
    // run reports all its failures at once.
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(seeds.len().max(1));
    let failures: Vec<(u64, String)> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let seeds = &seeds;
                scope.spawn(move || {
                    seeds
                        .iter()
                        .skip(t)
                        .step_by(threads)
                        .filter_map(|&seed| run_seed(seed, steps).err().map(|e| (seed, e)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let mut all: Vec<(u64, String)> = workers
            .into_iter()
            .flat_map(|w| w.join().expect("seed runner"))
            .collect();
        all.sort();
        all
    });
    if !failures.is_empty() {
        let report: Vec<String> = failures
            .iter()
            .map(|(seed, e)| {
                format!(
                    "seed {seed} failed at {e}\n  replay: CORE_SIM_SEED={seed} CORE_SIM_STEPS={steps} CORE_SIM_TRACE=1 \
                     cargo test --release --test core_simulation core_invariants -- --nocapture"
                )
            })
            .collect();
        panic!(
            "{} of {} seeds failed:\n{}",
            failures.len(),
            seeds.len(),
            report.join("\n")
        );
    }
}

#[test]
fn the_simulation_exercises_recovery_breaking_and_provisioning() {
    // Guards the simulation itself: across a few seeds, the interesting
    // paths must actually be taken, or the invariants prove little.
    let mut recoveries = 0;
    let (mut broken, mut provisions, mut dropped) = (0, 0, 0);
    let (mut drains_done, mut drains_partial) = (0, 0);
    let (mut migrated, mut rolled_back) = (0, 0);
    for seed in 0..50 {
        let mut model = Model::new(seed, false);
        for _ in 0..300 {
            for (_, action) in &model.h.actions {
                match action {
                    Action::Notify(Notification::PlacementDecision(info)) if info.recovery => recoveries += 1,
                    Action::Notify(Notification::BundleBroken { .. }) => broken += 1,
                    Action::Notify(Notification::JobDropped { .. }) => dropped += 1,
                    Action::Notify(Notification::DrainProgress(state)) => match state.phase {
                        DrainPhase::Done => drains_done += 1,
                        DrainPhase::Partial => drains_partial += 1,
                        _ => {}
                    },
                    Action::Notify(Notification::MigrationCompleted { .. }) => migrated += 1,
                    Action::Notify(Notification::MigrationAborted { lost: false, .. }) => rolled_back += 1,
                    Action::Call {
                        rpc: Rpc::CreateNode { .. },
                        ..
                    } => provisions += 1,
                    _ => {}
                }
            }
            model
                .check(&BTreeSet::new(), &BTreeSet::new())
                .expect("invariants hold");
            model.step();
        }
    }
    assert!(
        drains_done > 0 && drains_partial > 0,
        "drains done {drains_done}, partial {drains_partial}"
    );
    assert!(
        recoveries > 0 && broken > 0 && provisions > 0 && dropped > 0,
        "recoveries {recoveries}, broken {broken}, provisions {provisions}, dropped {dropped}"
    );
    assert!(
        migrated > 0 && rolled_back > 0,
        "migrations completed {migrated}, rolled back {rolled_back}"
    );
}

#[test]
fn the_simulation_exercises_spares_being_provisioned_consumed_and_trimmed() {
    // Guards the spare invariants: the paths they watch must be taken.
    let (mut provisioned, mut consumed, mut trimmed, mut refused_held) = (0, 0, 0, 0);
    for seed in 0..50 {
        let mut model = Model::new(seed, false);
        let mut spares = BTreeSet::new();
        for _ in 0..300 {
            for (_, action) in &model.h.actions {
                match action {
                    Action::Call {
                        rpc: Rpc::CreateNode { node_id, tags, .. },
                        ..
                    } if tags.contains_key("spare") => {
                        provisioned += 1;
                        spares.insert(node_id.clone());
                    }
                    Action::Call {
                        rpc: Rpc::UpdateNodeTags { remove, .. },
                        ..
                    } if remove.iter().any(|t| t == "spare") => consumed += 1,
                    Action::Call {
                        rpc: Rpc::TerminateNode { node_id },
                        ..
                    } if spares.contains(node_id) => trimmed += 1,
                    _ => {}
                }
            }
            model
                .check(&BTreeSet::new(), &BTreeSet::new())
                .expect("invariants hold");
            model.step();
        }
        refused_held += model.refused_held;
    }
    assert!(
        provisioned > 0 && consumed > 0 && trimmed > 0,
        "provisioned {provisioned}, consumed {consumed}, trimmed {trimmed}"
    );
    assert!(
        refused_held > 0,
        "no start was refused for an instance held on a stopping node"
    );
}
