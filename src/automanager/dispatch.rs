//! Placing and dispatching: every ready job through the placement engine
//! (the kept fleet view brought up to date once per round, each placement
//! seeing the ones before it),
//! the resulting `StartJob` / `CreateAwsNode` / `CreateOciNode` calls (their
//! results are `call_results`'), and what ends a binding: a job that
//! ended, a released or terminated node (a loss and its verdict are
//! `loss`').

use crate::model::{InstanceKey, JobId, NodeId, NodePhase, ProviderKind, Slot, UnixMillis, tags};
use crate::placement::{
    FleetView, Outcome, PlacementRequest, Rankings, ResilienceReport, apply_placement, place_ranked, placed_job,
};

use super::binding::{AwaitedStop, Binding, BindingPhase, StopWait, StoppingInstance};
use super::core::AutoManagerCore;
use super::facts::Facts;
use super::fleet::{Provisioned, provisioned_tags};
use super::notification::{Decision, Notification, PlacementDecisionInfo};
use super::outbox::{Outbox, Pending};
use super::protocol::Rpc;
use super::readiness::Readiness;
use super::recovery::{FAILED_INSTANCE_STOP_GRACE_MS, MIN_RECOVERY_INTERVAL_MS};
use super::view_cache::ViewCache;

/// The view a placement round (or a migration's target) runs against.
pub(super) enum PlacementView {
    /// The kept view, brought up to date.
    Kept(Box<ViewCache>),
    /// A view for this round only.
    Once(Box<FleetView>),
}

impl PlacementView {
    pub(super) fn fleet_view(&mut self) -> &mut FleetView {
        match self {
            Self::Kept(cache) => cache.view_mut(),
            Self::Once(view) => view,
        }
    }
}

/// The engine's outcome as `placementDecision` reports it.
pub(super) fn decision_of(outcome: &Outcome) -> Decision {
    match outcome.clone() {
        Outcome::Placed {
            node_id,
            pool,
            tier,
            gpu_index,
        } => Decision::Placed {
            node_id,
            pool,
            tier,
            gpu_index,
        },
        Outcome::Provision {
            node_id,
            pool,
            tier,
            instance_type,
            gpu_index,
        } => Decision::Provision {
            node_id,
            pool,
            tier,
            instance_type,
            gpu_index,
        },
        Outcome::NoCapacityInAnyPool => Decision::NoCapacityInAnyPool,
    }
}

impl AutoManagerCore {
    /// Places every job that is ready now.
    pub(super) fn place_ready(&mut self, now: UnixMillis) {
        let ready: Vec<JobId> = self
            .facts
            .jobs
            .values()
            .filter(|r| matches!(self.readiness(r, now), Readiness::At(at) if at <= now))
            .map(|r| r.job_id().clone())
            .collect();
        if ready.is_empty() {
            return;
        }
        let view = if self.facts.placed_with.capacity_held_back(now) {
            // Held-back tiers and offerings shape this round only: a view
            // of its own. The kept one is left as it is; the next round
            // brings it up to date (or builds it again, should this one
            // have provisioned).
            self.facts
                .placed_with
                .effective_pools(&self.facts.fleet, now)
                .and_then(|pools| self.view_with(pools).map_err(|e| e.to_string()))
                .map(|view| PlacementView::Once(Box::new(view)))
        } else {
            self.synced_view()
                .map(|cache| PlacementView::Kept(Box::new(cache)))
                .map_err(|e| e.to_string())
        };
        let mut view = match view {
            Ok(view) => view,
            Err(message) => {
                return self.notify(Notification::Error {
                    message: format!("placement skipped: {message}"),
                });
            }
        };
        let mut intact = true;
        let mut rankings = Rankings::for_burst();
        for job_id in &ready {
            intact &= self.place_one(view.fleet_view(), &mut rankings, job_id, now);
        }
        if let (PlacementView::Kept(mut cache), true) = (view, intact) {
            // What this round reserved in the view, so the next round's
            // bring-up-to-date does not reserve it twice.
            for job_id in ready {
                if let Some(record) = self.facts.jobs.get(&job_id)
                    && let Some(binding) = &record.binding
                {
                    let r = &record.bundle_ref;
                    let placed = placed_job(&r.bundle_id, r.replica_index, &record.job.spec, binding.gpu_index);
                    cache.reserved(job_id, binding.node_id.clone(), placed);
                }
            }
            self.view_cache = Some(*cache);
        }
    }

    /// Places one job; false when the view could not take its reservation
    /// (the view no longer matches the fleet).
    fn place_one(&mut self, view: &mut FleetView, rankings: &mut Rankings, job_id: &JobId, now: UnixMillis) -> bool {
        let Some(record) = self.facts.jobs.get(job_id) else {
            return true;
        };
        let Some(bundle) = self.facts.bundles.get(&record.bundle_ref.bundle_id).cloned() else {
            return true;
        };
        let job_ref = record.bundle_ref.clone();
        let recovery = record.recovery.clone();
        let mut request = PlacementRequest::launch(
            &bundle.bundle_id,
            &bundle.spec,
            job_ref.replica_index,
            &job_ref.job_name,
        )
        .with_trace(self.facts.settings().trace_placements);
        if let Some(context) = &recovery {
            request = request.recovering(context);
        }
        self.give_up_awaited_stop(job_id);
        self.counters.placements_attempted += 1;
        if recovery.is_some()
            && let Some(mut record) = self.facts.jobs.get_mut(job_id)
        {
            // Every recovery attempt counts for the spacing, whatever it
            // found.
            record.last_recovery_at = Some(now);
        }
        let placement = match place_ranked(view, request, &mut self.facts.node_ids, rankings) {
            Ok(placement) => placement,
            Err(e) => {
                self.placement_failed(job_id, e.to_string(), now);
                return true;
            }
        };
        let decision = decision_of(&placement.outcome);
        self.notify(Notification::PlacementDecision(Box::new(PlacementDecisionInfo {
            job_id: job_id.clone(),
            bundle_id: job_ref.bundle_id.clone(),
            replica_index: job_ref.replica_index,
            job_name: job_ref.job_name.clone(),
            recovery: recovery.is_some(),
            decision: decision.clone(),
            trace: placement.trace,
        })));
        let (node_id, gpu_index) = match decision {
            Decision::NoCapacityInAnyPool => {
                self.placement_failed(job_id, "noCapacityInAnyPool".to_owned(), now);
                return true;
            }
            Decision::Placed { node_id, gpu_index, .. } => (node_id, gpu_index),
            Decision::Provision {
                node_id,
                pool,
                tier,
                instance_type,
                gpu_index,
            } => {
                self.provision(job_id, &node_id, pool, tier, instance_type, now);
                (node_id, gpu_index)
            }
        };
        let reserved = apply_placement(view, &request, &placement.outcome);
        if let Err(e) = &reserved {
            self.notify(Notification::Error {
                message: format!("placement of {job_id} could not be reserved: {e}"),
            });
        }
        self.notify_if_degraded(job_id, &node_id, &placement.resilience);
        self.bind_placed(job_id, node_id, gpu_index, job_ref.replica_index);
        reserved.is_ok()
    }

    /// A job placed while an instance of it is still awaited: the grace
    /// ran out (see `FAILED_INSTANCE_STOP_GRACE_MS`), which is said; one
    /// held on a stopping node is waited for again should Manager refuse.
    fn give_up_awaited_stop(&mut self, job_id: &JobId) {
        if let Some(stuck) = self.facts.jobs.get(job_id).and_then(|r| self.awaited_stop(r)).cloned() {
            let StoppingInstance {
                node_id, instance_key, ..
            } = &stuck.instance;
            let (message, still) = match stuck.wait {
                StopWait::HeldOnStoppingNode => (
                    format!(
                        "instance {} of {job_id} is still held on stopping node {node_id} after \
                         {FAILED_INSTANCE_STOP_GRACE_MS} ms; trying its replacement again",
                        instance_key.0
                    ),
                    // Should Manager refuse again, the wait starts over.
                    Some(AwaitedStop {
                        wait: StopWait::LostWithStoppingNode,
                        ..stuck.clone()
                    }),
                ),
                _ => (
                    format!(
                        "instance {} of {job_id} on {node_id} did not report Stopped within \
                         {FAILED_INSTANCE_STOP_GRACE_MS} ms of failing; starting its replacement",
                        instance_key.0
                    ),
                    None,
                ),
            };
            self.notify(Notification::Error { message });
            if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
                record.stopping = still;
            }
        }
    }

    /// Binds a placed job to `node_id` and starts it there if the node
    /// runs (else its start waits for the node).
    fn bind_placed(&mut self, job_id: &JobId, node_id: NodeId, gpu_index: Option<u32>, replica_index: u32) {
        let running = self
            .facts
            .fleet
            .get(&node_id)
            .is_some_and(|n| n.phase == NodePhase::Running && !n.terminated);
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            record.binding = Some(Binding {
                node_id,
                instance_key: InstanceKey::slot(Slot::of_replica(replica_index)),
                gpu_index,
                phase: BindingPhase::AwaitingNode,
                uncounted: true,
                prepared_start_awaited: false,
            });
            record.awaiting_capacity_since = None;
        }
        if running {
            self.dispatch_start(job_id);
        }
    }

    /// Says a placement that keeps its job less resilient than its bundle
    /// asks (`resilienceDegraded`).
    pub(super) fn notify_if_degraded(&mut self, job_id: &JobId, node_id: &NodeId, resilience: &ResilienceReport) {
        if resilience.is_degraded() {
            self.notify(Notification::ResilienceDegraded {
                job_id: job_id.clone(),
                node_id: node_id.clone(),
                violations: resilience.violations.clone(),
                interruptible_primary_without_durable_backup: resilience.interruptible_primary_without_durable_backup,
            });
        }
    }

    /// A placement found nowhere: the job waits for the fleet to change.
    /// A recovery that kept off the nodes its job failed on found nowhere
    /// else: the next attempt, `MIN_RECOVERY_INTERVAL_MS` on, may use them
    /// — the exclusion spreads a recovery, it never keeps a job dark while
    /// the node it failed on could carry it.
    fn placement_failed(&mut self, job_id: &JobId, reason: String, now: UnixMillis) {
        self.counters.placements_failed += 1;
        let epoch = self.facts.capacity_epoch();
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            let excluded = record
                .recovery
                .as_mut()
                .map(|context| std::mem::take(&mut context.excluded_nodes));
            if excluded.as_ref().is_none_or(|nodes| nodes.is_empty()) {
                record.awaiting_capacity_since = Some(epoch);
            }
            if record.recovery.is_some() {
                record.not_before = now + MIN_RECOVERY_INTERVAL_MS;
            }
        }
        // "A typed failure callback (also surfaces via onError)".
        self.notify(Notification::Error {
            message: format!("placement of {job_id} failed: {reason}"),
        });
        self.notify(Notification::PlacementFailed {
            job_id: job_id.clone(),
            reason,
        });
    }

    pub(super) fn provision(
        &mut self,
        job_id: &JobId,
        node_id: &NodeId,
        pool: String,
        tier: String,
        instance_type: String,
        now: UnixMillis,
    ) {
        let Some(tier_spec) = self
            .facts
            .pools()
            .get(&pool)
            .and_then(|p| p.tiers.iter().find(|t| t.name == tier))
        else {
            return;
        };
        let provisioned = Provisioned {
            kind: tier_spec.kind,
            region: tier_spec.region.clone().unwrap_or_default(),
            start_deadline: now + tier_spec.effective_provision_timeout_ms() as i64,
            pool,
            tier,
            instance_type,
            for_job: Some(job_id.clone()),
        };
        let rpc = Rpc::CreateNode {
            provider: provisioned.kind,
            node_id: node_id.clone(),
            tags: provisioned_tags(&provisioned),
            region: provisioned.region.clone(),
            availability_domain: tier_spec.availability_domain.clone(),
            instance_type: provisioned.instance_type.clone(),
            launch_mode: tier_spec.launch_mode,
            root_volume: tier_spec.root_volume.clone(),
        };
        self.facts.fleet.add_provisioned(node_id.clone(), provisioned);
        self.call(
            rpc,
            Pending::CreateNode {
                node_id: node_id.clone(),
                for_job: job_id.clone(),
            },
        );
    }

    /// `StartJob` for every job waiting on a node that just started.
    pub(super) fn dispatch_awaiting(&mut self, node_id: &NodeId) {
        let waiting: Vec<JobId> = self
            .facts
            .jobs
            .values()
            .filter(|r| {
                r.binding
                    .as_ref()
                    .is_some_and(|b| &b.node_id == node_id && b.phase == BindingPhase::AwaitingNode)
            })
            .map(|r| r.job_id().clone())
            .collect();
        for job_id in waiting {
            self.dispatch_start(&job_id);
        }
    }

    fn dispatch_start(&mut self, job_id: &JobId) {
        let Some(record) = self.facts.jobs.get(job_id) else {
            return;
        };
        let Some(binding) = &record.binding else {
            return;
        };
        // The in-flight gate: never a second dispatch while one is pending.
        if record.in_flight.is_some() || binding.phase != BindingPhase::AwaitingNode {
            return;
        }
        let rpc = Rpc::StartJob {
            job_id: job_id.clone(),
            instance_key: binding.instance_key.clone(),
            node_id: binding.node_id.clone(),
            gpu_index: binding.gpu_index,
            runtime_role: binding
                .instance_key
                .slot_of()
                .map_or_else(|| binding.instance_key.0.clone(), |s| s.as_str().to_owned()),
        };
        let pending = Pending::StartJob {
            job_id: job_id.clone(),
            instance_key: binding.instance_key.clone(),
            node_id: binding.node_id.clone(),
        };
        let id = self.call(rpc, pending);
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            record.in_flight = Some(id);
            if let Some(binding) = record.binding.as_mut() {
                binding.phase = BindingPhase::Dispatched;
            }
        }
    }

    /// The job's instance ended without a failure (see
    /// [`Facts::end_binding`]).
    pub(super) fn end_binding(&mut self, job_id: &JobId) {
        self.unbind(job_id, true);
    }

    /// Ends the binding (see [`Facts::unbind`]).
    pub(super) fn unbind(&mut self, job_id: &JobId, single_use_release: bool) {
        self.facts.unbind(&mut self.outbox, job_id, single_use_release);
    }

    /// After a job left `node_id` (see [`Facts::release_node`]).
    pub(super) fn release_node(&mut self, node_id: &NodeId, single_use: bool) {
        self.facts.release_node(&mut self.outbox, node_id, single_use);
    }
}

/// The binding ends and the node is released: what the loss, the saga,
/// the events and the placement round share.
impl Facts {
    /// The job's instance ended without a failure (window over, stopped on
    /// request, deleted, dispatch refused): the binding ends, nothing is
    /// counted.
    pub(super) fn end_binding(&mut self, outbox: &mut Outbox, job_id: &JobId) {
        self.unbind(outbox, job_id, true);
    }

    /// Ends the binding; `single_use_release` says whether a `singleUse`
    /// job's node is terminated with it.
    pub(super) fn unbind(&mut self, outbox: &mut Outbox, job_id: &JobId, single_use_release: bool) {
        let Some(mut record) = self.jobs.get_mut(job_id) else {
            return;
        };
        let Some(binding) = record.binding.take() else {
            return;
        };
        let single_use = record.job.spec.single_use && single_use_release;
        drop(record);
        self.release_node(outbox, &binding.node_id, single_use);
    }

    /// After a job left `node_id`: a node this core provisioned that is
    /// still launching and now carries nothing is terminated (it would be a
    /// leaked node), and a `singleUse` job's provisioned cloud node is
    /// terminated rather than left for reuse (never a cluster node). Before
    /// hydration the release waits for the fleet to be known.
    pub(super) fn release_node(&mut self, outbox: &mut Outbox, node_id: &NodeId, single_use: bool) {
        if !self.hydrated {
            self.held_releases.push((node_id.clone(), single_use));
            return;
        }
        let Some(node) = self.fleet.get(node_id) else {
            return;
        };
        if node.terminated || node.is_going() {
            return;
        }
        let provisioned_here = node.provisioned.is_some();
        let provisioned_cloud = (provisioned_here || node.tags.contains_key(tags::PROVISIONED_FOR))
            && node
                .inventory
                .as_ref()
                .map_or(provisioned_here, |i| i.kind != ProviderKind::LocalServers);
        let single_use = (single_use && provisioned_cloud) || node.release_when_empty;
        if self.jobs.values().any(|r| r.is_bound_to(node_id)) || self.hosts_migration_target(node_id) {
            // A single-use job left company behind (its co-located peers):
            // the node goes once they have left too.
            if single_use {
                self.fleet.release_when_empty(node_id);
            }
            return;
        }
        if (provisioned_here && node.is_launching()) || single_use {
            self.terminate(outbox, node_id);
        }
    }
}
