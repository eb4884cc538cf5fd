//! Helpers shared by the core's scenario files (`hydration`, `placement`,
//! `recovery`, `nodes`, ...): the one-job bundle, the calls the core made,
//! and the few steps (a job running, failing and recovered, rejected,
//! ended) that several rules start from.

use norsk_auto_manager::automanager::Rpc;
use norsk_auto_manager::model::{JobState, ManagerEvent, NodeId, ProviderKind, RejectionCode};

use super::*;

pub const ONE_JOB: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2}}\n";

pub fn start_jobs(calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)]) -> Vec<(String, String)> {
    calls
        .iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::StartJob { job_id, node_id, .. } => Some((job_id.0.clone(), node_id.0.clone())),
            _ => None,
        })
        .collect()
}

pub fn empty_hydrated() -> Harness {
    let mut h = Harness::new();
    h.event(ManagerEvent::InitialDataComplete);
    h
}

pub fn create_node(
    calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)],
) -> Option<(NodeId, ProviderKind, std::collections::BTreeMap<String, String>)> {
    calls.iter().find_map(|(_, rpc)| match rpc {
        Rpc::CreateNode {
            node_id,
            provider,
            tags,
            ..
        } => Some((node_id.clone(), *provider, tags.clone())),
        _ => None,
    })
}

pub fn placed_and_running() -> (Harness, norsk_auto_manager::model::JobId, NodeId) {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let started = h.start_all();
    let (job, node) = started[0].clone();
    h.take_notifications();
    (h, job, node)
}

/// Fails the job where it runs, lets the recovery interval pass, and
/// starts the re-placement; returns the calls made.
pub fn fail_and_recover(
    h: &mut Harness,
    job: &norsk_auto_manager::model::JobId,
) -> Vec<(norsk_auto_manager::automanager::RequestId, Rpc)> {
    let node = h.bound_node(job).expect("job is bound");
    h.failed(job, &node);
    h.advance(5_000);
    let calls = h.take_calls();
    for (id, rpc) in &calls {
        h.ok(*id);
        if let Rpc::StartJob { job_id, node_id, .. } = rpc {
            h.running(job_id, node_id);
        }
    }
    calls
}

pub fn reject(h: &mut Harness, job: &norsk_auto_manager::model::JobId, node: &str, code: RejectionCode, detail: &str) {
    h.event(ManagerEvent::JobRejected {
        job_id: job.clone(),
        role: norsk_auto_manager::model::InstanceKey("primary".into()),
        node_id: NodeId::from(node),
        code,
        detail: detail.into(),
        inventory: None,
    });
}

pub const SINGLE_USE: &str = "pool: production\njobs:\n  - {jobName: encode, exclusive: true, singleUse: true, requirements: {requiredCapacity: 2}}\n";

pub fn job_ends(h: &mut Harness, job: &norsk_auto_manager::model::JobId) {
    let mut runtime = h.core.job(job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobOutOfWindow(runtime));
}
