//! `start` / `stop`: a `startMode: manual` job's `startedReplicas` on its Bundle — the desired
//! state the operator brings Manager to: a started replica is placed and runs, a stopped one
//! is dormant with its instance stopped (and not recovered). Without `--replica` the command
//! applies to every replica of the job (the primary and, with a resiliencePolicy, the backup).
//!
//! The change is a merge patch of the Bundle's `spec.jobs` as the API server holds it, with
//! only that job's `startedReplicas` changed and the resource's `resourceVersion` as a
//! precondition, so a concurrent edit is never overwritten (the command reads again and
//! retries). By default it then waits until the operator's status, for the patched
//! generation, shows every named replica started (no longer `dormant`) or stopped (`dormant`
//! and off its node): exit 0; a refused Bundle (`Stalled`) or a job that cannot run (its
//! bundle broken, ended or being deleted) exits 1 with the reason. `--no-wait` returns once
//! the Bundle is patched.
//!
//! Under GitOps the manifest in Git is the desired state: change `startedReplicas` there, as
//! the next sync puts back what Git says.

use std::collections::BTreeSet;
use std::process::ExitCode;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::{Value, json};

use crate::crd::{Bundle, BundleStatus};
use crate::decide::conditions::{self, STALLED};
use crate::model::{JobPhase, StartMode, wire_name};

use super::{PluginError, watch_named};

/// How many times a patch that lost a race with another edit is tried again.
const CONFLICT_RETRIES: usize = 5;

/// What `start` / `stop` asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StartStop {
    /// The Bundle.
    pub bundle: String,
    /// The manual job.
    pub job: String,
    /// One replica, or every replica when `None`.
    pub replica: Option<u32>,
    /// Start (true) or stop.
    pub start: bool,
}

/// The patch `request` makes of `bundle`, if any: the job's new `startedReplicas` and the
/// replicas it names. Refused for an unknown job or replica and for an auto job.
pub fn started_replicas(bundle: &Bundle, request: &StartStop) -> Result<(BTreeSet<u32>, Vec<u32>), PluginError> {
    let spec = &bundle.spec.0;
    let name = bundle.name_any();
    let job = spec.job(&request.job).ok_or_else(|| PluginError::UnknownJob {
        bundle: name.clone(),
        job: request.job.clone(),
    })?;
    if job.start_mode != StartMode::Manual {
        return Err(PluginError::NotManualJob {
            bundle: name,
            job: request.job.clone(),
        });
    }
    let replicas: Vec<u32> = match request.replica {
        Some(r) if r < spec.replica_count() => vec![r],
        Some(r) => {
            return Err(PluginError::UnknownReplica {
                bundle: name,
                replica: r,
                replicas: spec.replica_count(),
            });
        }
        None => (0..spec.replica_count()).collect(),
    };
    let mut started: BTreeSet<u32> = job.started_replicas.iter().copied().collect();
    for r in &replicas {
        if request.start {
            started.insert(*r);
        } else {
            started.remove(r);
        }
    }
    Ok((started, replicas))
}

/// The Bundle's `spec.jobs` as stored, with `job`'s `startedReplicas` set to `started`.
fn patched_jobs(object: &DynamicObject, job: &str, started: &BTreeSet<u32>) -> Option<Value> {
    let mut jobs = object.data.get("spec")?.get("jobs")?.clone();
    let entry = jobs
        .as_array_mut()?
        .iter_mut()
        .find(|j| j.get("jobName").and_then(Value::as_str) == Some(job))?
        .as_object_mut()?;
    if started.is_empty() {
        entry.remove("startedReplicas");
    } else {
        entry.insert("startedReplicas".to_owned(), json!(started));
    }
    Some(jobs)
}

/// Patches the Bundle (retrying when another edit won the race); returns the generation the
/// operator must observe and the replicas named, or `None` when nothing had to change.
async fn patch(client: &Client, namespace: &str, request: &StartStop) -> Result<Option<(i64, Vec<u32>)>, PluginError> {
    let typed: Api<Bundle> = Api::namespaced(client.clone(), namespace);
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<Bundle>(&()));
    let name = &request.bundle;
    for _ in 0..CONFLICT_RETRIES {
        let bundle = typed
            .get_opt(name)
            .await
            .map_err(PluginError::request(format!("get bundle {name} in {namespace}")))?
            .ok_or_else(|| PluginError::UnknownBundle(format!("{namespace}/{name}")))?;
        let (started, replicas) = started_replicas(&bundle, request)?;
        let current: BTreeSet<u32> = bundle
            .spec
            .0
            .job(&request.job)
            .map(|j| j.started_replicas.iter().copied().collect())
            .unwrap_or_default();
        if current == started {
            return Ok(None);
        }
        let object = raw
            .get(name)
            .await
            .map_err(PluginError::request(format!("get bundle {name} in {namespace}")))?;
        let Some(jobs) = patched_jobs(&object, &request.job, &started) else {
            return Err(PluginError::UnknownJob {
                bundle: name.clone(),
                job: request.job.clone(),
            });
        };
        let body = json!({
            "metadata": {"resourceVersion": object.resource_version()},
            "spec": {"jobs": jobs},
        });
        match raw.patch(name, &PatchParams::default(), &Patch::Merge(&body)).await {
            Ok(patched) => return Ok(Some((patched.metadata.generation.unwrap_or_default(), replicas))),
            // Changed since it was read: read it again.
            Err(kube::Error::Api(status)) if status.code == 409 => continue,
            Err(source) => {
                return Err(PluginError::Request {
                    action: format!("patch bundle {name} in {namespace}"),
                    source,
                });
            }
        }
    }
    Err(PluginError::Contended(format!("{namespace}/{name}")))
}

/// How the operator answered, once it has.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartStopAnswer {
    /// Every named replica is where it was asked to be; per replica, its state and node.
    Done(Vec<(u32, JobPhase, Option<String>)>),
    /// The operator refused the Bundle, or the job cannot run; why.
    Refused(String),
}

/// The answer `status` gives for `request`'s `replicas` at `generation`, if the operator has
/// answered yet.
pub fn answer(
    status: &BundleStatus,
    generation: i64,
    request: &StartStop,
    replicas: &[u32],
) -> Option<StartStopAnswer> {
    if status.observed_generation.is_none_or(|g| g < generation) {
        return None;
    }
    if let Some(stalled) = conditions::find(&status.conditions, STALLED).filter(|c| c.status == "True") {
        return Some(StartStopAnswer::Refused(stalled.message.clone()));
    }
    let mut done = Vec::new();
    for &replica in replicas {
        let job = status
            .replicas
            .iter()
            .find(|r| r.index == replica)
            .and_then(|r| r.jobs.iter().find(|j| j.job_name == request.job))?;
        let settled = match (request.start, job.state) {
            (true, JobPhase::Dormant) => false,
            (true, cannot @ (JobPhase::Broken | JobPhase::Dropped | JobPhase::Ended | JobPhase::Deleting)) => {
                return Some(StartStopAnswer::Refused(format!(
                    "replica {replica} of {} cannot run: it is {}",
                    request.job,
                    wire_name(&cannot)
                )));
            }
            (true, _) => true,
            (false, state) => state != JobPhase::Stopping && job.node.is_none(),
        };
        if !settled {
            return None;
        }
        done.push((replica, job.state, job.node.clone()));
    }
    Some(StartStopAnswer::Done(done))
}

/// Watches the Bundle until the operator has answered.
async fn wait_for_answer(
    api: &Api<Bundle>,
    generation: i64,
    request: &StartStop,
    replicas: &[u32],
) -> Result<StartStopAnswer, PluginError> {
    let name = &request.bundle;
    let mut bundles = watch_named(api, name, "bundle");
    while let Some(bundle) = bundles.next().await {
        if let Some(answer) = bundle
            .status
            .as_ref()
            .and_then(|s| answer(s, generation, request, replicas))
        {
            return Ok(answer);
        }
    }
    Err(PluginError::LostBundle(name.clone()))
}

/// Patches the Bundle; unless `no_wait`, waits for the operator's answer.
pub async fn start_or_stop(
    client: Client,
    namespace: &str,
    request: StartStop,
    no_wait: bool,
) -> Result<ExitCode, PluginError> {
    let verb = if request.start { "started" } else { "stopped" };
    let what = format!("bundle/{} job {}", request.bundle, request.job);
    let api: Api<Bundle> = Api::namespaced(client.clone(), namespace);
    let (generation, replicas) = match patch(&client, namespace, &request).await? {
        Some(patched) => {
            println!("{what}: startedReplicas updated");
            patched
        }
        None => {
            println!("{what}: already {verb} in the Bundle's spec");
            let bundle = api.get(&request.bundle).await.map_err(PluginError::request(format!(
                "get bundle {} in {namespace}",
                request.bundle
            )))?;
            let (_, replicas) = started_replicas(&bundle, &request)?;
            (bundle.metadata.generation.unwrap_or_default(), replicas)
        }
    };
    if no_wait {
        return Ok(ExitCode::SUCCESS);
    }
    match wait_for_answer(&api, generation, &request, &replicas).await? {
        StartStopAnswer::Done(done) => {
            for (replica, state, node) in done {
                let on = node.map(|n| format!(" on {n}")).unwrap_or_default();
                println!("{what} replica {replica} {verb}: {}{on}", wire_name(&state));
            }
            Ok(ExitCode::SUCCESS)
        }
        StartStopAnswer::Refused(why) => {
            eprintln!("{what} not {verb}: {why}");
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::crd::{JobStatus, ReplicaStatus};

    fn bundle(yaml: &str) -> Bundle {
        yaml_serde::from_str(&format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: ch1}}\nspec:\n{yaml}"
        ))
        .unwrap()
    }

    fn request(job: &str, replica: Option<u32>, start: bool) -> StartStop {
        StartStop {
            bundle: "ch1".into(),
            job: job.into(),
            replica,
            start,
        }
    }

    const RESILIENT: &str = "  pool: p\n  resiliencePolicy: {}\n  jobs:\n  - {jobName: encode}\n  - {jobName: record, startMode: manual, startedReplicas: [1]}\n";

    #[test]
    fn without_a_replica_every_replica_of_the_job_is_named() {
        let b = bundle(RESILIENT);
        let (started, named) = started_replicas(&b, &request("record", None, true)).unwrap();
        assert_eq!((started, named), (BTreeSet::from([0, 1]), vec![0, 1]));
        let (started, named) = started_replicas(&b, &request("record", Some(1), false)).unwrap();
        assert_eq!((started, named), (BTreeSet::new(), vec![1]));
    }

    #[test]
    fn an_auto_job_an_unknown_job_or_replica_is_refused_before_anything_is_written() {
        let b = bundle(RESILIENT);
        let auto = started_replicas(&b, &request("encode", None, true)).unwrap_err();
        assert!(auto.to_string().contains("startMode auto"), "{auto}");
        let unknown = started_replicas(&b, &request("mux", None, true)).unwrap_err();
        assert!(unknown.to_string().contains("no job \"mux\""), "{unknown}");
        let replica = started_replicas(&b, &request("record", Some(2), true)).unwrap_err();
        assert!(
            replica.to_string().contains("replicas 0 (the primary) and 1"),
            "{replica}"
        );
    }

    #[test]
    fn only_the_jobs_started_replicas_change_in_the_stored_spec() {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "automanager.norsk.video/v1alpha1", "kind": "Bundle",
            "metadata": {"name": "ch1"},
            "spec": {"pool": "p", "jobs": [
                {"jobName": "encode", "startMode": "auto"},
                {"jobName": "record", "startMode": "manual", "startedReplicas": [1]}
            ]}
        }))
        .unwrap();
        let jobs = patched_jobs(&object, "record", &BTreeSet::from([0, 1])).unwrap();
        assert_eq!(jobs[0], json!({"jobName": "encode", "startMode": "auto"}));
        assert_eq!(jobs[1]["startedReplicas"], json!([0, 1]));
        let jobs = patched_jobs(&object, "record", &BTreeSet::new()).unwrap();
        assert_eq!(jobs[1], json!({"jobName": "record", "startMode": "manual"}));
    }

    fn status(generation: i64, state: JobPhase, node: Option<&str>) -> BundleStatus {
        BundleStatus {
            observed_generation: Some(generation),
            replicas: vec![ReplicaStatus {
                index: 0,
                jobs: vec![JobStatus {
                    job_name: "record".into(),
                    job_id: "default/ch1/0/record".into(),
                    node: node.map(Into::into),
                    state,
                    instance_key: None,
                    restarts_in_last_hour: 0,
                    gpu_index: None,
                    last_placement: None,
                    resilience_degraded: None,
                }],
            }],
            ..BundleStatus::default()
        }
    }

    #[test]
    fn a_start_is_answered_once_the_operator_took_the_job_out_of_dormant_at_the_patched_generation() {
        let start = request("record", Some(0), true);
        assert_eq!(
            answer(&status(2, JobPhase::Running, Some("a")), 3, &start, &[0]),
            None,
            "an older generation"
        );
        assert_eq!(answer(&status(3, JobPhase::Dormant, None), 3, &start, &[0]), None);
        assert_eq!(
            answer(&status(3, JobPhase::Starting, Some("a")), 3, &start, &[0]),
            Some(StartStopAnswer::Done(vec![(0, JobPhase::Starting, Some("a".into()))]))
        );
        assert!(matches!(
            answer(&status(3, JobPhase::Ended, None), 3, &start, &[0]),
            Some(StartStopAnswer::Refused(_))
        ));
    }

    #[test]
    fn a_stop_is_answered_once_the_job_is_off_its_node() {
        let stop = request("record", Some(0), false);
        assert_eq!(answer(&status(3, JobPhase::Stopping, Some("a")), 3, &stop, &[0]), None);
        assert_eq!(
            answer(&status(3, JobPhase::Dormant, None), 3, &stop, &[0]),
            Some(StartStopAnswer::Done(vec![(0, JobPhase::Dormant, None)]))
        );
    }
}
