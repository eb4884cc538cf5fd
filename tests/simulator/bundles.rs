//! Bundles: expansion into runtime jobs, idempotent create, update, the
//! stop-then-delete saga, dormant jobs and terminal verdicts.

use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, job_history_entry::HistoryEntry,
};
use tonic::Code;

use crate::sim_support::{Events, Sim, job_update, kind};

fn bundle(resilient: bool) -> pb::Bundle {
    pb::Bundle {
        bundle_id: "news/ch1".into(),
        pool: "studio".into(),
        resilience_policy: resilient.then(|| pb::ResiliencePolicy {
            pool: "oci-fra".into(),
            ..Default::default()
        }),
        jobs: vec![
            pb::BundleJobSpec {
                job_name: "encode".into(),
                template: "xyz".into(),
                requirements: Some(pb::JobRequirements {
                    required_capacity: 2.0,
                    ..Default::default()
                }),
                parameters: [("bitrate".to_owned(), "5000".to_owned())].into(),
                ..Default::default()
            },
            pb::BundleJobSpec {
                job_name: "package".into(),
                start_mode: pb::StartMode::Manual as i32,
                ..Default::default()
            },
        ],
        backup_parameter_overrides: [(
            "encode".to_owned(),
            pb::ParameterOverrides {
                values: [("bitrate".to_owned(), "3000".to_owned())].into(),
            },
        )]
        .into(),
        ..Default::default()
    }
}

async fn started() -> (Sim, Events) {
    let sim = Sim::start().await;
    sim.register("rack-1", 16.0).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    (sim, events)
}

fn job_ids(ack: &pb::BundleAck) -> Vec<&str> {
    ack.job_ids.iter().map(|j| j.job_id.as_str()).collect()
}

#[tokio::test]
async fn a_bundle_expands_into_one_runtime_job_per_replica_and_job_name() {
    let (sim, mut events) = started().await;
    let ack = sim
        .manager
        .clone()
        .create_bundle(bundle(true))
        .await
        .unwrap()
        .into_inner();
    let expected = [
        "news/ch1/0/encode",
        "news/ch1/0/package",
        "news/ch1/1/encode",
        "news/ch1/1/package",
    ];
    assert_eq!(job_ids(&ack), expected);
    let stored = ack.bundle.unwrap();
    assert_eq!((stored.generation, stored.state), (1, pb::BundleState::Live as i32));

    let Event::BundleUpdated(_) = events.next().await else {
        panic!("bundle_updated first")
    };
    let mut jobs = Vec::new();
    for _ in 0..4 {
        let Event::JobActive(active) = events.next().await else {
            panic!("then job_active per job")
        };
        jobs.push(active.job_with_history.unwrap().job.unwrap());
    }
    let ids: Vec<_> = jobs.iter().map(|j| j.job_id.clone().unwrap().job_id).collect();
    assert_eq!(ids, expected);
    let backup_encode = &jobs[2];
    assert_eq!(
        backup_encode.parameters["bitrate"], "3000",
        "backup overrides on replica 1"
    );
    assert_eq!(jobs[0].parameters["bitrate"], "5000");
    assert_eq!(backup_encode.bundle_ref.as_ref().unwrap().replica_index, 1);
    assert_eq!(backup_encode.intra_replica.as_ref().unwrap().pool, "oci-fra");
    assert_eq!(backup_encode.requirements.as_ref().unwrap().required_capacity, 2.0);
    assert_eq!(backup_encode.template, "xyz");
    assert!(jobs[1].dormant && !jobs[0].dormant, "startMode manual is dormant");

    let primary_only = pb::Bundle {
        bundle_id: "news/ch2".into(),
        ..bundle(false)
    };
    let ack = sim
        .manager
        .clone()
        .create_bundle(primary_only)
        .await
        .unwrap()
        .into_inner();
    assert_eq!(job_ids(&ack), ["news/ch2/0/encode", "news/ch2/0/package"]);
    sim.shutdown().await;
}

#[tokio::test]
async fn creating_a_bundle_again_is_a_no_op_for_the_same_spec_and_already_exists_for_another() {
    let (sim, _events) = started().await;
    sim.manager.clone().create_bundle(bundle(false)).await.unwrap();
    let again = sim
        .manager
        .clone()
        .create_bundle(bundle(false))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(again.bundle.unwrap().generation, 1);
    assert_eq!(sim.snapshot().await.jobs.len(), 2);
    let other = pb::Bundle {
        pool: "elsewhere".into(),
        ..bundle(false)
    };
    let err = sim.manager.clone().create_bundle(other).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    sim.shutdown().await;
}

#[tokio::test]
async fn deleting_a_bundle_stops_every_instance_then_deletes_its_jobs_then_the_bundle() {
    let (sim, mut events) = started().await;
    sim.manager.clone().create_bundle(bundle(true)).await.unwrap();
    sim.start_job("news/ch1/0/encode", "primary", "rack-1").await.unwrap();
    sim.start_job("news/ch1/1/encode", "backup", "rack-1").await.unwrap();
    let mut running = 0;
    events
        .until(|e| {
            running += usize::from(matches!(job_update(e), Some((_, Some(HistoryEntry::JobRunning(_))))));
            (running == 2).then_some(())
        })
        .await;

    sim.manager
        .clone()
        .delete_bundle(pb::BundleId {
            bundle_id: "news/ch1".into(),
        })
        .await
        .unwrap();
    let (_, seen) = events
        .until(|e| matches!(e, Event::BundleDeleted(_)).then_some(()))
        .await;
    let seen: Vec<_> = seen.into_iter().filter(|e| kind(e) != "audit_appended").collect();
    let Event::BundleUpdated(deleting) = &seen[0] else {
        panic!("bundle_updated first: {:?}", seen[0])
    };
    assert_eq!(
        deleting.bundle.as_ref().unwrap().state,
        pb::BundleState::Deleting as i32
    );
    let last_stop = seen
        .iter()
        .rposition(|e| matches!(job_update(e), Some((_, Some(HistoryEntry::JobStopped(_))))))
        .expect("instances stopped");
    let first_delete = seen
        .iter()
        .position(|e| kind(e) == "job_deleted")
        .expect("jobs deleted");
    assert!(last_stop < first_delete, "stop, then delete");
    assert_eq!(seen.iter().filter(|e| kind(e) == "job_deleted").count(), 4);
    let snapshot = sim.snapshot().await;
    assert!(snapshot.bundles.is_empty() && snapshot.jobs.is_empty());
    sim.shutdown().await;
}

#[tokio::test]
async fn an_update_revives_the_bundle_clears_its_verdict_refuses_a_stale_one_and_removes_dropped_jobs() {
    let (sim, mut events) = started().await;
    sim.manager.clone().create_bundle(bundle(true)).await.unwrap();
    let verdict = pb::SetTerminalVerdictRequest {
        bundle_id: "news/ch1".into(),
        job_id: None,
        verdict: Some(pb::TerminalVerdict {
            kind: pb::VerdictKind::Broken as i32,
            reason: "restart ceiling".into(),
            at: None,
        }),
        generation: 1,
    };
    sim.manager.clone().set_terminal_verdict(verdict.clone()).await.unwrap();
    let (broken, _) = events
        .until(|e| match e {
            Event::BundleUpdated(b) => b.bundle.clone().filter(|b| b.terminal_verdict.is_some()),
            _ => None,
        })
        .await;
    assert_eq!(broken.terminal_verdict.unwrap().reason, "restart ceiling");

    let ack = sim
        .manager
        .clone()
        .update_bundle(bundle(false))
        .await
        .unwrap()
        .into_inner();
    let updated = ack.bundle.unwrap();
    assert_eq!(updated.generation, 2);
    assert_eq!(updated.state, pb::BundleState::Live as i32);
    assert!(updated.terminal_verdict.is_none());
    // A verdict decided for generation 1 that arrives after the update is
    // refused, and the bundle stays live.
    let stale = sim.manager.clone().set_terminal_verdict(verdict).await;
    assert_eq!(stale.unwrap_err().code(), Code::FailedPrecondition);
    let snapshot = sim.snapshot().await;
    let stored = snapshot
        .bundles
        .iter()
        .find(|b| b.bundle_id.as_str() == "news/ch1")
        .unwrap();
    assert!(stored.terminal_verdict.is_none(), "{stored:?}");
    let mut deleted = Vec::new();
    events
        .until(|e| {
            if let Event::JobDeleted(d) = e {
                deleted.push(d.job_id.clone().unwrap().job_id);
            }
            (deleted.len() == 2).then_some(())
        })
        .await;
    deleted.sort();
    assert_eq!(
        deleted,
        ["news/ch1/1/encode", "news/ch1/1/package"],
        "the backup replica is gone"
    );
    let err = sim
        .manager
        .clone()
        .update_bundle(pb::Bundle {
            bundle_id: "nope".into(),
            ..bundle(false)
        })
        .await;
    assert_eq!(err.unwrap_err().code(), Code::NotFound);
    sim.shutdown().await;
}

#[tokio::test]
async fn start_bundle_job_activates_a_dormant_job_and_stop_bundle_job_makes_it_dormant_again() {
    let (sim, mut events) = started().await;
    sim.manager.clone().create_bundle(bundle(false)).await.unwrap();
    let package = pb::BundleJobRef {
        bundle_id: "news/ch1".into(),
        replica_index: 0,
        job_name: "package".into(),
    };
    sim.manager.clone().start_bundle_job(package.clone()).await.unwrap();
    let dormant = |e: &Event| match e {
        Event::JobUpdated(u) => u
            .job_with_history
            .as_ref()
            .and_then(|j| j.job.as_ref())
            .map(|j| j.dormant),
        _ => None,
    };
    assert!(!events.until(dormant).await.0);
    sim.manager.clone().stop_bundle_job(package.clone()).await.unwrap();
    assert!(events.until(dormant).await.0);
    let missing = pb::BundleJobRef {
        job_name: "mux".into(),
        ..package
    };
    assert_eq!(
        sim.manager.clone().start_bundle_job(missing).await.unwrap_err().code(),
        Code::NotFound
    );
    sim.shutdown().await;
}

fn scheduled(start_ms: i64, end_ms: Option<i64>) -> pb::Bundle {
    let at = |ms: i64| prost_types::Timestamp {
        seconds: ms.div_euclid(1000),
        nanos: (ms.rem_euclid(1000) * 1_000_000) as i32,
    };
    pb::Bundle {
        schedule: Some(pb::BundleSchedule {
            start: Some(at(start_ms)),
            end: end_ms.map(at),
        }),
        ..bundle(false)
    }
}

/// The job of a job event, if it is one.
fn job_of(event: &Event) -> Option<&pb::Job> {
    match event {
        Event::JobUpdated(j) => j.job_with_history.as_ref(),
        Event::JobActive(j) => j.job_with_history.as_ref(),
        Event::JobPending(j) => j.job_with_history.as_ref(),
        _ => None,
    }?
    .job
    .as_ref()
}

fn millis(ts: &prost_types::Timestamp) -> i64 {
    ts.seconds * 1000 + i64::from(ts.nanos) / 1_000_000
}

#[tokio::test]
async fn a_scheduled_bundles_jobs_are_pending_with_its_start_and_turn_active_at_it() {
    let (sim, mut events) = started().await;
    // Five simulated minutes: 300 ms at the tests' time scale.
    let start = sim.snapshot().await.time + 300_000;
    sim.manager.clone().create_bundle(scheduled(start, None)).await.unwrap();
    let (pending, _) = events
        .until(|e| matches!(e, Event::JobPending(_)).then(|| job_of(e).cloned()).flatten())
        .await;
    assert_eq!(pending.state, pb::job::JobState::Pre as i32);
    assert_eq!(pending.start_date_time.as_ref().map(millis), Some(start));
    let (active, _) = events
        .until(|e| matches!(e, Event::JobActive(_)).then(|| job_of(e).cloned()).flatten())
        .await;
    assert!(sim.snapshot().await.time >= start, "active before its start");
    assert_eq!(active.state, pb::job::JobState::Active as i32);
    assert_eq!(active.start_date_time.as_ref().map(millis), Some(start));
    sim.shutdown().await;
}

#[tokio::test]
async fn an_updated_schedule_re_dates_the_jobs() {
    let (sim, mut events) = started().await;
    let now = sim.snapshot().await.time;
    sim.manager
        .clone()
        .create_bundle(scheduled(now + 3_600_000, None))
        .await
        .unwrap();
    let start = now + 300_000;
    sim.manager.clone().update_bundle(scheduled(start, None)).await.unwrap();
    let (redated, _) = events
        .until(|e| {
            let job = job_of(e).filter(|_| kind(e) == "job_updated")?;
            (job.start_date_time.as_ref().map(millis) == Some(start)).then(|| job.clone())
        })
        .await;
    assert_eq!(redated.state, pb::job::JobState::Pre as i32);
    let (active, _) = events
        .until(|e| matches!(e, Event::JobActive(_)).then(|| job_of(e).cloned()).flatten())
        .await;
    assert!(sim.snapshot().await.time >= start, "active before its new start");
    assert_eq!(active.start_date_time.as_ref().map(millis), Some(start));
    sim.shutdown().await;
}

#[tokio::test]
async fn a_completed_job_stays_completed_until_an_update_gives_it_a_new_schedule() {
    let (sim, mut events) = started().await;
    let now = sim.snapshot().await.time;
    let live = scheduled(now - 60_000, Some(now + 3_600_000));
    sim.manager.clone().create_bundle(live.clone()).await.unwrap();
    sim.manager
        .clone()
        .complete_job(norsk_auto_manager::manager::proto::common::JobId {
            job_id: "news/ch1/0/encode".into(),
        })
        .await
        .unwrap();
    let state_of = |e: &Event, wanted: pb::job::JobState| {
        job_of(e)
            .filter(|j| j.job_id.as_ref().is_some_and(|id| id.job_id == "news/ch1/0/encode"))
            .filter(|j| j.state == wanted as i32)
            .cloned()
    };
    events.until(|e| state_of(e, pb::job::JobState::Post)).await;
    // A revision that keeps the schedule: the job's window stays over.
    let mut revised = live.clone();
    revised.jobs[0].parameters.insert("bitrate".into(), "6000".into());
    sim.manager.clone().update_bundle(revised.clone()).await.unwrap();
    let (kept, _) = events
        .until(|e| {
            job_of(e)
                .filter(|j| j.job_id.as_ref().is_some_and(|id| id.job_id == "news/ch1/0/encode"))
                .filter(|j| j.parameters.get("bitrate").is_some_and(|b| b == "6000"))
                .cloned()
        })
        .await;
    assert_eq!(
        kept.state,
        pb::job::JobState::Post as i32,
        "a revision revived a completed job"
    );
    // A later end: the job lives again.
    let mut rescheduled = revised;
    rescheduled.schedule = scheduled(now - 60_000, Some(now + 7_200_000)).schedule;
    sim.manager.clone().update_bundle(rescheduled).await.unwrap();
    events.until(|e| state_of(e, pb::job::JobState::Active)).await;
    sim.shutdown().await;
}
