//! Things that happen later: a node finishing its boot, an instance reaching
//! running, a keepalive expiring. Each is an [`Action`] due at a simulated
//! instant; the server's timer task fires them in (instant, order of
//! scheduling) order, which keeps a seeded run reproducible. An action
//! re-checks the state when it fires, because the world may have moved on
//! (a node terminated before it booted, an instance stopped and started
//! again).

use std::collections::BTreeMap;
use std::time::Duration;

use super::World;
use crate::manager::proto::manager as pb;

/// What a timer does when it fires.
#[derive(Debug, Clone)]
pub(crate) enum Action {
    /// A cloud node finished booting: started, with its inventory.
    NodeBooted(String),
    /// Manager reports the node stopped (terminate finished, keepalive
    /// expired, or the provider took it).
    NodeGone(String),
    /// An interruption notice's deadline: the provider reclaims the node.
    Reclaim(String),
    /// An instance finished its start (running, prepared, or rejected).
    InstanceReady {
        job: String,
        /// The instance key.
        role: String,
        /// Which start of that key this was.
        incarnation: u64,
    },
    /// An instance finished stopping.
    InstanceStopped {
        job: String,
        /// The instance key.
        role: String,
        /// Which start of that key this was.
        incarnation: u64,
    },
    /// A node finished pulling images.
    ImagesPulled {
        node: String,
        /// The references asked for.
        images: Vec<String>,
    },
    /// An instance answers a handover step.
    MigrationAnswer(pb::MigrationSignalEvent),
    /// A `PRE` job's `start_date_time` has come: it turns `ACTIVE`.
    WindowOpens(String),
}

/// Pending actions, ordered by due instant then by scheduling order.
#[derive(Debug, Default)]
pub(crate) struct Timers {
    queue: BTreeMap<(i64, u64), Action>,
    seq: u64,
}

impl Timers {
    /// Queues `action` at `at`; true when it is now the earliest (the timer
    /// task must wake to re-plan its sleep).
    pub fn push(&mut self, at: i64, action: Action) -> bool {
        self.seq += 1;
        let earliest = self.queue.keys().next().is_none_or(|&(first, _)| at < first);
        self.queue.insert((at, self.seq), action);
        earliest
    }

    fn pop_due(&mut self, now: i64) -> Option<(i64, Action)> {
        let (&(at, seq), _) = self.queue.iter().next()?;
        if at > now {
            return None;
        }
        self.queue.remove(&(at, seq)).map(|action| (at, action))
    }

    fn next_due(&self) -> Option<i64> {
        self.queue.keys().next().map(|&(at, _)| at)
    }
}

impl World {
    /// Fires every action that is due and says how long to really wait for
    /// the next one (`None`: nothing is scheduled).
    pub fn fire_due(&mut self) -> Option<Duration> {
        loop {
            let now = self.clock.now_ms();
            let Some((at, action)) = self.timers.pop_due(now) else {
                break;
            };
            self.firing_at = Some(at);
            self.fire(action);
            self.firing_at = None;
        }
        self.timers.next_due().map(|at| self.clock.real_wait_until(at))
    }

    fn fire(&mut self, action: Action) {
        match action {
            Action::NodeBooted(node) => self.node_booted(&node),
            Action::NodeGone(node) => self.node_gone(&node),
            Action::Reclaim(node) => self.reclaim(&node),
            Action::InstanceReady { job, role, incarnation } => self.instance_ready(&job, &role, incarnation),
            Action::InstanceStopped { job, role, incarnation } => self.instance_stopped(&job, &role, incarnation),
            Action::ImagesPulled { node, images } => self.images_pulled(&node, &images),
            Action::MigrationAnswer(answer) => self.migration_answer(answer),
            Action::WindowOpens(job) => self.open_window(&job),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn due_actions_come_out_in_instant_then_scheduling_order() {
        let mut t = Timers::default();
        assert!(t.push(20, Action::NodeGone("b".into())));
        assert!(t.push(10, Action::NodeGone("a".into())));
        assert!(!t.push(10, Action::NodeGone("a2".into())));
        let order: Vec<_> = std::iter::from_fn(|| t.pop_due(15))
            .map(|(_, a)| match a {
                Action::NodeGone(n) => n,
                other => format!("{other:?}"),
            })
            .collect();
        assert_eq!(order, ["a", "a2"]);
        assert_eq!(t.next_due(), Some(20));
    }
}
