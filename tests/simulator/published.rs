//! `--published-api-only` as a client built from the published proto sees
//! it: the additions it sets on requests are ignored (a deferred start runs
//! at once), no stream event, search result or answer carries an added field
//! or event, a worker's rejection shows as the job failing, and a spot
//! interruption only shows as the provider taking the node. The default
//! (full) mode sends the same additions, so the switch is real.

use norsk_auto_manager::manager::proto::common;
use norsk_auto_manager::manager::proto::manager::{
    self as pb, event_stream_event::Event, job_history_entry::HistoryEntry, job_history_job_stopping::Reason,
    node_stopping, norsk_status_event,
};
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::tags;
use norsk_auto_manager::sim::SimConfig;

use crate::sim_support::{Events, Sim, TIME_SCALE, aws_node, job_update, kind, node_of, start_request};

async fn sim(published_api_only: bool) -> Sim {
    Sim::start_with(SimConfig {
        seed: 7,
        time_scale: TIME_SCALE,
        published_api_only,
        ..SimConfig::default()
    })
    .await
}

/// A plain job that also sets every added `Job` field a client could set.
fn job_with_additions(job_id: &str) -> pb::Job {
    pb::Job {
        job_id: Some(common::JobId { job_id: job_id.into() }),
        description: "encode".into(),
        state: pb::job::JobState::Active as i32,
        bundle_ref: Some(pb::BundleJobRef {
            bundle_id: "ns/b1".into(),
            replica_index: 0,
            job_name: "encode".into(),
        }),
        requirements: Some(pb::JobRequirements {
            required_capacity: 2.0,
            ..Default::default()
        }),
        template: "encoder".into(),
        dormant: true,
        terminal_verdict: Some(pb::TerminalVerdict::default()),
        intra_replica: Some(pb::IntraReplicaRules::default()),
        parameters: [("bitrate".to_owned(), "6M".to_owned())].into(),
        ..Default::default()
    }
}

/// The added `Job` fields that are set. Every field is named, so a field
/// added to `Job` does not compile here until it is classified.
fn job_additions(job: &pb::Job) -> Vec<&'static str> {
    let pb::Job {
        job_id: _,
        description: _,
        tags: _,
        start_date_time: _,
        current_hash: _,
        manager_configuration: _,
        services: _,
        norsk_media_version: _,
        norsk_service_parameters: _,
        volumes: _,
        state: _,
        shape: _,
        architecture: _,
        subnet: _,
        availability_domain: _,
        bundle_ref,
        requirements,
        template,
        dormant,
        terminal_verdict,
        intra_replica,
        parameters,
    } = job;
    [
        ("bundle_ref", bundle_ref.is_some()),
        ("requirements", requirements.is_some()),
        ("template", !template.is_empty()),
        ("dormant", *dormant),
        ("terminal_verdict", terminal_verdict.is_some()),
        ("intra_replica", intra_replica.is_some()),
        ("parameters", !parameters.is_empty()),
    ]
    .into_iter()
    .filter_map(|(name, set)| set.then_some(name))
    .collect()
}

/// What in `event` a published client does not know: an added event, or an
/// added field of a job it carries (in its history too).
fn additions_in(event: &Event) -> Vec<String> {
    let with_history = match event {
        Event::JobActive(e) => e.job_with_history.as_ref(),
        Event::JobPending(e) => e.job_with_history.as_ref(),
        Event::JobUpdated(e) => e.job_with_history.as_ref(),
        Event::JobOutOfWindow(e) => e.job_with_history.as_ref(),
        Event::NodeRunning(_)
        | Event::InitialDataComplete(_)
        | Event::JobDeleted(_)
        | Event::NodeStarting(_)
        | Event::NodeStarted(_)
        | Event::NodeStopping(_)
        | Event::NodeStopped(_)
        | Event::PhysicalNodeConnected(_)
        | Event::ProviderHealthChange(_)
        | Event::JobInfo(_) => None,
        Event::BundleUpdated(_)
        | Event::BundleDeleted(_)
        | Event::NodeInventory(_)
        | Event::JobRejected(_)
        | Event::JobPrepared(_)
        | Event::MigrationSignal(_)
        | Event::NodeInterruptionNotice(_)
        | Event::ImagesPrefetched(_)
        | Event::AuditAppended(_)
        | Event::NodeTagsUpdated(_) => return vec![format!("added event {}", kind(event))],
    };
    let Some(with_history) = with_history else {
        return vec![];
    };
    let previous = with_history
        .history_entry
        .iter()
        .filter_map(|e| match &e.history_entry {
            Some(HistoryEntry::JobUpdated(u)) => u.previous_job.as_ref(),
            _ => None,
        });
    with_history
        .job
        .iter()
        .chain(previous)
        .flat_map(job_additions)
        .map(|field| format!("Job.{field} in {}", kind(event)))
        .collect()
}

#[track_caller]
fn assert_published(events: &[Event], what: &str) {
    let additions: Vec<String> = events.iter().flat_map(additions_in).collect();
    assert!(additions.is_empty(), "additions in {what}: {additions:?}");
}

/// Reads until `job_id`'s history gains an entry `want` answers; returns
/// that answer and every event read.
async fn until_history<T>(
    events: &mut Events,
    job_id: &str,
    want: impl Fn(&HistoryEntry) -> Option<T>,
) -> (T, Vec<Event>) {
    events
        .until(|e| {
            job_update(e)
                .filter(|(id, _)| *id == job_id)
                .and_then(|(_, entry)| entry)
                .and_then(&want)
        })
        .await
}

async fn search(sim: &Sim, job_id: &str) -> Vec<pb::CurrentJob> {
    let request = pb::JobSearchRequest {
        job_filter: vec![pb::JobFilter {
            job_filter: Some(pb::job_filter::JobFilter::IdFilter(pb::IdFilter {
                comparison: Some(pb::id_filter::Comparison::Eq(job_id.into())),
            })),
        }],
    };
    let mut found = sim.manager.clone().job_search(request).await.unwrap().into_inner();
    let mut jobs = Vec::new();
    while let Some(job) = found.message().await.unwrap() {
        jobs.push(job);
    }
    jobs
}

/// A start that sets every added `StartJobRequest` field: a deferred start
/// on a GPU the node does not have.
fn start_with_additions(job_id: &str, node_id: &str, gpu_index: Option<u32>) -> pb::StartJobRequest {
    pb::StartJobRequest {
        gpu_index,
        defer_start: true,
        runtime_role: "backup".into(),
        migration_id: "m1".into(),
        ..start_request(job_id, "primary", node_id)
    }
}

#[tokio::test]
async fn published_mode_ignores_added_request_fields_and_sends_no_addition() {
    let sim = sim(true).await;
    let mut events = sim.events().await;
    let first_snapshot = events.snapshot().await;
    sim.register("rack-1", 8.0).await;
    let hash = sim
        .manager
        .clone()
        .create_job(job_with_additions("j1"))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hash.hash, 1);
    // The node has no GPU: a Manager that read gpu_index would refuse this,
    // and one that read defer_start would leave the job prepared.
    sim.manager
        .clone()
        .start_job(start_with_additions("j1", "rack-1", Some(3)))
        .await
        .expect("the added fields are ignored");
    let (role, live) = until_history(&mut events, "j1", |h| match h {
        HistoryEntry::JobRunning(r) => Some(r.role.clone()),
        _ => None,
    })
    .await;
    assert_eq!(role, "primary", "the deferred start ran at once");
    assert_published(&first_snapshot, "the first snapshot");
    assert_published(&live, "the live events");
    let kinds: Vec<_> = live.iter().map(kind).collect();
    assert!(kinds.contains(&"node_started"), "{kinds:?}");

    let found = search(&sim, "j1").await;
    assert_eq!(found.len(), 1);
    let job = found[0].job.as_ref().expect("the job");
    assert_eq!(job_additions(job), Vec::<&str>::new(), "JobSearch result");
    assert_eq!(job.description, "encode", "published fields are kept");
    let instances: Vec<_> = found[0]
        .instances
        .iter()
        .map(|i| {
            (
                i.job_key.as_ref().unwrap().role.as_str(),
                i.node_id.as_ref().unwrap().node_id.as_str(),
            )
        })
        .collect();
    assert_eq!(instances, [("primary", "rack-1")]);

    let mut fresh = sim.events().await;
    let snapshot = fresh.snapshot().await;
    assert_published(&snapshot, "a later snapshot");
    let kinds: Vec<_> = snapshot.iter().map(kind).collect();
    assert_eq!(kinds, ["node_started", "job_active", "initial_data_complete"]);

    let mut status = sim
        .manager
        .clone()
        .create_status_channel(())
        .await
        .unwrap()
        .into_inner();
    let Some(norsk_status_event::Message::Hello(hello)) = status.message().await.unwrap().unwrap().message else {
        panic!("the status channel starts with Hello");
    };
    let version = hello.version.unwrap();
    assert_eq!(
        (version.major_version, version.minor_version, version.build_number),
        (1, 0, 384)
    );
    sim.shutdown().await;
}

#[tokio::test]
async fn full_mode_reads_and_sends_the_additions_published_mode_removes() {
    let sim = sim(false).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.register("rack-1", 8.0).await;
    sim.manager.clone().create_job(job_with_additions("j1")).await.unwrap();
    sim.manager
        .clone()
        .start_job(start_with_additions("j1", "rack-1", None))
        .await
        .unwrap();
    let (_, live) = events.until(|e| matches!(e, Event::JobPrepared(_)).then_some(())).await;
    let additions: Vec<String> = live.iter().flat_map(additions_in).collect();
    for expected in [
        "added event node_inventory",
        "added event job_prepared",
        "Job.template in job_active",
        "Job.dormant in job_active",
    ] {
        assert!(
            additions.iter().any(|a| a == expected),
            "{expected} not in {additions:?}"
        );
    }
    let found = search(&sim, "j1").await;
    assert_eq!(
        job_additions(found[0].job.as_ref().unwrap()),
        [
            "bundle_ref",
            "requirements",
            "template",
            "dormant",
            "terminal_verdict",
            "intra_replica",
            "parameters"
        ]
    );
    let on_a_missing_gpu = pb::StartJobRequest {
        role: "backup".into(),
        ..start_with_additions("j1", "rack-1", Some(3))
    };
    let refused = sim.manager.clone().start_job(on_a_missing_gpu).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "gpu_index is read");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_rejected_start_shows_as_the_job_failing_then_stopped_in_published_mode() {
    let sim = sim(true).await;
    sim.register("rack-1", 8.0).await;
    sim.create_job("j1").await;
    let mut events = sim.events().await;
    events.snapshot().await;
    let reject = sim_admin::RejectJobRequest {
        job_id: "j1".into(),
        code: pb::JobRejectionCode::JobRejectedInsufficientCapacity as i32,
        detail: "not enough capacity".into(),
        times: 1,
    };
    sim.admin.clone().reject_job(reject).await.unwrap();
    sim.start_job("j1", "primary", "rack-1").await.unwrap();
    let (_, live) = until_history(&mut events, "j1", |h| {
        matches!(h, HistoryEntry::JobStopped(_)).then_some(())
    })
    .await;
    assert_published(&live, "the live events");
    let entries: Vec<String> = live
        .iter()
        .filter_map(job_update)
        .filter_map(|(_, entry)| match entry? {
            HistoryEntry::JobProvisioned(p) => Some(format!("provisioned {}", p.role)),
            HistoryEntry::JobRunning(r) => Some(format!("running {}", r.role)),
            HistoryEntry::JobStopping(s) => Some(format!("stopping {} {:?}", s.role, s.reason())),
            HistoryEntry::JobStopped(s) => Some(format!("stopped {}", s.role)),
            _ => None,
        })
        .collect();
    assert_eq!(
        entries,
        [
            "provisioned primary".to_owned(),
            format!("stopping primary {:?}", Reason::JobStoppedJobFailed),
            "stopped primary".to_owned(),
        ]
    );
    assert!(search(&sim, "j1").await[0].instances.is_empty(), "no instance is left");
    sim.shutdown().await;
}

#[tokio::test]
async fn a_spot_interruption_sends_no_notice_and_the_provider_takes_the_node_at_the_deadline() {
    let sim = sim(true).await;
    let mut events = sim.events().await;
    events.snapshot().await;
    sim.manager
        .clone()
        .create_aws_node(pb::CreateAwsNodeRequest {
            launch_mode: "spot".into(),
            ..aws_node("n1", "eu-west-1", "m5.xlarge")
        })
        .await
        .unwrap();
    events
        .until(|e| (matches!(e, Event::NodeStarted(_)) && node_of(e) == Some("n1")).then_some(()))
        .await;
    let interrupt = sim_admin::InterruptNodeRequest {
        node_id: "n1".into(),
        kind: pb::InterruptionKind::SpotInterruption as i32,
        deadline_s: 600.0,
    };
    sim.admin.clone().interrupt_node(interrupt).await.unwrap();
    // Before the deadline a fresh client sees the node as it was: no notice,
    // no interruption tag.
    let snapshot = sim.events().await.snapshot().await;
    assert_published(&snapshot, "the snapshot");
    let tags: Vec<_> = snapshot
        .iter()
        .filter_map(|e| match e {
            Event::NodeStarted(n) => n.node_metadata.as_ref(),
            _ => None,
        })
        .flat_map(|m| m.tags.keys().cloned())
        .collect();
    assert!(!tags.iter().any(|t| t == tags::INTERRUPTION), "{tags:?}");
    let (_, live) = events.until(|e| matches!(e, Event::NodeStopped(_)).then_some(())).await;
    assert_published(&live, "the live events");
    let seen: Vec<String> = live
        .iter()
        .map(|e| match e {
            Event::NodeStopping(s) => format!("node_stopping {:?}", s.reason()),
            other => kind(other).to_owned(),
        })
        .collect();
    assert_eq!(
        seen,
        [
            format!("node_stopping {:?}", node_stopping::Reason::ProviderTerminate),
            "node_stopped".to_owned()
        ]
    );
    sim.shutdown().await;
}
