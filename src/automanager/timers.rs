//! The core's timers: the next deadline a step asks to be woken at, and
//! what falls due then (provisions that never started, unhealthy
//! cooldowns, the stopped-node sweep, provision backoffs, drains).

use crate::model::{NodePhase, UnixMillis};

use super::core::AutoManagerCore;
use super::notification::Notification;
use super::readiness::Readiness;

impl AutoManagerCore {
    /// The earliest instant something falls due (none while following or
    /// closed).
    pub(super) fn next_deadline(&self, now: UnixMillis) -> Option<UnixMillis> {
        if !self.facts.hydrated || self.closed {
            return None;
        }
        let facts = &self.facts;
        let jobs = self.facts.jobs.values().filter_map(|r| match self.readiness(r, now) {
            Readiness::At(at) if at > now => Some(at),
            _ => None,
        });
        let sweep_after = self.facts.settings().remove_stopped_nodes_after as i64 * 1_000;
        let nodes = self.facts.fleet.iter().flat_map(|n| {
            let start = n
                .provisioned
                .as_ref()
                .filter(|_| n.is_launching() && !n.terminated)
                .map(|p| p.start_deadline);
            let sweep = n.stopped_at.map(|at| at + sweep_after);
            [start, n.health.unhealthy_until(), sweep]
        });
        jobs.chain(nodes.flatten())
            .chain(self.facts.placed_with.holds())
            .chain(self.subsystems.next_deadline(facts, now))
            .chain(self.drains.next_deadline())
            .chain(self.migrations.next_deadline())
            .chain(self.manual.deadline(now))
            .min()
            .map(|at| at.max(now))
    }

    /// Timers due at `now`: provisions that never started, unhealthy
    /// cooldowns, the stopped-node sweep, provision backoffs.
    pub(super) fn expire(&mut self, now: UnixMillis) {
        let overdue: Vec<_> = self
            .facts
            .fleet
            .iter()
            .filter(|n| {
                n.is_launching() && !n.terminated && n.provisioned.as_ref().is_some_and(|p| p.start_deadline <= now)
            })
            .map(|n| n.id.clone())
            .collect();
        for node_id in overdue {
            // `provisionTimeoutMs`: its jobs are re-placed; the node, past
            // its startup grace, is terminated.
            for job_id in self.facts.jobs_bound_to(&node_id) {
                if let Some(mut record) = self.facts.jobs.get_mut(&job_id) {
                    record.binding = None;
                }
            }
            self.terminate(&node_id);
        }
        let healed: Vec<_> = self
            .facts
            .fleet
            .iter()
            .filter(|n| n.health.unhealthy_until().is_some_and(|at| at <= now))
            .map(|n| n.id.clone())
            .collect();
        for node_id in healed {
            if self.facts.fleet.heal(&node_id, now) {
                self.notify(Notification::NodeHealthy { node_id });
            }
        }
        let sweep_after = self.facts.settings().remove_stopped_nodes_after as i64 * 1_000;
        let swept: Vec<_> = self
            .facts
            .fleet
            .iter()
            .filter(|n| n.phase == NodePhase::Stopped && n.stopped_at.is_some_and(|at| at + sweep_after <= now))
            .map(|n| n.id.clone())
            .collect();
        for node_id in swept {
            // A provider-stopped instance still exists (and costs); the
            // sweep terminates it. Anything else stopped is already gone.
            if self
                .facts
                .fleet
                .get(&node_id)
                .is_some_and(|n| n.stop_reason == Some(crate::model::NodeStopReason::ProviderStop) && !n.terminated)
            {
                self.terminate(&node_id);
            }
            self.facts.fleet.sweep(&node_id);
        }
        self.expire_drains(now);
        self.facts.placed_with.expire_held_back(now);
    }
}
