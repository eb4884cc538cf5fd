//! Starting a migration: the refusals (`not running`, `not
//! AutoManager-placed`, one already in flight), then the target through the
//! same placement path as any other job — requirements, host ports,
//! resilience, hot spares, provision-a-node — with the source node excluded
//! and an explicit target as a pin. "A migration passes no
//! `onRuntimeFailure` to placement: the reserve is protected by
//! reservation there, not by the spare penalty." The target is reserved on
//! its node beside the source from here on.

use crate::model::{InstanceKey, JobId, NodePhase, Slot, UnixMillis};
use crate::placement::{Outcome, PlacementRequest, RecoveryContext, apply_placement, place, placed_job};

use super::{
    MigrationCall, MigrationId, MigrationOptions, MigrationPhase, MigrationRefusal, MigrationState, MigrationStrategy,
};
use crate::automanager::binding::{Binding, BindingPhase, MigrationClaim};
use crate::automanager::core::{AutoManagerCore, Pending};
use crate::automanager::dispatch::{NodeIds, PlacementView, decision_of};
use crate::automanager::notification::PlacementDecisionInfo;
use crate::automanager::{Notification, Rpc};

/// Where placement put a target.
struct TargetPlacement {
    node_id: crate::model::NodeId,
    gpu_index: Option<u32>,
}

impl AutoManagerCore {
    /// `migrateJob`: places the target and dispatches its `StartJob` (or
    /// provisions its node); the saga then runs on Manager's events. The
    /// drain calls this for every job of the node it drains: consecutive
    /// calls with nothing else changing the fleet or the bindings in
    /// between reuse the placement view as the previous one left it.
    pub(crate) fn migrate_job(
        &mut self,
        job_id: &JobId,
        options: &MigrationOptions,
        now: UnixMillis,
    ) -> Result<MigrationId, MigrationRefusal> {
        // Nothing is placed before Manager's snapshot is complete.
        if !self.hydrated {
            return Err(MigrationRefusal::NotHydrated { job_id: job_id.clone() });
        }
        let record = self
            .jobs
            .get(job_id)
            .ok_or_else(|| MigrationRefusal::NotAutoManagerPlaced { job_id: job_id.clone() })?;
        if let Some(claim) = &record.migration {
            return Err(MigrationRefusal::AlreadyMigrating {
                job_id: job_id.clone(),
                migration_id: claim.migration_id.clone(),
            });
        }
        let source = record
            .binding
            .clone()
            .filter(|b| b.phase == BindingPhase::Running && record.in_flight.is_none() && !record.dropped)
            .ok_or_else(|| MigrationRefusal::NotRunning { job_id: job_id.clone() })?;
        if self.broken.contains_key(&record.bundle_ref.bundle_id) {
            return Err(MigrationRefusal::BundleBroken {
                job_id: job_id.clone(),
                bundle_id: record.bundle_ref.bundle_id.clone(),
            });
        }
        if options.target_node_id.as_ref() == Some(&source.node_id) {
            return Err(MigrationRefusal::TargetIsSource {
                job_id: job_id.clone(),
                node_id: source.node_id,
            });
        }
        let slot = source
            .instance_key
            .slot_of()
            .unwrap_or_else(|| Slot::of_replica(record.bundle_ref.replica_index));
        let target = self.place_target(job_id, &source, options, now)?;
        let (migration_id, tag) = self.migrations.next_id(job_id, now);
        let target_key = InstanceKey::migration_target(slot, tag);
        if let Some(record) = self.jobs.get_mut(job_id) {
            record.migration = Some(MigrationClaim {
                migration_id: migration_id.clone(),
                target: Binding {
                    node_id: target.node_id.clone(),
                    instance_key: target_key.clone(),
                    gpu_index: target.gpu_index,
                    phase: BindingPhase::AwaitingNode,
                    uncounted: true,
                },
            });
        }
        self.migrations.insert(MigrationState {
            migration_id: migration_id.clone(),
            job_id: job_id.clone(),
            strategy: options.strategy,
            phase: MigrationPhase::Placing,
            transitions: Vec::new(),
            source_node_id: source.node_id,
            source_key: source.instance_key,
            target_node_id: target.node_id,
            target_key,
            past_point_of_no_return: false,
            phase_deadline: None,
            reason: None,
        });
        self.enter_phase(&migration_id, MigrationPhase::Placing, now);
        self.dispatch_target_if_ready(&migration_id, now);
        Ok(migration_id)
    }

    /// Places the target: the ordinary engine, in a migration's context
    /// (the source excluded, no `onRuntimeFailure`), pinned when asked.
    fn place_target(
        &mut self,
        job_id: &JobId,
        source: &Binding,
        options: &MigrationOptions,
        now: UnixMillis,
    ) -> Result<TargetPlacement, MigrationRefusal> {
        let nowhere = |reason: String| MigrationRefusal::NowhereToPlace {
            job_id: job_id.clone(),
            reason,
        };
        let record = self
            .jobs
            .get(job_id)
            .ok_or_else(|| nowhere("the job is unknown".to_owned()))?;
        let job_ref = record.bundle_ref.clone();
        let bundle = self
            .bundles
            .get(&job_ref.bundle_id)
            .cloned()
            .ok_or_else(|| MigrationRefusal::NotAutoManagerPlaced { job_id: job_id.clone() })?;
        let context = RecoveryContext {
            on_runtime_failure: None,
            excluded_nodes: vec![source.node_id.clone()],
        };
        let mut request = PlacementRequest::launch(
            &bundle.bundle_id,
            &bundle.spec,
            job_ref.replica_index,
            &job_ref.job_name,
        )
        .recovering(&context)
        .with_trace(self.settings.trace_placements);
        request.override_reservation |= options.override_reservation;
        if let Some(pin) = &options.target_node_id {
            request = request.pinned_to(pin);
        }
        // Held-back tiers and exhausted offerings shape the pools as in a
        // placement round (a view of its own then); otherwise the kept view,
        // which keeps the target's reservation.
        let mut view = if self.capacity_held_back(now) {
            self.view_cache = None;
            let pools = self.effective_pools(now).map_err(nowhere)?;
            PlacementView::Once(Box::new(self.view_with(pools).map_err(|e| nowhere(e.to_string()))?))
        } else {
            let kept = match self.view_cache.take() {
                Some(cache) if self.migrations.view_in_sync => cache,
                other => {
                    self.view_cache = other;
                    self.synced_view().map_err(|e| nowhere(e.to_string()))?
                }
            };
            PlacementView::Kept(Box::new(kept))
        };
        self.migrations.view_in_sync = false;
        self.counters.placements_attempted += 1;
        let mut ids = NodeIds {
            serial: &mut self.next_node_serial,
        };
        let placement = match place(view.fleet_view(), request, &mut ids) {
            Ok(placement) => placement,
            Err(e) => {
                self.restore_view(view);
                self.counters.placements_failed += 1;
                return Err(nowhere(e.to_string()));
            }
        };
        let decision = decision_of(&placement.outcome);
        self.notify(Notification::PlacementDecision(Box::new(PlacementDecisionInfo {
            job_id: job_id.clone(),
            bundle_id: job_ref.bundle_id.clone(),
            replica_index: job_ref.replica_index,
            job_name: job_ref.job_name.clone(),
            // A move, not a re-placement after a loss.
            recovery: false,
            decision,
            trace: placement.trace.clone(),
        })));
        let (node_id, gpu_index) = match &placement.outcome {
            Outcome::NoCapacityInAnyPool => {
                self.restore_view(view);
                self.counters.placements_failed += 1;
                let reason = "noCapacityInAnyPool".to_owned();
                self.notify(Notification::PlacementFailed {
                    job_id: job_id.clone(),
                    reason: reason.clone(),
                });
                return Err(nowhere(reason));
            }
            Outcome::Placed { node_id, gpu_index, .. } => (node_id.clone(), *gpu_index),
            Outcome::Provision {
                node_id,
                pool,
                tier,
                instance_type,
                gpu_index,
            } => {
                self.provision(job_id, node_id, pool.clone(), tier.clone(), instance_type.clone(), now);
                (node_id.clone(), *gpu_index)
            }
        };
        let reserved = apply_placement(view.fleet_view(), &request, &placement.outcome);
        // A view that gained a prospective node no longer matches what it
        // remembers of the fleet: it is built again next round.
        let provisioned = matches!(placement.outcome, Outcome::Provision { .. });
        if reserved.is_ok() && !provisioned {
            if let PlacementView::Kept(cache) = &mut view
                && let Some(spec) = bundle.spec.job(&job_ref.job_name)
            {
                let placed = placed_job(&bundle.bundle_id, job_ref.replica_index, spec, gpu_index);
                cache.reserved_target(job_id.clone(), node_id.clone(), placed);
            }
            self.migrations.view_in_sync = matches!(view, PlacementView::Kept(_));
            self.restore_view(view);
        } else {
            self.view_cache = None;
        }
        if placement.resilience.is_degraded() {
            self.notify(Notification::ResilienceDegraded {
                job_id: job_id.clone(),
                node_id: node_id.clone(),
                violations: placement.resilience.violations.clone(),
                interruptible_primary_without_durable_backup: placement
                    .resilience
                    .interruptible_primary_without_durable_backup,
            });
        }
        Ok(TargetPlacement { node_id, gpu_index })
    }

    /// Puts the kept view back after a target placement (a one-off view is
    /// dropped).
    fn restore_view(&mut self, view: PlacementView) {
        if let PlacementView::Kept(cache) = view {
            self.view_cache = Some(*cache);
        }
    }

    /// The target's `StartJob`, once its node runs: created with
    /// `deferStart` for `stopThenStart` (`preparing`), started otherwise
    /// (`starting`). It wears `<slot>@<id>` and is told its slot in
    /// `NORSK_RUNTIME_ROLE`.
    pub(super) fn dispatch_target_if_ready(&mut self, id: &MigrationId, now: UnixMillis) {
        let Some((state, claim)) = self.in_flight(id) else {
            return;
        };
        let target = &claim.target;
        let node_runs = self
            .fleet
            .get(&target.node_id)
            .is_some_and(|n| n.phase == NodePhase::Running && !n.terminated);
        if state.phase != MigrationPhase::Placing || target.phase != BindingPhase::AwaitingNode || !node_runs {
            return;
        }
        let defer_start = state.strategy == MigrationStrategy::StopThenStart;
        let rpc = Rpc::StartMigrationTarget {
            job_id: state.job_id.clone(),
            instance_key: target.instance_key.clone(),
            node_id: target.node_id.clone(),
            gpu_index: target.gpu_index,
            runtime_role: target
                .instance_key
                .slot_of()
                .map_or_else(|| target.instance_key.0.clone(), |s| s.as_str().to_owned()),
            defer_start,
            migration_id: id.clone(),
        };
        let job_id = state.job_id.clone();
        self.migrations.start_pending.insert(id.clone());
        self.call(
            rpc,
            Pending::Migration {
                migration_id: id.clone(),
                call: MigrationCall::StartTarget,
            },
        );
        if let Some(target) = self
            .jobs
            .get_mut(&job_id)
            .and_then(|r| r.migration.as_mut())
            .map(|c| &mut c.target)
        {
            target.phase = BindingPhase::Dispatched;
        }
        let next = if defer_start {
            MigrationPhase::Preparing
        } else {
            MigrationPhase::Starting
        };
        self.enter_phase(id, next, now);
    }
}
