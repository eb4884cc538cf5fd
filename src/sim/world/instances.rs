//! Job instances: a job started on a node under an instance key goes
//! provisioned -> running (or prepared, with a deferred start) -> stopping
//! -> stopped, each step recorded in the job's history and streamed as
//! `job_updated`. Instances are keyed by (job id, instance key), so a
//! migration target (`primary@3f9c1e2a`) and its source run side by side.
//! Injected behaviour lives here too: armed rejections and starts that hang.

use super::{Action, START_MS, STOP_MS, World, job_id_of, job_ref, node_id_of, node_ref, required, timestamp};
use crate::manager::proto::manager::{
    self as pb, event_stream_event::Event, job_history_entry::HistoryEntry,
    job_history_job_stopping::Reason as StopReason,
};
use crate::manager::proto::{common, sim_admin};
use crate::sim::RequestError;
use crate::sim::published::Api;

/// Where an instance is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum InstancePhase {
    /// Started on the node; running (or prepared) after the start latency.
    Provisioned,
    /// Created with a deferred start; waits for `StartPreparedJob`.
    Prepared,
    /// `StartPreparedJob` received; running after the start latency.
    Starting,
    /// Running.
    Running,
    /// Stopping; stopped after the stop latency or with its node.
    Stopping,
}

impl InstancePhase {
    /// The phase's name, for messages and the admin snapshot.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Provisioned => "provisioned",
            Self::Prepared => "prepared",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Stopping => "stopping",
        }
    }
}

/// One instance of a job on a node.
#[derive(Debug, Clone)]
pub(crate) struct Instance {
    /// The node it runs on.
    pub node_id: String,
    pub phase: InstancePhase,
    /// Created with `defer_start`.
    pub defer_start: bool,
    /// The GPU device it was placed on.
    pub gpu_index: Option<u32>,
    /// The slot the runtime was told (`NORSK_RUNTIME_ROLE`).
    pub runtime_role: String,
    /// Which start of this key it is (stale timers are ignored).
    pub incarnation: u64,
    /// The node's metadata when the instance started (history entries carry
    /// it even after the node is gone).
    node_metadata: common::NodeMetadata,
    running_metadata: Option<common::RunningNodeMetadata>,
}

impl World {
    /// `StartJob`: provisioned now; running (or prepared, with
    /// `defer_start`) after the start latency. Idempotent on (job, key).
    pub fn start_job(&mut self, req: pb::StartJobRequest) -> Result<(), RequestError> {
        let job_id = required(job_id_of(&req.job_id), "job_id")?.to_owned();
        let role = required(&req.role, "role")?.to_owned();
        let node_id = required(node_id_of(&req.node_id), "node_id")?.to_owned();
        self.job(&job_id)?;
        if self.doomed.contains(&job_id) {
            return Err(RequestError::FailedPrecondition {
                what: format!("start job {job_id:?}"),
                why: "it is being deleted".to_owned(),
            });
        }
        let node = self.running_node(&node_id)?;
        if let Some(gpu) = req.gpu_index {
            let devices = node.inventory.as_ref().map_or(0, |i| i.gpus.len());
            if gpu as usize >= devices {
                return Err(RequestError::InvalidField {
                    field: "gpu_index",
                    why: format!("node {node_id:?} has {devices} GPU device(s), no index {gpu}"),
                });
            }
        }
        let (node_metadata, running_metadata) = (node.metadata.clone(), node.running.clone());
        if let Some(existing) = self.instances.get(&(job_id.clone(), role.clone())) {
            if existing.node_id == node_id {
                return Ok(());
            }
            return Err(RequestError::AlreadyExists {
                what: format!("instance {role:?} of job {job_id:?}"),
                why: format!("it runs on node {:?}", existing.node_id),
            });
        }
        let incarnation = self.next_incarnation();
        let instance = Instance {
            node_id,
            phase: InstancePhase::Provisioned,
            defer_start: req.defer_start,
            gpu_index: req.gpu_index,
            runtime_role: if req.runtime_role.is_empty() {
                role.clone()
            } else {
                req.runtime_role
            },
            incarnation,
            node_metadata,
            running_metadata,
        };
        let entry = HistoryEntry::JobProvisioned(pb::JobHistoryJobProvisioned {
            timestamp: Some(timestamp(self.now())),
            role: role.clone(),
            node_metadata: Some(instance.node_metadata.clone()),
            running_node_metadata: instance.running_metadata.clone(),
        });
        self.instances.insert((job_id.clone(), role.clone()), instance);
        self.record(&job_id, entry);
        self.schedule_ready(job_id, role, incarnation);
        Ok(())
    }

    /// `StartPreparedJob`: a prepared instance starts; running after the
    /// start latency.
    pub fn start_prepared_job(&mut self, req: pb::StartPreparedJobRequest) -> Result<(), RequestError> {
        let job_id = required(job_id_of(&req.job_id), "job_id")?.to_owned();
        let role = required(&req.role, "role")?.to_owned();
        self.job(&job_id)?;
        let node_id = node_id_of(&req.node_id);
        let instance = self.instance_mut(&job_id, &role, node_id)?;
        match instance.phase {
            InstancePhase::Prepared => {}
            InstancePhase::Starting | InstancePhase::Running => return Ok(()),
            phase => {
                return Err(RequestError::FailedPrecondition {
                    what: format!("start prepared instance {role:?} of job {job_id:?}"),
                    why: format!("it is {}, not prepared", phase.as_str()),
                });
            }
        }
        instance.phase = InstancePhase::Starting;
        let incarnation = instance.incarnation;
        self.schedule_ready(job_id, role, incarnation);
        Ok(())
    }

    /// `StopJob`: stopping (user requested) now, stopped after the stop
    /// latency. Stopping an instance that is already stopping is a no-op.
    pub fn stop_job(&mut self, req: pb::StopJobRequest) -> Result<(), RequestError> {
        let job_id = required(job_id_of(&req.job_id), "job_id")?.to_owned();
        let role = required(&req.role, "role")?.to_owned();
        self.job(&job_id)?;
        self.instance_mut(&job_id, &role, node_id_of(&req.node_id))?;
        self.stop_instance(&job_id, &role, StopReason::JobStoppedUserRequested);
        Ok(())
    }

    /// `fail-job`: the job's live instances (or the one named) fail:
    /// stopping (job failed), then stopped.
    pub fn fail_job(&mut self, req: sim_admin::JobRef) -> Result<(), RequestError> {
        let job_id = required(&req.job_id, "job_id")?.to_owned();
        self.job(&job_id)?;
        let roles: Vec<String> = self
            .live_instances_of(&job_id)
            .filter(|(role, i)| i.phase != InstancePhase::Stopping && (req.role.is_empty() || *role == req.role))
            .map(|(role, _)| role.to_owned())
            .collect();
        if roles.is_empty() {
            let which = if req.role.is_empty() {
                String::new()
            } else {
                format!(" {:?}", req.role)
            };
            return Err(RequestError::FailedPrecondition {
                what: format!("fail job {job_id:?}"),
                why: format!("it has no running instance{which}"),
            });
        }
        for role in roles {
            self.stop_instance(&job_id, &role, StopReason::JobStoppedJobFailed);
        }
        Ok(())
    }

    /// `reject-job`: the worker refuses the job's next `times` starts.
    pub fn reject_job(&mut self, req: sim_admin::RejectJobRequest) -> Result<(), RequestError> {
        let job_id = required(&req.job_id, "job_id")?.to_owned();
        self.job(&job_id)?;
        let code = pb::JobRejectionCode::try_from(req.code)
            .ok()
            .filter(|c| *c != pb::JobRejectionCode::JobRejectedUnspecified)
            .ok_or_else(|| RequestError::InvalidField {
                field: "code",
                why: format!("{} is not a rejection code", req.code),
            })?;
        let detail = if req.detail.is_empty() {
            format!("the worker refused the job: {}", code.as_str_name())
        } else {
            req.detail
        };
        self.rejections.insert(
            job_id,
            super::ArmedRejection {
                code,
                detail,
                remaining: req.times.max(1),
            },
        );
        Ok(())
    }

    /// `set-job-behaviour`.
    pub fn set_job_behaviour(&mut self, req: sim_admin::SetJobBehaviourRequest) -> Result<(), RequestError> {
        let job_id = required(&req.job_id, "job_id")?.to_owned();
        self.job(&job_id)?;
        let behaviour = sim_admin::JobBehaviour::try_from(req.behaviour).map_err(|_| RequestError::InvalidField {
            field: "behaviour",
            why: format!("{} is unknown", req.behaviour),
        })?;
        if behaviour == sim_admin::JobBehaviour::Cooperative {
            self.behaviours.remove(&job_id);
        } else {
            self.behaviours.insert(job_id, behaviour);
        }
        Ok(())
    }

    /// The injected behaviour of a job.
    pub(super) fn behaviour(&self, job_id: &str) -> sim_admin::JobBehaviour {
        self.behaviours
            .get(job_id)
            .copied()
            .unwrap_or(sim_admin::JobBehaviour::Cooperative)
    }

    fn schedule_ready(&mut self, job: String, role: String, incarnation: u64) {
        // A job told to hang on start never reaches running (nor prepared).
        if self.behaviour(&job) == sim_admin::JobBehaviour::HangStart {
            return;
        }
        let after = self.delay(START_MS);
        self.schedule(after, Action::InstanceReady { job, role, incarnation });
    }

    /// The start latency passed: the worker answers with running, prepared
    /// or an armed rejection. A silent (dead) worker answers nothing.
    pub(super) fn instance_ready(&mut self, job_id: &str, role: &str, incarnation: u64) {
        let key = (job_id.to_owned(), role.to_owned());
        let Some(instance) = self.instances.get(&key) else {
            return;
        };
        if instance.incarnation != incarnation || self.nodes.get(&instance.node_id).is_none_or(|n| n.silent) {
            return;
        }
        let (phase, defer, node_id) = (instance.phase, instance.defer_start, instance.node_id.clone());
        match phase {
            InstancePhase::Provisioned if self.take_rejection(job_id, role, &node_id) => {}
            InstancePhase::Provisioned if defer => {
                if let Some(i) = self.instances.get_mut(&key) {
                    i.phase = InstancePhase::Prepared;
                }
                self.emit(Event::JobPrepared(pb::JobPrepared {
                    job_key: Some(active_key(job_id, role)),
                    node_id: node_ref(&node_id),
                }));
            }
            InstancePhase::Provisioned | InstancePhase::Starting => {
                let now = self.now();
                let Some(i) = self.instances.get_mut(&key) else { return };
                i.phase = InstancePhase::Running;
                let entry = HistoryEntry::JobRunning(pb::JobHistoryJobRunning {
                    timestamp: Some(timestamp(now)),
                    role: role.to_owned(),
                    node_metadata: Some(i.node_metadata.clone()),
                    running_node_metadata: i.running_metadata.clone(),
                    service_port_mappings: Default::default(),
                });
                self.record(job_id, entry);
            }
            InstancePhase::Prepared | InstancePhase::Running | InstancePhase::Stopping => {}
        }
    }

    /// Answers a start with an armed rejection, if one is armed: the worker
    /// refuses with its code, words and inventory, and the instance is gone.
    /// The published API has no rejection: there the refusal shows as the
    /// job failing on the node (stopping with `JOB_STOPPED_JOB_FAILED`, then
    /// stopped), as a 1.0.384 Manager reports a job its worker gave up on.
    fn take_rejection(&mut self, job_id: &str, role: &str, node_id: &str) -> bool {
        let Some(armed) = self.rejections.get_mut(job_id) else {
            return false;
        };
        let (code, detail) = (armed.code, armed.detail.clone());
        armed.remaining = armed.remaining.saturating_sub(1);
        if armed.remaining == 0 {
            self.rejections.remove(job_id);
        }
        if self.api == Api::Published {
            self.stop_instance(job_id, role, StopReason::JobStoppedJobFailed);
            return true;
        }
        let inventory = self.nodes.get(node_id).and_then(|n| n.inventory.clone());
        self.emit(Event::JobRejected(pb::JobRejected {
            job_key: Some(active_key(job_id, role)),
            node_id: node_ref(node_id),
            code: code as i32,
            detail,
            inventory,
        }));
        self.remove_instance(job_id, role);
        true
    }

    /// Stopping now with `reason`, stopped after the stop latency.
    pub(super) fn stop_instance(&mut self, job_id: &str, role: &str, reason: StopReason) {
        let now = self.now();
        let key = (job_id.to_owned(), role.to_owned());
        let Some(instance) = self.instances.get_mut(&key) else {
            return;
        };
        if instance.phase == InstancePhase::Stopping {
            return;
        }
        instance.phase = InstancePhase::Stopping;
        let incarnation = instance.incarnation;
        let entry = stopping_entry(instance, role, reason, now);
        self.record(job_id, entry);
        let after = self.delay(STOP_MS);
        self.schedule(
            after,
            Action::InstanceStopped {
                job: key.0,
                role: key.1,
                incarnation,
            },
        );
    }

    /// The stop latency passed.
    pub(super) fn instance_stopped(&mut self, job_id: &str, role: &str, incarnation: u64) {
        let matches = self
            .instances
            .get(&(job_id.to_owned(), role.to_owned()))
            .is_some_and(|i| i.incarnation == incarnation && i.phase == InstancePhase::Stopping);
        if matches {
            self.remove_instance(job_id, role);
        }
    }

    /// Every live instance on a terminating node starts stopping.
    pub(super) fn stop_instances_on(&mut self, node_id: &str) {
        let now = self.now();
        for (job, role) in self.instance_keys_on(node_id) {
            let key = (job.clone(), role.clone());
            let Some(instance) = self.instances.get_mut(&key) else {
                continue;
            };
            if instance.phase == InstancePhase::Stopping {
                continue;
            }
            instance.phase = InstancePhase::Stopping;
            let entry = stopping_entry(instance, &role, StopReason::JobStoppedNodeTerminated, now);
            self.record(&job, entry);
        }
    }

    /// The node is gone: every instance on it is stopped.
    pub(super) fn drop_instances_on(&mut self, node_id: &str) {
        for (job, role) in self.instance_keys_on(node_id) {
            self.remove_instance(&job, &role);
        }
    }

    fn instance_keys_on(&self, node_id: &str) -> Vec<(String, String)> {
        self.instances
            .iter()
            .filter(|(_, i)| i.node_id == node_id)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// Removes an instance with a `Stopped` history entry, then deletes
    /// whatever was waiting for it (a doomed job, a deleting bundle).
    fn remove_instance(&mut self, job_id: &str, role: &str) {
        let Some(instance) = self.instances.remove(&(job_id.to_owned(), role.to_owned())) else {
            return;
        };
        let entry = HistoryEntry::JobStopped(pb::JobHistoryJobStopped {
            timestamp: Some(timestamp(self.now())),
            role: role.to_owned(),
            node_metadata: Some(instance.node_metadata),
            running_node_metadata: instance.running_metadata,
        });
        self.record(job_id, entry);
        self.reap();
    }

    /// The job's instances with their keys.
    pub(super) fn live_instances_of<'a>(
        &'a self,
        job_id: &'a str,
    ) -> impl Iterator<Item = (&'a str, &'a Instance)> + 'a {
        self.instances
            .range((job_id.to_owned(), String::new())..)
            .take_while(move |((job, _), _)| job == job_id)
            .map(|((_, role), i)| (role.as_str(), i))
    }

    /// The instance (on `node_id`, when one is named), or NOT_FOUND.
    pub(super) fn instance_mut(
        &mut self,
        job_id: &str,
        role: &str,
        node_id: &str,
    ) -> Result<&mut Instance, RequestError> {
        let unknown = || RequestError::UnknownInstance {
            job: job_id.to_owned(),
            role: role.to_owned(),
        };
        let instance = self
            .instances
            .get_mut(&(job_id.to_owned(), role.to_owned()))
            .ok_or_else(unknown)?;
        if !node_id.is_empty() && instance.node_id != node_id {
            return Err(RequestError::UnknownInstance {
                job: job_id.to_owned(),
                role: format!("{role} on node {node_id}"),
            });
        }
        Ok(instance)
    }

    /// Appends a history entry and streams the job.
    pub(super) fn record(&mut self, job_id: &str, entry: HistoryEntry) {
        if let Some(job) = self.jobs.get_mut(job_id) {
            job.history.push(pb::JobHistoryEntry {
                history_entry: Some(entry),
            });
            self.emit_job_updated(job_id);
        }
    }
}

fn stopping_entry(instance: &Instance, role: &str, reason: StopReason, now: i64) -> HistoryEntry {
    HistoryEntry::JobStopping(pb::JobHistoryJobStopping {
        timestamp: Some(timestamp(now)),
        role: role.to_owned(),
        node_metadata: Some(instance.node_metadata.clone()),
        running_node_metadata: instance.running_metadata.clone(),
        reason: reason as i32,
    })
}

/// The wire's (job, instance key) pair.
pub(crate) fn active_key(job_id: &str, role: &str) -> common::ActiveJobKey {
    common::ActiveJobKey {
        job_id: job_ref(job_id),
        role: role.to_owned(),
    }
}
