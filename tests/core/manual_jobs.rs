//! Manual jobs, started and stopped as a desired state (`startedReplicas`,
//! or `startBundleJob` / `stopBundleJob`), never as a revision of the
//! bundle: a stopped job's instance is stopped and not recovered, and
//! restart history and the broken mark are kept.

use norsk_auto_manager::automanager::{Command, CommandError, Notification, Rpc};
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, ManagerEvent, RejectionCode};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn manual_start_mode_job_waits_for_start_bundle_job() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, startMode: manual, requirements: {requiredCapacity: 1}}\n",
    );
    assert!(h.take_calls().is_empty(), "a dormant job was placed");
    let job = job_id("b", 0, "encode");
    let reference = h.core.job(&job).unwrap().bundle_ref.clone();
    h.command(Command::StartBundleJob(reference));
    let calls = h.take_calls();
    assert!(matches!(calls[0].1, Rpc::StartBundleJob(_)));
    h.ok(calls[0].0);
    assert!(h.take_replies()[0].1.is_ok());
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.dormant = false;
    h.event(ManagerEvent::JobUpdated(runtime));
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
}

const MANUAL: &str = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: record, startMode: manual, requirements: {requiredCapacity: 1}}\n";

fn with_started(bundle: &norsk_auto_manager::model::Bundle, replicas: &[u32]) -> norsk_auto_manager::model::Bundle {
    let mut bundle = bundle.clone();
    bundle.spec.jobs[1].started_replicas = replicas.to_vec();
    bundle
}

fn only_call(
    calls: &[(norsk_auto_manager::automanager::RequestId, Rpc)],
    what: &str,
    matches: impl Fn(&Rpc) -> bool,
) -> norsk_auto_manager::automanager::RequestId {
    let found: Vec<_> = calls.iter().filter(|(_, r)| matches(r)).collect();
    assert_eq!(found.len(), 1, "one {what} expected: {calls:?}");
    found[0].0
}

#[test]
fn a_manual_job_is_started_and_stopped_from_the_bundle_spec_without_a_revision() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let encode = job_id("b", 0, "encode");
    let encode_node = h.bound_node(&encode);
    let record = job_id("b", 0, "record");
    let id = h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "starting a manual job is no revision: {calls:?}"
    );
    let toggle = only_call(
        &calls,
        "StartBundleJob",
        |r| matches!(r, Rpc::StartBundleJob(j) if j.job_name == "record"),
    );
    assert_eq!(h.take_replies(), vec![(id, Ok(()))]);
    h.ok(toggle);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "placed before Manager took it out of dormant"
    );
    h.dormant(&record, false);
    let started = h.start_all();
    let (_, node) = started
        .iter()
        .find(|(j, _)| *j == record)
        .cloned()
        .expect("the started job is placed");

    h.command(Command::UpdateBundle(with_started(&bundle, &[])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "{calls:?}"
    );
    only_call(
        &calls,
        "StopBundleJob",
        |r| matches!(r, Rpc::StopBundleJob(j) if j.job_name == "record"),
    );
    only_call(
        &calls,
        "StopJob",
        |r| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == record && *node_id == node),
    );
    for (id, _) in calls {
        h.ok(id);
    }
    h.dormant(&record, true);
    h.history(
        &record,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.advance(10 * 60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a stopped manual job was placed again"
    );
    assert_eq!(h.bound_node(&record), None);
    assert_eq!(h.bound_node(&encode), encode_node, "the other job was touched");
    assert_eq!(
        h.core.applied_spec(&"b".into()).unwrap().jobs[1].started_replicas,
        Vec::<u32>::new()
    );
}

#[test]
fn stopping_a_running_manual_job_stops_its_instance_and_it_is_not_recovered() {
    let mut h = Harness::hydrated();
    h.bundle("b", MANUAL);
    h.start_all();
    let record = job_id("b", 0, "record");
    let reference = h.core.job(&record).unwrap().bundle_ref.clone();
    let start = h.command(Command::StartBundleJob(reference.clone()));
    h.ok_all();
    assert_eq!(h.take_replies(), vec![(start, Ok(()))]);
    h.dormant(&record, false);
    let (_, node) = h.start_all().remove(0);
    let stop = h.command(Command::StopBundleJob(reference));
    let calls = h.take_calls();
    let toggle = only_call(&calls, "StopBundleJob", |r| matches!(r, Rpc::StopBundleJob(_)));
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(stop, Ok(()))]);
    let calls = h.take_calls();
    let stop_job = only_call(
        &calls,
        "StopJob",
        |r| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == record && *node_id == node),
    );
    h.ok(stop_job);
    assert!(
        h.take_notifications()
            .iter()
            .any(|n| matches!(n, Notification::BundleJobStopped { job_id } if *job_id == record))
    );
    // The instance is gone before Manager reports the job dormant: it is
    // still not recovered.
    h.history(
        &record,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.stopped(&record, &node, InstanceKey("primary".into()));
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "the stopped job was recovered");
    h.dormant(&record, true);
    h.advance(60_000);
    assert!(h.take_calls().is_empty());
    assert!(h.core.is_dormant(h.core.job(&record).unwrap()));
}

#[test]
fn starting_and_stopping_a_manual_job_keeps_restart_history_and_the_broken_mark() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let encode = job_id("b", 0, "encode");
    let record = job_id("b", 0, "record");
    fail_and_recover(&mut h, &encode);
    let restarts = |h: &Harness| h.core.job(&encode).unwrap().restarts.count(h.now);
    assert_eq!(restarts(&h), 1);
    h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    h.ok_all();
    h.dormant(&record, false);
    h.start_all();
    assert_eq!(restarts(&h), 1, "starting a manual job cleared the restart history");
    h.command(Command::UpdateBundle(with_started(&bundle, &[])));
    h.ok_all();
    assert_eq!(restarts(&h), 1, "stopping a manual job cleared the restart history");

    let on = h.bound_node(&encode).unwrap();
    reject(&mut h, &encode, &on.0, RejectionCode::InvalidSpec, "bad");
    assert_eq!(h.core.broken_bundles().len(), 1);
    h.ok_all();
    h.command(Command::UpdateBundle(with_started(&bundle, &[0])));
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::UpdateBundle(_))),
        "{calls:?}"
    );
    for (id, _) in calls {
        h.ok(id);
    }
    assert_eq!(
        h.core.broken_bundles().len(),
        1,
        "starting a manual job revived a broken bundle"
    );
    h.dormant(&record, false);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a job of a broken bundle was placed"
    );
}

#[test]
fn start_bundle_job_of_an_auto_job_or_a_missing_replica_is_refused_with_the_reason() {
    let mut h = Harness::hydrated();
    h.bundle("b", MANUAL);
    let encode = h.core.job(&job_id("b", 0, "encode")).unwrap().bundle_ref.clone();
    h.command(Command::StartBundleJob(encode));
    let mut backup = h.core.job(&job_id("b", 0, "record")).unwrap().bundle_ref.clone();
    backup.replica_index = 1;
    h.command(Command::StopBundleJob(backup));
    let replies = h.take_replies();
    assert!(
        matches!(replies[0].1, Err(CommandError::NotManualJob { .. })),
        "{replies:?}"
    );
    assert!(
        matches!(replies[1].1, Err(CommandError::UnknownBundleJob { .. })),
        "{replies:?}"
    );
    let message = replies[0].1.clone().unwrap_err().to_string();
    assert!(message.contains("startMode auto"), "{message}");
    assert!(
        !h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StartBundleJob(_) | Rpc::StopBundleJob(_))),
        "a refused toggle reached Manager"
    );
}

#[test]
fn a_start_asked_before_the_bundles_events_arrive_is_kept() {
    let mut h = Harness::hydrated();
    let bundle = bundle("b", MANUAL);
    let create = h.command(Command::CreateBundle(bundle.clone()));
    let calls = h.take_calls();
    h.ok(calls[0].0);
    let record = norsk_auto_manager::model::BundleJobRef {
        bundle_id: "b".into(),
        replica_index: 0,
        job_name: "record".into(),
    };
    let start = h.command(Command::StartBundleJob(record));
    let calls = h.take_calls();
    let toggle = only_call(&calls, "StartBundleJob", |r| matches!(r, Rpc::StartBundleJob(_)));
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(create, Ok(())), (start, Ok(()))]);
    // Manager's news of the creation and the start come after.
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    for mut job in jobs_of(&bundle) {
        job.dormant = false;
        h.event(ManagerEvent::JobActive(job));
    }
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::StopBundleJob(_))),
        "the start was undone: {calls:?}"
    );
    assert_eq!(start_jobs(&calls).len(), 2, "both jobs are placed");
}

#[test]
fn a_fresh_core_after_a_stream_break_answers_a_start_in_flight_and_keeps_what_is_wanted() {
    let mut h = Harness::hydrated();
    let bundle = h.bundle("b", MANUAL);
    h.start_all();
    let record = job_id("b", 0, "record");
    let reference = h.core.job(&record).unwrap().bundle_ref.clone();
    let start = h.command(Command::StartBundleJob(reference));
    let toggle = only_call(&h.take_calls(), "StartBundleJob", |r| {
        matches!(r, Rpc::StartBundleJob(_))
    });
    // The stream breaks with the start in flight; a fresh core hydrates
    // from the new snapshot, where Manager already holds the job started.
    let valid = norsk_auto_manager::automanager::validate_auto_settings(settings()).expect("settings are valid");
    h.core = norsk_auto_manager::automanager::AutoManagerCore::succeeding(valid, &h.core);
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    for mut job in jobs_of(&bundle) {
        job.dormant = false;
        h.event(ManagerEvent::JobActive(job));
    }
    h.event(ManagerEvent::InitialDataComplete);
    h.ok(toggle);
    assert_eq!(h.take_replies(), vec![(start, Ok(()))], "the start was never answered");
    let calls = h.take_calls();
    assert!(
        !calls.iter().any(|(_, r)| matches!(r, Rpc::StopBundleJob(_))),
        "{calls:?}"
    );
    assert!(start_jobs(&calls).iter().any(|(j, _)| *j == record.0), "{calls:?}");
    assert_eq!(h.core.applied_spec(&"b".into()).unwrap().jobs[1].started_replicas, [0]);
}
