//! Applying Manager's events to the core: jobs (and their history, which
//! says where each instance is), nodes, inventories, bundles, rejections.
//! Before `InitialDataComplete` the snapshot is replayed through these same
//! paths, as if fresh, but nothing is recovered or placed.

use crate::model::{
    Bundle, BundleId, InstanceKey, JobHistoryEntry, JobId, JobState, JobStopReason, ManagerEvent, NodeId, NodeInfo,
    NodePhase, RuntimeJob, Slot, UnixMillis, VerdictKind, tags,
};

use super::binding::{AwaitedStop, Binding, BindingPhase, JobRecord, StopWait, StoppingInstance};
use super::core::AutoManagerCore;
use super::fleet::Provisioned;
use super::history::{instance_since, open_instances};
use super::notification::Notification;
use super::recovery::{LossCause, replay_restart};

impl AutoManagerCore {
    pub(super) fn apply_event(&mut self, event: ManagerEvent, now: UnixMillis) {
        match event {
            ManagerEvent::JobActive(job)
            | ManagerEvent::JobPending(job)
            | ManagerEvent::JobUpdated(job)
            | ManagerEvent::JobOutOfWindow(job) => self.job_changed(job, now),
            ManagerEvent::JobDeleted(job_id) => self.job_deleted(job_id, now),
            ManagerEvent::InitialDataComplete => self.hydrated_now(now),
            ManagerEvent::NodeStarting(info) => {
                self.facts.fleet.starting(&info);
                self.adopt_provisioned(&info, now);
                let node_id = info.node_id.clone();
                self.notify(Notification::NodeStarting { node: info });
                self.terminate_unheard_create(&node_id);
            }
            ManagerEvent::NodeStarted(info) | ManagerEvent::NodeRunning { node: info, .. } => {
                self.node_started(info, now)
            }
            ManagerEvent::PhysicalNodeConnected { node_id, tags, .. } => {
                self.facts.fleet.connected(&node_id, tags);
                self.dispatch_awaiting(&node_id);
            }
            ManagerEvent::NodeInventory { node_id, inventory } => {
                self.facts.fleet.set_inventory(&node_id, inventory);
            }
            ManagerEvent::NodeTagsUpdated { node_id, tags } => {
                self.facts.fleet.set_tags(&node_id, tags);
            }
            ManagerEvent::NodeStopping { node_id, reason } => {
                self.facts.fleet.stopping(&node_id, reason);
                self.lose_node(&node_id, now);
                self.notify(Notification::NodeStopping { node_id, reason });
            }
            ManagerEvent::NodeStopped(node_id) => {
                // "A node's NodeStopped alone (no prior Stopping) unbinds and
                // recovers its jobs."
                self.facts.fleet.stopped(&node_id, now);
                self.lose_node(&node_id, now);
                self.notify(Notification::NodeStopped { node_id });
            }
            ManagerEvent::JobRejected {
                job_id,
                role,
                node_id,
                code,
                detail,
                inventory,
            } => {
                self.counters.jobs_rejected += 1;
                self.notify(Notification::JobRejected {
                    job_id: job_id.clone(),
                    role: role.clone(),
                    node_id: node_id.clone(),
                    code,
                    detail: detail.clone(),
                    inventory,
                });
                if self
                    .facts
                    .fleet
                    .record_rejection(&node_id, self.facts.placed_with.settings(), now)
                {
                    self.notify(Notification::NodeUnhealthy {
                        node_id: node_id.clone(),
                    });
                }
                let matches = self.facts.jobs.get(&job_id).is_some_and(|r| {
                    r.binding
                        .as_ref()
                        .is_some_and(|b| b.instance_key == role && b.node_id == node_id)
                });
                if matches {
                    self.losses()
                        .lose_instance(&job_id, LossCause::Rejected { code, detail }, now);
                } else {
                    self.saga()
                        .migration_target_rejected(&job_id, &role, &node_id, &detail, now);
                }
            }
            ManagerEvent::BundleUpdated(bundle) => self.bundle_updated(bundle),
            ManagerEvent::BundleDeleted(bundle_id) => {
                self.revive(&bundle_id);
                self.manual.forget(&bundle_id);
                self.subsystems.schedules.forget(&bundle_id);
                self.facts.bundles.remove(&bundle_id);
                self.notify(Notification::BundleDeleted { bundle_id });
            }
            ManagerEvent::JobInfo { job_id, role, text } => self.notify(Notification::JobInfo { job_id, role, text }),
            ManagerEvent::ImagesPrefetched { node_id, results } => {
                self.notify(Notification::ImagesPrefetched { node_id, results })
            }
            ManagerEvent::AuditAppended(entry) => self.notify(Notification::AuditAppended { entry }),
            ManagerEvent::NodeInterruptionNotice {
                node_id,
                kind,
                deadline,
                noticed_at,
            } => self.interruption_noticed(node_id, kind, deadline, noticed_at, now),
            ManagerEvent::JobPrepared { job_id, role, node_id } => {
                self.saga().migration_prepared(&job_id, &role, &node_id, now)
            }
            ManagerEvent::MigrationSignal {
                migration_id,
                job_id,
                from_key,
                signal,
            } => self
                .saga()
                .migration_signal(&migration_id, &job_id, &from_key, signal, now),
            ManagerEvent::ProviderHealthChange | ManagerEvent::Unknown => {}
        }
    }

    fn hydrated_now(&mut self, now: UnixMillis) {
        let releases = std::mem::take(&mut self.facts.held_releases);
        self.facts.hydrated = true;
        // Before the view is built: inherited starts hold capacity.
        self.take_up_inheritance(now);
        // The placement view is built once here and kept up to date after;
        // should it fail, the first placement round says why.
        self.view_cache = self.synced_view().ok();
        // First, the losses no leader judged: a node launching for a job
        // was asked for before the loss (no leader acted since), so it is
        // no placement after it — a `drop` job lost meanwhile ends, and is
        // not bound to the node below.
        self.judge_losses_seen_while_hydrating(now);
        // A node provisioned for a job (by this core's predecessor) that is
        // still launching takes that job back, so a new instance never
        // provisions a second node for it — unless the job is not to run
        // (dropped, its bundle broken, its window over or its schedule
        // ended, a manual job kept stopped): binding it there would hold a
        // job that never starts, and split its co-located group from peers
        // placed without it. Nor where a co-located peer runs (or starts)
        // elsewhere: the group stays whole, and the job is placed with it.
        let launching: Vec<(NodeId, JobId)> = self
            .facts
            .fleet
            .iter()
            .filter(|n| n.is_launching() && !n.terminated)
            .filter_map(|n| {
                let job = JobId(n.tags.get(tags::PROVISIONED_FOR)?.clone());
                let record = self.facts.jobs.get(&job)?;
                let wanted = self.may_run(record, now) && !record.window_over;
                (record.binding.is_none() && wanted).then(|| (n.id.clone(), job))
            })
            .collect();
        for (node_id, job_id) in launching {
            // Checked as each is bound: two nodes launching for two members
            // of one group take at most one of them.
            let peers_elsewhere = self.facts.group_of(&job_id).iter().any(|peer| {
                self.facts
                    .jobs
                    .get(peer)
                    .and_then(|p| p.binding.as_ref())
                    .is_some_and(|b| b.node_id != node_id)
            });
            // One node per job: a second launching for it stays unused.
            if let Some(mut record) = self.facts.jobs.get_mut(&job_id)
                && record.binding.is_none()
                && !peers_elsewhere
            {
                let slot = Slot::of_replica(record.bundle_ref.replica_index);
                record.binding = Some(Binding {
                    node_id,
                    instance_key: crate::model::InstanceKey::slot(slot),
                    gpu_index: None,
                    phase: BindingPhase::AwaitingNode,
                    uncounted: false,
                    prepared_start_awaited: false,
                });
            }
        }
        self.stop_strays();
        self.shed_over_commitment();
        self.reunite_split_groups();
        self.part_separated_jobs();
        // Every job read and bound: a node a job left while replaying is
        // released only if it is empty now.
        for (node_id, single_use) in releases {
            self.release_node(&node_id, single_use);
        }
    }

    /// A job whose instance went with its node while this core was
    /// hydrating, and which Manager shows neither placed again nor ended,
    /// had its loss judged by no one (a leader that died first): the
    /// failure policy judges it now, as of when it happened — `drop` ends
    /// the job, the re-placing policies count a restart and recover it
    /// away from that node.
    fn judge_losses_seen_while_hydrating(&mut self, now: UnixMillis) {
        let unjudged: Vec<(JobId, super::binding::UnjudgedLoss)> = self
            .facts
            .jobs
            .values_mut()
            .filter_map(|mut record| Some((record.job.job_id.clone(), record.unjudged_loss.take()?)))
            .collect();
        for (job_id, loss) in unjudged {
            let Some(record) = self.facts.jobs.get(&job_id) else {
                continue;
            };
            // Placed again, or ended, since: judged by whoever did it. A
            // job of a broken bundle is judged as any lost job is (a
            // `drop` job is still dropped).
            if record.binding.is_some()
                || record.in_flight.is_some()
                || record.window_over
                || record.dropped
                || record.job.terminal_verdict.is_some()
                || self.is_dormant(record)
                || self.facts.schedule_ended(&record.bundle_ref.bundle_id, now)
            {
                continue;
            }
            let cause = if loss.reclaimed {
                LossCause::Reclaimed
            } else {
                LossCause::NodeLost
            };
            self.losses()
                .judge_loss(&job_id, &loss.lost, &cause, loss.node_stopping, loss.at);
        }
    }

    /// Once hydrated: a node whose instances exceed what it holds (its
    /// capacity or cores, a host port claimed twice) — a predecessor's stop
    /// that never landed left the instance it gave up running beside the
    /// one it placed in its room — keeps its longest-running instances; the
    /// newest are stopped and their jobs placed again. Nothing failed:
    /// nothing is counted against the restart ceiling.
    fn shed_over_commitment(&mut self) {
        let Ok(mut cache) = self.synced_view() else {
            return;
        };
        let instances = |record: &JobRecord| {
            record
                .binding
                .as_ref()
                .filter(|b| b.phase != BindingPhase::AwaitingNode)
                .map(|b| b.node_id.clone())
        };
        let nodes: std::collections::BTreeSet<NodeId> = self.facts.jobs.values().filter_map(instances).collect();
        for node_id in nodes {
            if !cache.view_mut().over_committed(&node_id) {
                continue;
            }
            // Oldest first; the newest are shed first.
            let mut on_node: Vec<(UnixMillis, JobId)> = self
                .facts
                .jobs
                .values()
                .filter(|r| instances(r).as_ref() == Some(&node_id))
                .filter_map(|r| {
                    let binding = r.binding.as_ref()?;
                    let since = instance_since(&r.job.history, &binding.instance_key, &node_id);
                    Some((since, r.job_id().clone()))
                })
                .collect();
            on_node.sort();
            while cache.view_mut().over_committed(&node_id) {
                let Some((_, job_id)) = on_node.pop() else {
                    break;
                };
                let Some(mut record) = self.facts.jobs.get_mut(&job_id) else {
                    continue;
                };
                let Some(binding) = record.binding.take() else {
                    continue;
                };
                let job = &record.bundle_ref;
                let placed = crate::placement::placed_job(
                    &job.bundle_id,
                    job.replica_index,
                    &record.job.spec,
                    binding.gpu_index,
                );
                let _ = cache.view_mut().release(&node_id, &placed);
                drop(record);
                self.notify(Notification::Error {
                    message: format!(
                        "{node_id} runs more than it holds (a predecessor's stop did not land): stopping \
                         {job_id}'s instance {} there to place it again",
                        binding.instance_key
                    ),
                });
                self.undo_start(&job_id, binding.instance_key, node_id.clone());
            }
        }
        // The view taken is dropped: the next round builds it from the
        // bindings as they now are.
    }

    /// Once hydrated: a co-located group Manager runs on more than one
    /// node, with no migration of it in flight (a predecessor's stop of a
    /// member's instance never landed), stays on the node of its oldest
    /// instance; the members elsewhere are stopped and placed again, with
    /// the group.
    fn reunite_split_groups(&mut self) {
        let mut seen = std::collections::BTreeSet::new();
        let job_ids: Vec<JobId> = self.facts.jobs.keys().cloned().collect();
        for job_id in job_ids {
            if seen.contains(&job_id) {
                continue;
            }
            let group = self.facts.group_of(&job_id);
            seen.extend(group.iter().cloned());
            let records: Vec<&JobRecord> = group.iter().filter_map(|m| self.facts.jobs.get(m)).collect();
            if records.len() < 2 || records.iter().any(|r| r.migration.is_some()) {
                continue;
            }
            let mut placed: Vec<(UnixMillis, JobId, NodeId, InstanceKey)> = records
                .iter()
                .filter_map(|r| {
                    let b = r.binding.as_ref().filter(|b| b.phase != BindingPhase::AwaitingNode)?;
                    let since = instance_since(&r.job.history, &b.instance_key, &b.node_id);
                    Some((since, r.job_id().clone(), b.node_id.clone(), b.instance_key.clone()))
                })
                .collect();
            placed.sort();
            let Some(home) = placed.first().map(|p| p.2.clone()) else {
                continue;
            };
            for (_, member, node_id, key) in placed.into_iter().filter(|p| p.2 != home) {
                if let Some(mut record) = self.facts.jobs.get_mut(&member) {
                    record.binding = None;
                }
                self.notify(Notification::Error {
                    message: format!(
                        "{member} runs on {node_id}, apart from its co-located group on {home} (a predecessor's \
                         stop did not land): stopping it there to place it with the group"
                    ),
                });
                self.undo_start(&member, key, node_id);
            }
        }
    }

    /// Once hydrated: jobs of one replica kept apart (`separateFrom`, a
    /// hard rule) that Manager runs on one node, with no migration of
    /// either in flight — a predecessor's stop that never landed (of a
    /// migration's source it had moved the job off, say) left the instance
    /// it gave up running beside the peer it placed there since — are
    /// parted: the longest-running instance stays, the newer is stopped and
    /// its job placed again. Nothing failed: nothing is counted against the
    /// restart ceiling.
    fn part_separated_jobs(&mut self) {
        // (since, job, node, key, bundle, replica, name), oldest first.
        let mut placed: Vec<(UnixMillis, JobId, NodeId, InstanceKey, BundleId, u32, String)> = self
            .facts
            .jobs
            .values()
            .filter(|r| r.migration.is_none())
            .filter_map(|r| {
                let b = r.binding.as_ref().filter(|b| b.phase != BindingPhase::AwaitingNode)?;
                let since = instance_since(&r.job.history, &b.instance_key, &b.node_id);
                let job = &r.bundle_ref;
                Some((
                    since,
                    r.job_id().clone(),
                    b.node_id.clone(),
                    b.instance_key.clone(),
                    job.bundle_id.clone(),
                    job.replica_index,
                    job.job_name.clone(),
                ))
            })
            .collect();
        placed.sort();
        let spec_of = |bundle: &BundleId, name: &str| {
            self.facts
                .bundles
                .get(bundle)
                .and_then(|b| b.spec.jobs.iter().find(|j| j.job_name == name))
        };
        let apart = |a: (&BundleId, &str), b: (&BundleId, &str)| {
            a.0 == b.0
                && spec_of(a.0, a.1).zip(spec_of(b.0, b.1)).is_some_and(|(x, y)| {
                    x.separate_from.contains(&y.job_name) || y.separate_from.contains(&x.job_name)
                })
        };
        let mut kept: Vec<&(UnixMillis, JobId, NodeId, InstanceKey, BundleId, u32, String)> = Vec::new();
        let mut parted: Vec<(JobId, NodeId, InstanceKey, JobId)> = Vec::new();
        for p in &placed {
            let beside = kept
                .iter()
                .find(|k| k.2 == p.2 && k.5 == p.5 && apart((&k.4, k.6.as_str()), (&p.4, p.6.as_str())));
            match beside {
                Some(k) => parted.push((p.1.clone(), p.2.clone(), p.3.clone(), k.1.clone())),
                None => kept.push(p),
            }
        }
        for (job_id, node_id, key, peer) in parted {
            if let Some(mut record) = self.facts.jobs.get_mut(&job_id) {
                record.binding = None;
            }
            self.notify(Notification::Error {
                message: format!(
                    "{job_id} runs on {node_id} beside {peer}, which it is kept apart from (a predecessor's stop \
                     did not land): stopping it there to place it again"
                ),
            });
            self.undo_start(&job_id, key, node_id);
        }
    }

    /// A node tagged for one of this AutoManager's cloud tiers that this
    /// core did not ask for — a predecessor's (a process that is gone) — is
    /// adopted as provisioned, so it is released as any node this core
    /// provisioned is (a `singleUse` job's node once empty). While it is
    /// launching, its provision deadline (gone with the predecessor) runs
    /// from when Manager created it (or from now, if Manager does not say):
    /// should it never start, it is terminated like any provision past
    /// `provisionTimeoutMs`, not left launching (and billed) forever.
    fn adopt_provisioned(&mut self, info: &NodeInfo, now: UnixMillis) {
        let Some(node) = self.facts.fleet.get(&info.node_id) else {
            return;
        };
        if node.provisioned.is_some() || node.terminated {
            return;
        }
        let (Some(pool), Some(tier)) = (info.tags.get(tags::POOL), info.tags.get(tags::TIER)) else {
            return;
        };
        let Some(tier_spec) = self
            .facts
            .pools()
            .get(pool)
            .and_then(|p| p.tiers.iter().find(|t| &t.name == tier))
            .filter(|t| t.kind.is_cloud())
        else {
            return;
        };
        let provisioned = Provisioned {
            pool: pool.clone(),
            tier: tier.clone(),
            // The shape it was created as, from its tags (every node this
            // AutoManager provisions names it): where Manager reports no
            // inventory placement plans on that shape. An empty one names
            // none: the node's size would be unknown, nothing placed there,
            // and what runs there stopped as more than it holds.
            instance_type: info.tags.get(tags::INSTANCE_TYPE).cloned().unwrap_or_default(),
            kind: tier_spec.kind,
            region: tier_spec.region.clone().unwrap_or_default(),
            for_job: info.tags.get(tags::PROVISIONED_FOR).map(|j| JobId(j.clone())),
            start_deadline: info.created_at.unwrap_or(now) + tier_spec.effective_provision_timeout_ms() as i64,
        };
        self.facts.fleet.set_provisioned(&info.node_id, provisioned);
    }

    /// Once hydrated: every instance Manager holds (open in a job's
    /// history, on a node that is up) that is neither the job's placement
    /// nor an instance of a migration this core follows is stopped. Such an
    /// instance is a predecessor's, made by a call that landed after it was
    /// gone — a migration target it prepared, a start it had moved
    /// elsewhere — and left alone it would run the job on a second node.
    fn stop_strays(&mut self) {
        let strays: Vec<(JobId, InstanceKey, NodeId)> = self
            .facts
            .jobs
            .iter()
            .filter(|(_, record)| record.in_flight.is_none())
            .flat_map(|(job_id, record)| {
                open_instances(&record.job.history)
                    .into_iter()
                    .filter(move |(key, node)| {
                        let is = |b: Option<&Binding>| b.is_some_and(|b| &b.instance_key == key && &b.node_id == node);
                        !is(record.binding.as_ref()) && !is(record.migration_target())
                    })
                    .map(move |(key, node)| (job_id.clone(), key, node))
            })
            .filter(|(job_id, key, node)| {
                self.facts.fleet.get(node).is_some_and(|n| !n.is_going())
                    && !self.migrations.is_migration_instance(key)
                    && !self.inherited.undoes(job_id, key, node)
            })
            .collect();
        for (job_id, key, node) in strays {
            self.notify(Notification::Error {
                message: format!(
                    "{job_id} has an instance {key} on {node} that is not its placement (a predecessor's call \
                     landed late): stopping it"
                ),
            });
            self.undo_start(&job_id, key, node);
        }
    }

    fn node_started(&mut self, info: NodeInfo, now: UnixMillis) {
        let started_before = self
            .facts
            .fleet
            .get(&info.node_id)
            .is_some_and(|n| n.phase == NodePhase::Running);
        let node = self.facts.fleet.running(&info);
        let provisioned_for = node.tags.get(tags::PROVISIONED_FOR).cloned();
        self.adopt_provisioned(&info, now);
        // "The history clears when a node provisioned for the job starts":
        // when it starts, not when Manager says again that it runs.
        if !started_before
            && let Some(job) = provisioned_for
            && let Some(mut record) = self.facts.jobs.get_mut(&JobId(job))
        {
            record.restarts.clear();
        }
        self.terminate_unheard_create(&info.node_id);
        self.dispatch_awaiting(&info.node_id);
        self.notify(Notification::NodeStarted { node: info });
    }

    /// Every job bound to a stopping or stopped node is lost with it
    /// (migrations with an instance there are settled first).
    fn lose_node(&mut self, node_id: &NodeId, now: UnixMillis) {
        self.saga().migration_node_lost(node_id, now);
        let bound = self.facts.jobs_bound_to(node_id);
        for job_id in bound {
            self.losses().lose_instance(&job_id, LossCause::NodeLost, now);
        }
    }

    fn bundle_updated(&mut self, bundle: Bundle) {
        let newer = self
            .facts
            .bundles
            .get(&bundle.bundle_id)
            .is_some_and(|known| bundle.generation > known.generation);
        match &bundle.terminal_verdict {
            Some(verdict) if verdict.kind == VerdictKind::Broken => {
                self.facts
                    .broken
                    .entry(bundle.bundle_id.clone())
                    .or_insert_with(|| verdict.reason.clone());
                self.losses().withhold_unstarted(&bundle.bundle_id);
            }
            // A newer generation without a verdict is a revival (an update
            // made elsewhere).
            None if newer => self.revive(&bundle.bundle_id),
            _ => {}
        }
        self.facts.bundles.insert(bundle.bundle_id.clone(), bundle.clone());
        self.notify(Notification::BundleUpdated {
            bundle: Box::new(bundle),
        });
    }

    pub(super) fn job_deleted(&mut self, job_id: JobId, now: UnixMillis) {
        self.saga().migration_job_ended(&job_id, "the job was deleted", now);
        self.subsystems
            .node_services
            .job_changed(self.facts.settings(), &job_id, None, &mut self.outbox, now);
        if let Some(record) = self.facts.jobs.remove(&job_id)
            && let Some(binding) = record.binding
        {
            self.release_node(&binding.node_id, record.job.spec.single_use);
        }
        self.notify(Notification::JobDeleted { job_id });
    }

    fn job_changed(&mut self, job: RuntimeJob, now: UnixMillis) {
        self.notify(Notification::JobUpdated {
            job: Box::new(job.clone()),
        });
        let Some(bundle_ref) = job.bundle_ref.clone() else {
            // Plain Manager jobs are not this core's to place, a node
            // service's excepted.
            return self.subsystems.node_services.job_changed(
                self.facts.settings(),
                &job.job_id,
                Some(&job),
                &mut self.outbox,
                now,
            );
        };
        let job_id = job.job_id.clone();
        let post = job.state == JobState::Post;
        // Manager's history only grows, and a job's window only moves on
        // (pending, active, over) unless its bundle is updated (a later
        // end): a runtime whose history is a prefix of the one already seen
        // and that is shorter, or that puts back a window seen over with no
        // update since, is an older snapshot delivered late (reordered or
        // repeated), and changes nothing. One whose history is not a prefix
        // is a new incarnation of the job, read afresh.
        let stale = self.facts.jobs.get(&job_id).is_some_and(|known| {
            let older = job.history.len() < known.job.history.len() || (known.window_over && !post);
            older && known.job.history.starts_with(&job.history)
        });
        if stale {
            return;
        }
        // A job first heard of now, hydrated or not, is read as a snapshot
        // is: an instance its history shows live is adopted where it runs
        // and its restarts are counted from it. Live, that is a job stored
        // on Manager before this core heard of it — on a Manager without a
        // bundle store, a Bundle applied after the snapshot whose jobs
        // already run.
        let first_heard = self.facts.jobs.get(&job_id).is_none() && !self.inherited.left_migrating(&job_id);
        // A predecessor's job with a migration in flight carries on from
        // the record it left.
        let mut record = self.facts.jobs.get_or_insert_with(&job_id, || {
            self.inherited
                .take_migrating(&job_id)
                .unwrap_or_else(|| JobRecord::new(job.clone(), bundle_ref))
        });
        if job.history.len() < record.history_seen {
            record.history_seen = 0;
        }
        let verdict_landed = record.job.terminal_verdict.is_none() && job.terminal_verdict.is_some();
        record.job = job;
        if post {
            record.window_over = true;
        }
        drop(record);
        self.apply_history(&job_id, first_heard, now);
        if verdict_landed {
            self.stop_dropped(&job_id, now);
        }
        if post {
            // The window is over: Manager stops the instance; the job ended.
            self.saga().migration_job_ended(&job_id, "the job's window ended", now);
            self.end_binding(&job_id);
        }
    }

    /// A drop verdict Manager now holds reached a job this core has
    /// placed: a predecessor dropped it and the instance this core adopted
    /// is one that predecessor's late call made (a migration target it
    /// could no longer stop). A dropped job runs nowhere: the instance is
    /// stopped and the binding ends; nothing of the job is placed or moved
    /// again until its bundle is updated. While this core still follows
    /// (before `InitialDataComplete`) only the binding ends: the instance
    /// is then a stray, which is stopped once every job is read.
    fn stop_dropped(&mut self, job_id: &JobId, now: UnixMillis) {
        if !self.facts.hydrated {
            if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
                record.dropped = true;
            }
            return self.end_binding(job_id);
        }
        self.saga().migration_job_ended(job_id, "the job was dropped", now);
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        record.dropped = true;
        if record.in_flight.is_some() {
            return;
        }
        let Some(binding) = record.binding.clone() else {
            return;
        };
        drop(record);
        self.end_binding(job_id);
        if self.facts.fleet.get(&binding.node_id).is_some_and(|n| !n.is_going()) {
            self.notify(Notification::Error {
                message: format!(
                    "{job_id} is dropped (a verdict Manager holds) but its instance {} runs on {}: stopping it",
                    binding.instance_key, binding.node_id
                ),
            });
            self.undo_start(job_id, binding.instance_key, binding.node_id);
        }
    }

    /// Applies history entries not seen before: where instances were
    /// provisioned, reached running, stopped.
    fn apply_history(&mut self, job_id: &JobId, first_heard: bool, now: UnixMillis) {
        let replaying = !self.facts.hydrated || first_heard;
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        let fresh: Vec<JobHistoryEntry> = record.job.history[record.history_seen..].to_vec();
        record.history_seen = record.job.history.len();
        drop(record);
        for entry in fresh {
            if replaying {
                self.replay_restart(job_id, &entry);
            }
            // An instance of a migration in flight is the saga's to follow.
            if self.saga().migration_observes(job_id, &entry, now) {
                continue;
            }
            match entry {
                JobHistoryEntry::Provisioned {
                    role,
                    node_id: Some(node),
                    ..
                } => self.instance_seen(job_id, role, node, BindingPhase::Dispatched, replaying),
                JobHistoryEntry::Running {
                    role,
                    node_id: Some(node),
                    ..
                } => self.instance_seen(job_id, role, node, BindingPhase::Running, replaying),
                JobHistoryEntry::Stopping {
                    role, node_id, reason, ..
                } if self.binding_matches(job_id, &role, node_id.as_ref()) => match reason {
                    JobStopReason::UserRequested => self.end_binding(job_id),
                    JobStopReason::NodeStopped | JobStopReason::NodeTerminated => {
                        self.losses().lose_instance(job_id, LossCause::NodeLost, now)
                    }
                    JobStopReason::JobFailed | JobStopReason::UnknownJob | JobStopReason::Unknown(_) => {
                        self.instance_stopping(job_id, role, now);
                        self.losses().lose_instance(job_id, LossCause::Failed, now)
                    }
                },
                // Stopped without a Stopping this core saw: it ended without
                // being asked to.
                JobHistoryEntry::Stopped { role, node_id, .. }
                    if self.binding_matches(job_id, &role, node_id.as_ref()) =>
                {
                    self.losses().lose_instance(job_id, LossCause::Failed, now)
                }
                JobHistoryEntry::Stopped { role, node_id, .. } => {
                    self.instance_stopped(job_id, &role, node_id.as_ref())
                }
                _ => {}
            }
        }
    }

    /// While hydrating, the restart history is rebuilt from Manager's job
    /// history — every runtime failure since the job's spec last changed —
    /// so a fresh core after a reconnect keeps counting against the same
    /// ceiling ("the history clears when the bundle is updated").
    fn replay_restart(&mut self, job_id: &JobId, entry: &JobHistoryEntry) {
        if let Some(mut record) = self.facts.jobs.get_mut(job_id) {
            replay_restart(&mut record.restarts, entry);
        }
    }

    /// The bound instance failed and Manager is stopping it: remembered
    /// until its `Stopped`, so its replacement (same instance key) is not
    /// started on top of it.
    fn instance_stopping(&mut self, job_id: &JobId, role: crate::model::InstanceKey, now: UnixMillis) {
        if let Some(mut record) = self.facts.jobs.get_mut(job_id)
            && let Some(binding) = &record.binding
        {
            record.stopping = Some(AwaitedStop {
                instance: StoppingInstance {
                    node_id: binding.node_id.clone(),
                    instance_key: role,
                    since: now,
                },
                wait: StopWait::FailedOnLiveNode,
            });
        }
    }

    /// A stopped instance: if it is the one being waited for (failed, or
    /// held on a stopping node), its replacement may now start.
    fn instance_stopped(&mut self, job_id: &JobId, role: &crate::model::InstanceKey, node: Option<&NodeId>) {
        if let Some(mut record) = self.facts.jobs.get_mut(job_id)
            && record
                .stopping
                .as_ref()
                .is_some_and(|s| &s.instance.instance_key == role && node.is_none_or(|n| n == &s.instance.node_id))
        {
            record.stopping = None;
        }
    }

    fn binding_matches(&self, job_id: &JobId, role: &crate::model::InstanceKey, node: Option<&NodeId>) -> bool {
        self.facts
            .jobs
            .get(job_id)
            .and_then(|r| r.binding.as_ref())
            .is_some_and(|b| &b.instance_key == role && node.is_none_or(|n| n == &b.node_id))
    }

    /// An instance provisioned or running: confirms the binding, or (while
    /// `replaying` a history: hydrating, or a job first heard of) rebuilds
    /// it from Manager's history.
    fn instance_seen(
        &mut self,
        job_id: &JobId,
        role: crate::model::InstanceKey,
        node_id: NodeId,
        phase: BindingPhase,
        replaying: bool,
    ) {
        let hydrated = self.facts.hydrated;
        // A rolled-back migration's target, or an instance a timed-out
        // start made, is being stopped: not the job's. Nor is a migration
        // target that never ran, of a migration this core does not follow
        // (its saga is gone with a predecessor): created with its start
        // deferred, it runs only when its saga says so — bound, the job
        // would never run. Once it has run it is the job's (a migration
        // done moves the job to its target's key).
        let prepared_target = role.is_migration_target() && phase != BindingPhase::Running;
        let adoptable = !prepared_target
            && self.facts.fleet.get(&node_id).is_some_and(|n| !n.is_going())
            && !self.migrations.is_rolled_back_target(&role)
            && !self.inherited.undoes(job_id, &role, &node_id);
        let Some(mut record) = self.facts.jobs.get_mut(job_id) else {
            return;
        };
        // A node a single-use job ran on is released once empty, whether
        // or not the job is still its placement (it may have ended, or the
        // instance be a stray): decided once every job is read.
        if !hydrated && record.job.spec.single_use {
            self.facts.held_releases.push((node_id.clone(), true));
        }
        let ended = record.dropped || record.job.terminal_verdict.is_some();
        // Manager reports the instance a job was moved onto before its
        // prepared start was answered: it made it.
        if let Some(binding) = record.binding.as_mut()
            && binding.instance_key == role
            && binding.node_id == node_id
        {
            binding.prepared_start_awaited = false;
        }
        match &mut record.binding {
            Some(binding)
                if binding.instance_key == role
                    && binding.node_id == node_id
                    && phase == BindingPhase::Running
                    && binding.phase != BindingPhase::Running =>
            {
                binding.phase = BindingPhase::Running;
                drop(record);
                // "Excluded until a job reaches running on it."
                if self.facts.fleet.job_running(&node_id) {
                    self.notify(Notification::NodeHealthy { node_id });
                }
            }
            // A job that has ended (dropped: its verdict is on Manager) is
            // not placed anywhere: an instance of it still live is a stray.
            None if replaying && adoptable && !ended => {
                // Placed again: whoever placed it judged the loss.
                record.unjudged_loss = None;
                record.binding = Some(Binding {
                    node_id,
                    instance_key: role,
                    gpu_index: None,
                    phase,
                    uncounted: false,
                    prepared_start_awaited: false,
                });
            }
            _ => {}
        }
    }
}
