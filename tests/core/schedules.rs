//! Scheduled bundles: placed `placementLeadMs` ahead of the start (the
//! largest lead of the pool's tiers), their provision timed out after twice
//! the lead, completed at the end and never placed again, living again once
//! rescheduled.

use norsk_auto_manager::automanager::{Command, Notification, Rpc};
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, JobState, ManagerEvent, NodeId, SchedulePhase};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn scheduled_start_is_placed_placement_lead_ahead() {
    let mut h = Harness::hydrated();
    let bundle = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(bundle.clone()));
    let mut job = jobs_of(&bundle).remove(0);
    job.state = JobState::Pre;
    job.start_date_time = Some(h.now + 10 * 60_000);
    h.event(ManagerEvent::JobPending(job));
    // The pool's cloud tiers lead by their default 5 minutes.
    h.advance(4 * 60_000 + 59_000);
    assert!(h.take_calls().is_empty(), "placed before placementLeadMs");
    h.advance(1_000);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1);
}

/// Pool `production` with one elastic AWS tier (lead: the cloud default).
const CLOUD_POOL: &str = "
- name: production
  tiers:
    - name: aws
      kind: aws
      region: eu-west-1
      candidateInstanceTypes: [{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4}]
";

/// Pool `production` with only registered cluster servers (lead 0).
const CLUSTER_POOL: &str = "
- name: production
  tiers:
    - {name: cluster, kind: local-servers, scaleOut: fixed}
";

fn with_pools(pools: &str) -> Harness {
    let mut settings = settings();
    settings.placement_pools = yaml_serde::from_str(pools).expect("pools parse");
    Harness::with(settings)
}

/// A one-job bundle booked from `start` (to `end`).
fn scheduled(start: i64, end: Option<i64>) -> String {
    let end = end.map(|e| format!(", end: '{}'", rfc3339(e))).unwrap_or_default();
    format!(
        "pool: production\nschedule: {{start: '{}'{end}}}\njobs:\n  - {{jobName: encode, requirements: {{requiredCapacity: 2}}}}\n",
        rfc3339(start)
    )
}

fn schedule_phases(notifications: &[Notification]) -> Vec<SchedulePhase> {
    notifications
        .iter()
        .filter_map(|n| match n {
            Notification::BundleSchedule { phase, .. } => Some(*phase),
            _ => None,
        })
        .collect()
}

#[test]
fn a_scheduled_bundle_on_a_cloud_tier_is_placed_its_five_minute_lead_ahead_and_not_before() {
    let mut h = with_pools(CLOUD_POOL);
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 20 * 60_000;
    h.bundle("b", &scheduled(start, None));
    assert!(h.take_calls().is_empty(), "placed twenty minutes ahead");
    let view = h.core.schedule_view(&"b".into(), h.now).expect("scheduled");
    assert_eq!(
        (view.phase, view.placing_from),
        (SchedulePhase::Waiting, start - 300_000)
    );
    h.advance(15 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "placed before placementLeadMs");
    h.advance(1);
    let calls = h.take_calls();
    assert!(
        create_node(&calls).is_some(),
        "a node is provisioned five minutes ahead: {calls:?}"
    );
}

#[test]
fn a_scheduled_bundle_on_a_cluster_tier_is_placed_at_its_start_and_not_before() {
    let mut h = with_pools(CLUSTER_POOL);
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 10 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(10 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "a cluster tier's lead is 0");
    h.advance(1);
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![("b/0/encode".to_owned(), "a".to_owned())]
    );
}

#[test]
fn a_mixed_cascade_is_placed_at_its_largest_lead_and_still_takes_its_cheaper_cluster_tier() {
    // Cluster servers, then AWS and OCI (5 minutes each).
    let mut h = Harness::hydrated();
    let start = h.now + 10 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(5 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "placed before the cloud tiers' lead");
    h.advance(1);
    let calls = h.take_calls();
    assert!(create_node(&calls).is_none(), "the cheaper cluster tier was skipped");
    let starts = start_jobs(&calls);
    assert_eq!(starts.len(), 1);
    assert!(["a", "b"].contains(&starts[0].1.as_str()), "{starts:?}");
}

#[test]
fn a_provision_for_a_scheduled_start_times_out_after_twice_its_lead() {
    let mut h =
        with_pools(&CLOUD_POOL.replace("region: eu-west-1", "region: eu-west-1\n      placementLeadMs: 900000"));
    h.event(ManagerEvent::InitialDataComplete);
    let start = h.now + 60 * 60_000;
    h.bundle("b", &scheduled(start, None));
    h.advance(45 * 60_000);
    let calls = h.take_calls();
    let (first, _, _) = create_node(&calls).expect("provisioned fifteen minutes ahead");
    h.ok(calls[0].0);
    // provisionTimeoutMs: max(placementLeadMs, 5 min) x 2 = 30 minutes.
    h.advance(30 * 60_000 - 1);
    assert!(h.take_calls().is_empty(), "re-placed before provisionTimeoutMs");
    h.advance(1);
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == first)),
        "the node that never started was not terminated: {calls:?}"
    );
    assert!(
        create_node(&calls).is_some_and(|(n, _, _)| n != first),
        "the job is re-placed"
    );
}

#[test]
fn a_schedule_moves_from_waiting_to_placing_live_and_ended_and_says_so_at_each_change() {
    let mut h = Harness::hydrated();
    let start = h.now + 10 * 60_000;
    let end = start + 10 * 60_000;
    h.bundle("b", &scheduled(start, Some(end)));
    assert!(
        schedule_phases(&h.take_notifications()).is_empty(),
        "a first sight is no change"
    );
    h.advance(5 * 60_000);
    h.start_all();
    h.advance(5 * 60_000);
    h.advance(10 * 60_000);
    assert_eq!(
        schedule_phases(&h.take_notifications()),
        [SchedulePhase::Placing, SchedulePhase::Live, SchedulePhase::Ended]
    );
    let view = h.core.schedule_view(&"b".into(), h.now).expect("scheduled");
    assert_eq!((view.phase, view.next), (SchedulePhase::Ended, None));
}

/// A bundle live from now to an hour from now, placed and running; returns
/// the harness at its end (its `CompleteJob` answered), the job and node.
fn at_its_end() -> (
    Harness,
    norsk_auto_manager::model::Bundle,
    norsk_auto_manager::model::JobId,
    NodeId,
) {
    let mut h = Harness::hydrated();
    let end = h.now + 60 * 60_000;
    let bundle = h.bundle("b", &scheduled(h.now, Some(end)));
    let (job, node) = h.start_all().remove(0);
    h.advance(60 * 60_000 - 1);
    assert!(
        !h.take_calls().iter().any(|(_, r)| matches!(r, Rpc::CompleteJob { .. })),
        "completed before its end"
    );
    h.advance(1);
    let calls = h.take_calls();
    let completes: Vec<_> = calls
        .iter()
        .filter(|(_, r)| matches!(r, Rpc::CompleteJob { job_id } if *job_id == job))
        .collect();
    assert_eq!(completes.len(), 1, "{calls:?}");
    h.ok(completes[0].0);
    (h, bundle, job, node)
}

#[test]
fn a_scheduled_bundle_is_completed_at_its_end_and_never_placed_again() {
    let (mut h, _, job, node) = at_its_end();
    // Manager stops the instance before it reports the job out of its
    // window: the job is not placed again meanwhile.
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node.clone()),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    h.stopped(&job, &node, InstanceKey("primary".into()));
    assert_eq!(h.bound_node(&job), None);
    h.advance(60_000);
    assert!(start_jobs(&h.take_calls()).is_empty(), "an ended job was placed again");
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobUpdated(runtime));
    h.advance(24 * 3_600_000);
    assert!(h.take_calls().is_empty(), "an ended job was placed or completed again");
}

#[test]
fn a_bundle_given_a_later_end_after_it_ended_lives_again() {
    let (mut h, mut bundle, job, node) = at_its_end();
    h.history(
        &job,
        JobHistoryEntry::Stopping {
            at: Some(h.now),
            role: InstanceKey("primary".into()),
            node_id: Some(node),
            reason: norsk_auto_manager::model::JobStopReason::UserRequested,
        },
    );
    let mut runtime = h.core.job(&job).unwrap().job.clone();
    runtime.state = JobState::Post;
    h.event(ManagerEvent::JobUpdated(runtime.clone()));
    h.take_calls();
    let schedule = bundle.spec.schedule.as_mut().unwrap();
    schedule.end = Some(norsk_auto_manager::model::DateTime::from_millis(h.now + 3_600_000));
    h.command(Command::UpdateBundle(bundle.clone()));
    let calls = h.take_calls();
    assert!(matches!(calls[0].1, Rpc::UpdateBundle(_)), "{calls:?}");
    h.ok(calls[0].0);
    // Manager stores the new schedule and re-dates the job.
    bundle.generation = 2;
    h.event(ManagerEvent::BundleUpdated(bundle));
    runtime.state = JobState::Active;
    h.event(ManagerEvent::JobUpdated(runtime));
    assert_eq!(
        start_jobs(&h.take_calls()).len(),
        1,
        "the rescheduled bundle was not placed"
    );
    let view = h.core.schedule_view(&"b".into(), h.now).unwrap();
    assert_eq!(view.phase, SchedulePhase::Live);
}
