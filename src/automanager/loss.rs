//! Loss and verdicts: an instance lost (failed, refused, gone with its
//! node) ends its binding, and the failure policy ([`super::recovery`]'s
//! restart ceiling and spacing) judges what comes of it — placed again, or
//! a terminal outcome (a dropped job, a broken bundle) announced and
//! written to Manager as a verdict. A loss seen while hydrating waits to be
//! judged once hydrated.

use crate::model::{JobId, NodePhase, TerminalVerdict, UnixMillis, VerdictKind};
use crate::placement::RecoveryContext;

use super::binding::{AwaitedStop, Binding, BindingPhase, StopWait, StoppingInstance, UnjudgedLoss};
use super::core::AutoManagerCore;
use super::drain::state::Drains;
use super::facts::Facts;
use super::metrics::Counters;
use super::notification::Notification;
use super::outbox::{Outbox, Pending};
use super::protocol::Rpc;
use super::recovery::{FailureVerdict, LossCause, judge};

/// What loss and its verdicts are handed: the facts (the broken marks
/// among them), the outbox, the counters and the drains (a node lost under
/// an interruption notice was reclaimed).
pub(super) struct Losses<'a> {
    facts: &'a mut Facts,
    outbox: &'a mut Outbox,
    counters: &'a mut Counters,
    drains: &'a Drains,
}

impl AutoManagerCore {
    /// The core taken apart for a loss.
    pub(super) fn losses(&mut self) -> Losses<'_> {
        Losses {
            facts: &mut self.facts,
            outbox: &mut self.outbox,
            counters: &mut self.counters,
            drains: &self.drains,
        }
    }
}

impl Losses<'_> {
    /// An instance was lost: the binding ends and the failure policy judges
    /// whether the job is re-placed or ends terminally. While hydrating,
    /// only the binding ends; a loss with a node is kept for judging once
    /// hydrated (see [`JobRecord::unjudged_loss`]).
    pub(super) fn lose_instance(&mut self, job_id: &JobId, cause: LossCause, now: UnixMillis) {
        let hydrated = self.facts.hydrated;
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        let Some(binding) = record.binding.take() else {
            return;
        };
        let single_use = record.job.spec.single_use;
        drop(record);
        let cause = match cause {
            LossCause::NodeLost if self.drains.is_reclaimed(&binding.node_id) => LossCause::Reclaimed,
            cause => cause,
        };
        let with_node = matches!(cause, LossCause::NodeLost | LossCause::Reclaimed);
        let node_stopping = with_node
            && self
                .facts
                .fleet
                .get(&binding.node_id)
                .is_some_and(|n| n.phase == NodePhase::Stopping);
        if hydrated {
            self.judge_loss(job_id, &binding, &cause, node_stopping, now);
        } else if with_node && let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            record.unjudged_loss = Some(UnjudgedLoss {
                lost: binding.clone(),
                node_stopping,
                reclaimed: cause == LossCause::Reclaimed,
                at: now,
            });
        }
        if !with_node {
            self.facts.release_node(self.outbox, &binding.node_id, single_use);
        }
    }

    /// The failure policy's verdict on the loss of `job_id`'s instance
    /// `lost` at `now`: re-placed away from its node, spaced from the last
    /// recovery, or ended terminally.
    pub(super) fn judge_loss(
        &mut self,
        job_id: &JobId,
        lost: &Binding,
        cause: &LossCause,
        node_stopping: bool,
        now: UnixMillis,
    ) {
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        // A job that has ended ends no more.
        if record.dropped || record.job.terminal_verdict.is_some() {
            return;
        }
        let requirements = record.job.spec.requirements.clone();
        let verdict = judge(
            self.facts.placed_with.settings(),
            &requirements,
            &mut record.restarts,
            cause,
            now,
        );
        match verdict {
            FailureVerdict::Restart => {
                record.recovery = Some(RecoveryContext {
                    on_runtime_failure: Some(requirements.on_runtime_failure),
                    excluded_nodes: vec![lost.node_id.clone()],
                });
                // Lost with a node that is stopping, not stopped:
                // Manager may still hold the instance there. Recovery
                // stays prompt; a start refused for it waits for it.
                if node_stopping {
                    record.stopping = Some(AwaitedStop {
                        instance: StoppingInstance {
                            node_id: lost.node_id.clone(),
                            instance_key: lost.instance_key.clone(),
                            since: now,
                        },
                        wait: StopWait::LostWithStoppingNode,
                    });
                }
                // Spaced from the previous recovery by `readiness`.
                record.not_before = now;
            }
            FailureVerdict::Terminal {
                reason,
                ceiling_reached,
            } => {
                drop(record);
                self.terminal(job_id, reason, ceiling_reached, now);
            }
        }
    }

    /// A runtime ended terminally: an essential one breaks its bundle
    /// (verdict to Manager, `bundleBroken`, no replica placed again); a
    /// non-essential one is dropped alone.
    fn terminal(&mut self, job_id: &JobId, reason: String, ceiling: bool, now: UnixMillis) {
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        record.dropped = true;
        record.recovery = None;
        let essential = record.job.spec.requirements.is_essential();
        let bundle_id = record.bundle_ref.bundle_id.clone();
        drop(record);
        // `jobDropped`: `drop`, an invalid spec, or a non-essential job
        // past its ceiling.
        if !ceiling || !essential {
            self.counters.jobs_dropped += 1;
            self.outbox.notify(Notification::JobDropped {
                job_id: job_id.clone(),
                reason: reason.clone(),
            });
        }
        let (job, kind) = if essential {
            if self.facts.broken.contains_key(&bundle_id) {
                return;
            }
            self.facts.broken.insert(bundle_id.clone(), reason.clone());
            self.withhold_unstarted(&bundle_id);
            self.counters.bundles_broken += 1;
            self.outbox.notify(Notification::BundleBroken {
                bundle_id: bundle_id.clone(),
                reason: reason.clone(),
            });
            (None, VerdictKind::Broken)
        } else {
            (Some(job_id.clone()), VerdictKind::Dropped)
        };
        let generation = self.facts.bundles.get(&bundle_id).map_or(0, |b| b.generation);
        self.outbox.call(
            Rpc::SetTerminalVerdict {
                bundle_id,
                job_id: job,
                verdict: TerminalVerdict {
                    kind,
                    reason,
                    at: Some(now),
                },
                generation,
            },
            Pending::Verdict,
        );
    }

    /// A broken bundle "stops placing every replica of it": a job of it
    /// placed on a node still launching, its `StartJob` not yet sent, is
    /// not started there when the node comes up; a node provisioned for it
    /// and carrying nothing else is released with it.
    pub(super) fn withhold_unstarted(&mut self, bundle_id: &crate::model::BundleId) {
        let waiting: Vec<JobId> = self
            .facts
            .jobs
            .values()
            .filter(|r| {
                &r.bundle_ref.bundle_id == bundle_id
                    && r.binding
                        .as_ref()
                        .is_some_and(|b| b.phase == BindingPhase::AwaitingNode)
            })
            .map(|r| r.job_id().clone())
            .collect();
        for job_id in waiting {
            self.facts.end_binding(self.outbox, &job_id);
        }
    }
}
