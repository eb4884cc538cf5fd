//! Runtime jobs and their history.

use super::{Notes, WireError, bounded, id, intra_replica_from_pb, millis_from_pb, on_launch_from_pb};
use super::{required, requirements_from_pb, resilience_from_pb, tags_from_pb, verdict_from_pb};
use crate::manager::proto::{common as pbc, manager as pb};
use crate::model::{
    BundleId, BundleJobRef, InstanceKey, JobHistoryEntry, JobId, JobPlacementContext, JobSpec, JobState, JobStopReason,
    NodeId, RunningInstance,
};

/// A `JobId` message, which must carry a usable id.
pub fn job_id_from_pb(
    message: &'static str,
    field: &'static str,
    value: Option<&pbc::JobId>,
) -> Result<JobId, WireError> {
    let value = required(message, field, value)?;
    Ok(JobId(id(message, field, &value.job_id)?))
}

/// A job id as its wire message.
pub fn job_id_to_pb(job: &JobId) -> pbc::JobId {
    pbc::JobId { job_id: job.0.clone() }
}

/// An instance key from a `role` field. Plain Manager jobs may use an empty
/// role, which is kept; an over-long one is refused.
pub fn role_from_pb(message: &'static str, role: &str) -> Result<InstanceKey, WireError> {
    if role.is_empty() {
        return Ok(InstanceKey(String::new()));
    }
    Ok(InstanceKey(id(message, "role", role)?))
}

fn node_of(meta: Option<&pbc::NodeMetadata>) -> Option<NodeId> {
    meta.and_then(|m| m.node_id.as_ref())
        .filter(|n| !n.node_id.is_empty() && n.node_id.len() <= super::MAX_ID_BYTES)
        .map(|n| NodeId(n.node_id.clone()))
}

fn stop_reason(value: i32) -> JobStopReason {
    use pb::job_history_job_stopping::Reason;
    match Reason::try_from(value) {
        Ok(Reason::JobStoppedNodeStopped) => JobStopReason::NodeStopped,
        Ok(Reason::JobStoppedNodeTerminated) => JobStopReason::NodeTerminated,
        Ok(Reason::JobStoppedUserRequested) => JobStopReason::UserRequested,
        Ok(Reason::JobStoppedUnknownJob) => JobStopReason::UnknownJob,
        Ok(Reason::JobStoppedJobFailed) => JobStopReason::JobFailed,
        Err(_) => JobStopReason::Unknown(value),
    }
}

/// One history entry; an unknown case is kept as `Unknown`.
pub fn history_entry_from_pb(e: &pb::JobHistoryEntry) -> Result<JobHistoryEntry, WireError> {
    use pb::job_history_entry::HistoryEntry as H;
    const MSG: &str = "JobHistoryEntry";
    Ok(match &e.history_entry {
        Some(H::JobCreated(c)) => JobHistoryEntry::Created {
            at: millis_from_pb(c.timestamp.as_ref()),
        },
        Some(H::JobUpdated(u)) => JobHistoryEntry::Updated {
            at: millis_from_pb(u.timestamp.as_ref()),
        },
        Some(H::JobProvisioned(p)) => JobHistoryEntry::Provisioned {
            at: millis_from_pb(p.timestamp.as_ref()),
            role: role_from_pb(MSG, &p.role)?,
            node_id: node_of(p.node_metadata.as_ref()),
        },
        Some(H::JobRunning(r)) => JobHistoryEntry::Running {
            at: millis_from_pb(r.timestamp.as_ref()),
            role: role_from_pb(MSG, &r.role)?,
            node_id: node_of(r.node_metadata.as_ref()),
        },
        Some(H::JobStopping(s)) => JobHistoryEntry::Stopping {
            at: millis_from_pb(s.timestamp.as_ref()),
            role: role_from_pb(MSG, &s.role)?,
            node_id: node_of(s.node_metadata.as_ref()),
            reason: stop_reason(s.reason),
        },
        Some(H::JobStopped(s)) => JobHistoryEntry::Stopped {
            at: millis_from_pb(s.timestamp.as_ref()),
            role: role_from_pb(MSG, &s.role)?,
            node_id: node_of(s.node_metadata.as_ref()),
        },
        Some(H::JobCompleted(c)) => JobHistoryEntry::Completed {
            at: millis_from_pb(c.timestamp.as_ref()),
        },
        None => JobHistoryEntry::Unknown,
    })
}

/// A runtime job with its history, as Manager's job events carry it.
pub fn runtime_job_from_pb(
    jwh: Option<&pb::JobWithHistory>,
    notes: &mut Notes,
) -> Result<crate::model::RuntimeJob, WireError> {
    const MSG: &str = "Job";
    let jwh = required("JobEvent", "jobWithHistory", jwh)?;
    let job = required("JobWithHistory", "job", jwh.job.as_ref())?;
    let job_id = job_id_from_pb(MSG, "job_id", job.job_id.as_ref())?;
    bounded("JobWithHistory", "history_entry", jwh.history_entry.len())?;
    bounded(MSG, "parameters", job.parameters.len())?;
    let bundle_ref = job
        .bundle_ref
        .as_ref()
        .map(|r| {
            Ok::<_, WireError>(BundleJobRef {
                bundle_id: BundleId(id("BundleJobRef", "bundle_id", &r.bundle_id)?),
                replica_index: r.replica_index,
                job_name: id("BundleJobRef", "job_name", &r.job_name)?,
            })
        })
        .transpose()?;
    let rules = job.intra_replica.as_ref();
    let spec = JobSpec {
        job_name: bundle_ref
            .as_ref()
            .map_or_else(|| job_id.0.clone(), |r| r.job_name.clone()),
        template: job.template.clone(),
        requirements: job
            .requirements
            .as_ref()
            .map(requirements_from_pb)
            .transpose()?
            .unwrap_or_default(),
        co_locate_with: rules.map(|r| r.co_locate_with.clone()).unwrap_or_default(),
        separate_from: rules.map(|r| r.separate_from.clone()).unwrap_or_default(),
        exclusive: rules.is_some_and(|r| r.exclusive),
        single_use: rules.is_some_and(|r| r.single_use),
        start_mode: Default::default(),
        // Manager keeps which manual jobs run as the dormant flag.
        started_replicas: Vec::new(),
        parameters: job.parameters.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    };
    let context = rules.filter(|_| bundle_ref.is_some()).map(|r| JobPlacementContext {
        pool: r.pool.clone(),
        resilience_policy: r.resilience_policy.as_ref().map(resilience_from_pb),
        intra_replica_placement: intra_replica_from_pb(r.placement.as_ref()),
        on_launch: on_launch_from_pb(r.on_launch),
        override_reservation: r.override_reservation,
    });
    Ok(crate::model::RuntimeJob {
        state: match pb::job::JobState::try_from(job.state) {
            Ok(pb::job::JobState::Pre) => JobState::Pre,
            Ok(pb::job::JobState::Active) => JobState::Active,
            Ok(pb::job::JobState::Post) => JobState::Post,
            Err(_) => JobState::Unknown(job.state),
        },
        tags: tags_from_pb(MSG, &job.tags)?,
        start_date_time: millis_from_pb(job.start_date_time.as_ref()),
        bundle_ref,
        spec,
        context,
        dormant: job.dormant,
        terminal_verdict: job.terminal_verdict.as_ref().map(|v| verdict_from_pb(v, notes)),
        history: jwh
            .history_entry
            .iter()
            .map(history_entry_from_pb)
            .collect::<Result<_, _>>()?,
        job_id,
    })
}

/// A running instance as `NodeRunning` / `PhysicalNodeConnected` list it.
pub fn running_instance_from_pb(r: &pb::RunningJob) -> Result<RunningInstance, WireError> {
    const MSG: &str = "RunningJob";
    let key = required(MSG, "job_key", r.job_key.as_ref())?;
    Ok(RunningInstance {
        job_id: job_id_from_pb("ActiveJobKey", "jobId", key.job_id.as_ref())?,
        role: role_from_pb("ActiveJobKey", &key.role)?,
        node_id: super::node_id_from_pb(MSG, "node_id", r.node_id.as_ref())?,
    })
}
