//! Job instances: start to running, deferred start, stop, failure,
//! rejection, hanging starts, and the worker side of a handover.

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, job_history_entry::HistoryEntry, job_history_job_stopping::Reason,
    migration_signal_event, migration_signal_request,
};
use norsk_auto_manager::manager::proto::sim_admin;

use crate::sim_support::{Events, Sim, job_update, start_request};

fn job_id(id: &str) -> Option<common::JobId> {
    Some(common::JobId { job_id: id.into() })
}

/// A simulator with one cluster node, one job and an open stream past its
/// snapshot.
async fn with_job() -> (Sim, Events) {
    let sim = Sim::start().await;
    sim.register("rack-1", 8.0).await;
    sim.register("rack-2", 8.0).await;
    sim.create_job("j1").await;
    let mut events = sim.events().await;
    events.snapshot().await;
    (sim, events)
}

/// Waits for the job's next history entry for which `want` answers.
async fn history<T>(events: &mut Events, want: impl Fn(&HistoryEntry) -> Option<T>) -> T {
    events
        .until(|e| job_update(e).and_then(|(_, h)| h).and_then(&want))
        .await
        .0
}

#[tokio::test]
async fn a_started_job_is_provisioned_on_its_node_then_running() {
    let (sim, mut events) = with_job().await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    let provisioned = history(&mut events, |h| match h {
        HistoryEntry::JobProvisioned(p) => Some(p.clone()),
        _ => None,
    })
    .await;
    assert_eq!(provisioned.role, "primary");
    assert_eq!(provisioned.node_metadata.unwrap().node_id.unwrap().node_id, "rack-1");
    let running = history(&mut events, |h| match h {
        HistoryEntry::JobRunning(r) => Some(r.role.clone()),
        _ => None,
    })
    .await;
    assert_eq!(running, "primary");
    // Starting the same instance again changes nothing.
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    assert_eq!(sim.snapshot().await.nodes[0].instances.len(), 1);
    sim.shutdown().await;
}

#[tokio::test]
async fn a_deferred_start_is_prepared_and_runs_after_start_prepared_job() {
    let (sim, mut events) = with_job().await;
    let request = pb::StartJobRequest {
        defer_start: true,
        ..start_request("j1", "primary@3f9c1e2a", "rack-1")
    };
    sim.manager.clone().start_job(request).await.unwrap();
    let (prepared, seen) = events
        .until(|e| match e {
            Event::JobPrepared(p) => Some(p.clone()),
            _ => None,
        })
        .await;
    assert_eq!(prepared.job_key.unwrap().role, "primary@3f9c1e2a");
    assert!(
        !seen
            .iter()
            .any(|e| matches!(job_update(e), Some((_, Some(HistoryEntry::JobRunning(_))))))
    );
    let start = pb::StartPreparedJobRequest {
        job_id: job_id("j1"),
        role: "primary@3f9c1e2a".into(),
        node_id: Some(common::NodeId {
            node_id: "rack-1".into(),
        }),
    };
    sim.manager.clone().start_prepared_job(start).await.unwrap();
    let running = history(&mut events, |h| match h {
        HistoryEntry::JobRunning(r) => Some(r.role.clone()),
        _ => None,
    })
    .await;
    assert_eq!(running, "primary@3f9c1e2a");
    sim.shutdown().await;
}

#[tokio::test]
async fn an_armed_rejection_answers_the_next_start_with_job_rejected_and_its_code() {
    let (sim, mut events) = with_job().await;
    let reject = sim_admin::RejectJobRequest {
        job_id: "j1".into(),
        code: pb::JobRejectionCode::JobRejectedInvalidSpec as i32,
        detail: "encoder preset 'ultra' does not exist".into(),
        times: 1,
    };
    sim.admin.clone().reject_job(reject).await.unwrap();
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    let (rejected, seen) = events
        .until(|e| match e {
            Event::JobRejected(r) => Some(r.clone()),
            _ => None,
        })
        .await;
    assert_eq!(rejected.code, pb::JobRejectionCode::JobRejectedInvalidSpec as i32);
    assert_eq!(rejected.detail, "encoder preset 'ultra' does not exist");
    assert_eq!(rejected.job_key.unwrap().role, "primary");
    assert_eq!(
        rejected.inventory.unwrap().total_capacity,
        8.0,
        "the inventory the worker sent"
    );
    assert!(
        !seen
            .iter()
            .any(|e| matches!(job_update(e), Some((_, Some(HistoryEntry::JobRunning(_))))))
    );
    // The rejection was for one start only.
    sim.start_job("j1", "primary", "rack-2").await.unwrap();
    history(&mut events, |h| matches!(h, HistoryEntry::JobRunning(_)).then_some(())).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_stopped_instance_goes_stopping_user_requested_then_stopped() {
    let (sim, mut events) = with_job().await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    history(&mut events, |h| matches!(h, HistoryEntry::JobRunning(_)).then_some(())).await;
    let stop = pb::StopJobRequest {
        job_id: job_id("j1"),
        role: "primary".into(),
        node_id: None,
    };
    sim.manager.clone().stop_job(stop).await.unwrap();
    let reason = history(&mut events, |h| match h {
        HistoryEntry::JobStopping(s) => Some(s.reason),
        _ => None,
    })
    .await;
    assert_eq!(reason, Reason::JobStoppedUserRequested as i32);
    history(&mut events, |h| matches!(h, HistoryEntry::JobStopped(_)).then_some(())).await;
    assert!(sim.snapshot().await.nodes.iter().all(|n| n.instances.is_empty()));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_failed_job_stops_with_job_failed() {
    let (sim, mut events) = with_job().await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    history(&mut events, |h| matches!(h, HistoryEntry::JobRunning(_)).then_some(())).await;
    let fail = sim_admin::JobRef {
        job_id: "j1".into(),
        ..Default::default()
    };
    sim.admin.clone().fail_job(fail).await.unwrap();
    let reason = history(&mut events, |h| match h {
        HistoryEntry::JobStopping(s) => Some(s.reason),
        _ => None,
    })
    .await;
    assert_eq!(reason, Reason::JobStoppedJobFailed as i32);
    history(&mut events, |h| matches!(h, HistoryEntry::JobStopped(_)).then_some(())).await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_told_to_hang_on_start_never_reaches_running() {
    let (sim, mut events) = with_job().await;
    sim.create_job("j2").await;
    let hang = sim_admin::SetJobBehaviourRequest {
        job_id: "j1".into(),
        behaviour: sim_admin::JobBehaviour::HangStart as i32,
    };
    sim.admin.clone().set_job_behaviour(hang).await.unwrap();
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    sim.start_job("j2", "primary", "rack-2").await.unwrap();
    // Timers fire in simulated-time order, so by the end of a keepalive
    // timeout (30 s) every start (at most 6 s) has answered.
    sim.register("rack-3", 8.0).await;
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef {
            node_id: "rack-3".into(),
        })
        .await
        .unwrap();
    let (_, seen) = events.until(|e| matches!(e, Event::NodeStopped(_)).then_some(())).await;
    let running: Vec<_> = seen
        .iter()
        .filter_map(|e| match job_update(e) {
            Some((job, Some(HistoryEntry::JobRunning(_)))) => Some(job),
            _ => None,
        })
        .collect();
    assert_eq!(running, ["j2"]);
    sim.shutdown().await;
}

fn signal(signal: migration_signal_request::Signal) -> pb::MigrationSignalRequest {
    pb::MigrationSignalRequest {
        migration_id: "m1".into(),
        job_id: job_id("j1"),
        source_key: "primary".into(),
        target_key: "primary@3f9c1e2a".into(),
        signal: Some(signal),
    }
}

async fn answer(events: &mut Events) -> pb::MigrationSignalEvent {
    events
        .until(|e| match e {
            Event::MigrationSignal(s) => Some(s.clone()),
            _ => None,
        })
        .await
        .0
}

#[tokio::test]
async fn a_handover_is_answered_by_target_source_then_target_while_both_instances_run() {
    let (sim, mut events) = with_job().await;
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    sim.start_job("j1", "primary@3f9c1e2a", "rack-2").await.unwrap();
    let snapshot = sim.snapshot().await;
    let placed: Vec<_> = snapshot.fleet.nodes.iter().map(|n| n.jobs.len()).collect();
    assert_eq!(placed, [1, 1], "the source and the target are both placed");

    let handover = migration_signal_request::Signal::Propose(pb::MigrationStrategy::Handover as i32);
    sim.manager
        .clone()
        .send_migration_signal(signal(handover))
        .await
        .unwrap();
    let ready = answer(&mut events).await;
    assert_eq!(ready.from_key, "primary@3f9c1e2a");
    let Some(migration_signal_event::Signal::TargetReady(payload)) = ready.signal else {
        panic!("{ready:?}")
    };

    sim.manager
        .clone()
        .send_migration_signal(signal(migration_signal_request::Signal::StopOutputAt(payload)))
        .await
        .unwrap();
    let stopped = answer(&mut events).await;
    assert_eq!(stopped.from_key, "primary");
    let Some(migration_signal_event::Signal::SourceStoppedAt(position)) = stopped.signal else {
        panic!()
    };

    sim.manager
        .clone()
        .send_migration_signal(signal(migration_signal_request::Signal::ApplyFrom(position)))
        .await
        .unwrap();
    let applied = answer(&mut events).await;
    assert_eq!(applied.from_key, "primary@3f9c1e2a");
    assert_eq!(applied.signal, Some(migration_signal_event::Signal::TargetApplied(())));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_that_refuses_handover_answers_refused() {
    let (sim, mut events) = with_job().await;
    sim.start_job("j1", "primary@3f9c1e2a", "rack-2").await.unwrap();
    let refuse = sim_admin::SetJobBehaviourRequest {
        job_id: "j1".into(),
        behaviour: sim_admin::JobBehaviour::RefuseHandover as i32,
    };
    sim.admin.clone().set_job_behaviour(refuse).await.unwrap();
    let handover = migration_signal_request::Signal::Propose(pb::MigrationStrategy::Handover as i32);
    sim.manager
        .clone()
        .send_migration_signal(signal(handover))
        .await
        .unwrap();
    let refused = answer(&mut events).await;
    assert!(
        matches!(refused.signal, Some(migration_signal_event::Signal::Refused(_))),
        "{refused:?}"
    );
    sim.shutdown().await;
}
