//! A successor core (a fresh core after a stream break, or a promoted
//! standby) carries on what its predecessor left: the calls on their way,
//! the outcomes it announced, its restart counts, its drains, the nodes it
//! provisioned, and node ids never named twice.

use norsk_auto_manager::automanager::{Command, Rpc, RpcFailureKind};
use norsk_auto_manager::model::{
    InstanceKey, JobHistoryEntry, ManagerEvent, NodeId, NodeStopReason, ProviderKind, Slot, tags,
};

use crate::support::scenario::*;
use crate::support::*;

/// A node id is never given to two machines: a core hydrated after a
/// stream break carries its process's naming on, and a standby promoted in a
/// new process names its nodes apart from the ones the old leader named —
/// even a node Manager has since forgotten.
#[test]
fn a_node_id_is_never_named_twice_across_stream_breaks_and_promotions() {
    use norsk_auto_manager::automanager::{AutoManagerCore, validate_auto_settings};
    // Manager's snapshot after it forgot every node: the bundle and its job.
    let hydrate = |h: &mut Harness, core: AutoManagerCore| -> NodeId {
        h.core = core;
        h.event(ManagerEvent::BundleUpdated(bundle("b", ONE_JOB)));
        for job in jobs_of(&bundle("b", ONE_JOB)) {
            h.event(ManagerEvent::JobActive(job));
        }
        h.event(ManagerEvent::InitialDataComplete);
        let calls = h.take_calls();
        let node = create_node(&calls).expect("a node is provisioned").0;
        // Manager refuses it (and so never holds it).
        for (id, _) in calls.iter().filter(|(_, rpc)| matches!(rpc, Rpc::CreateNode { .. })) {
            h.fail(*id, RpcFailureKind::InsufficientCapacity);
        }
        node
    };
    let valid = || validate_auto_settings(settings()).expect("settings are valid");
    let mut leader = Harness::new();
    let core = AutoManagerCore::new(valid(), leader.now);
    let first = hydrate(&mut leader, core);
    let successor = AutoManagerCore::succeeding(valid(), &leader.core);
    let second = hydrate(&mut leader, successor);
    assert_ne!(first, second, "the same process named a node twice");

    // A standby, started a moment later in a process of its own, is
    // promoted.
    let mut standby = Harness::new();
    standby.now += 1;
    let core = AutoManagerCore::new(valid(), standby.now);
    let third = hydrate(&mut standby, core);
    assert!(
        third != first && third != second,
        "the promoted standby named {third}, a node the old leader named"
    );

    // One started in the same millisecond as the leader: its salt (drawn
    // at random by the runtime) sets it apart; a successor keeps it.
    let mut twin = Harness::new();
    let core = AutoManagerCore::new(valid(), twin.now).salted(7);
    let fourth = hydrate(&mut twin, core);
    assert!(
        fourth != first && fourth != second,
        "a standby started in the leader's millisecond named {fourth}, a node the old leader named"
    );
    let successor = AutoManagerCore::succeeding(valid(), &twin.core);
    let fifth = hydrate(&mut twin, successor);
    assert_ne!(fourth, fifth, "the same salted process named a node twice");
    // `<pool>-<tier>-<process>-<serial>`
    let process = |node: &NodeId| node.as_str().split('-').nth(2).map(str::to_owned);
    assert_eq!(
        process(&fourth),
        process(&fifth),
        "a successor names its nodes as its process did"
    );
    for node in [&first, &second, &third, &fourth, &fifth] {
        assert!(node.as_str().starts_with("production-"), "{node}");
    }
}

#[test]
fn a_start_still_on_its_way_when_the_stream_breaks_keeps_its_job_and_its_room_in_the_successor() {
    // The successor hydrates from a snapshot Manager took before the start
    // landed: the job shows placed nowhere. Its gate stays shut (no second
    // start of it), its node's room stays held (another job goes
    // elsewhere), and the start's late answer binds it where it landed.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3}}\n",
    );
    let job = job_id("b", 0, "encode");
    let (start, node) = h
        .take_calls()
        .into_iter()
        .find_map(|(id, rpc)| match rpc {
            Rpc::StartJob { node_id, .. } => Some((id, node_id)),
            _ => None,
        })
        .expect("the job is dispatched");
    h.reconnect();
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "no second start of a job whose start is on its way"
    );
    h.bundle(
        "c",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 3}}\n",
    );
    let placed = start_jobs(&h.take_calls());
    assert_eq!(placed.len(), 1, "{placed:?}");
    assert_ne!(placed[0].1, node.0, "the room the start holds is not given away");
    h.ok(start);
    assert_eq!(h.bound_node(&job), Some(node));
    assert!(
        !h.take_calls().iter().any(|(_, rpc)| matches!(rpc, Rpc::StopJob { .. })),
        "the start that landed is the job's placement, not an orphan"
    );
}

#[test]
fn a_bundle_broken_before_the_stream_breaks_stays_broken_in_the_successor_while_its_verdict_is_on_its_way() {
    // `bundleBroken` was announced; the snapshot was taken before the
    // verdict's write landed, so it shows the bundle without a verdict.
    // The outcome stands until the bundle is updated or deleted.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: drop}}\n",
    );
    let (job, node) = h.start_all().remove(0);
    h.failed(&job, &node);
    let bundle = norsk_auto_manager::model::BundleId("b".into());
    assert!(h.core.broken_bundles().contains_key(&bundle));
    let write = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::SetTerminalVerdict { .. }))
        .expect("the verdict is written");
    h.reconnect();
    assert!(
        h.core.broken_bundles().contains_key(&bundle),
        "announced broken, the bundle stays broken in the successor"
    );
    h.cluster_node("c", 8.0);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "no job of a broken bundle is placed again"
    );
    h.ok(write.0);
    assert!(h.core.broken_bundles().contains_key(&bundle));
}

#[test]
fn an_instance_a_timed_out_start_made_is_not_the_jobs_in_a_successor_while_its_undoing_stop_is_on_its_way() {
    // The start failed ambiguously and took effect: Manager's history shows
    // the instance, and the stop undoing it is still on its way when the
    // stream breaks. The successor must not bind the job to an instance
    // that is going (the room it takes was given back).
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    let job = job_id("b", 0, "encode");
    let (start, node) = h
        .take_calls()
        .into_iter()
        .find_map(|(id, rpc)| match rpc {
            Rpc::StartJob { node_id, .. } => Some((id, node_id)),
            _ => None,
        })
        .expect("the job is dispatched");
    h.fail(start, RpcFailureKind::Transient);
    let undo = h
        .take_calls()
        .into_iter()
        .find(|(_, rpc)| matches!(rpc, Rpc::StopJob { node_id, .. } if *node_id == node))
        .expect("the instance the start may have made is stopped");
    h.history(
        &job,
        JobHistoryEntry::Provisioned {
            at: Some(h.now),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(node.clone()),
        },
    );
    h.reconnect();
    assert_eq!(h.bound_node(&job), None, "an instance being undone is not the job's");
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "not placed before the stop is answered"
    );
    h.ok(undo.0);
    h.stopped(&job, &node, InstanceKey::slot(Slot::Primary));
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    assert_eq!(start_jobs(&h.take_calls()).len(), 1, "placed again once it is gone");
}

#[test]
fn a_successor_keeps_counting_restarts_against_the_same_ceiling_a_node_loss_included() {
    // A restart after a node loss counts against the ceiling, but Manager's
    // history records it as the node stopping, not as a failure: a count
    // rebuilt from history alone would forget it. The successor carries
    // its predecessor's count on.
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, maxRestartsPerHour: 1}}\n",
    );
    let (job, first) = h.start_all().remove(0);
    h.node_stopping(first.as_str(), NodeStopReason::HealthPingTimeExceeded);
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    let (_, second) = h.start_all().remove(0);
    assert_ne!(second, first);
    h.reconnect();
    h.take_notifications();
    h.failed(&job, &second);
    h.advance(norsk_auto_manager::automanager::recovery::MIN_RECOVERY_INTERVAL_MS);
    assert!(
        kinds(&h.take_notifications()).contains(&"bundleBroken".to_owned()),
        "the second restart in the hour is past the ceiling of one"
    );
    assert!(start_jobs(&h.take_calls()).is_empty());
}

#[test]
fn a_forced_drain_still_terminates_its_node_at_the_timeout_after_the_stream_breaks() {
    // A drain is this AutoManager's own work, not in Manager's snapshot:
    // the successor carries it on with its deadline.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.event(ManagerEvent::InitialDataComplete);
    h.bundle("b", ONE_JOB);
    let started = h.start_all();
    assert_eq!(started.len(), 1);
    let id = h.command(Command::DrainNode {
        node_id: NodeId::from("a"),
        options: norsk_auto_manager::automanager::DrainOptions {
            timeout_ms: Some(60_000),
            force: true,
            after: Some(norsk_auto_manager::automanager::DrainAfter::Terminate),
            ..Default::default()
        },
    });
    assert!(
        h.take_replies()
            .iter()
            .any(|(reply, result)| *reply == id && result.is_ok())
    );
    h.ok_all();
    h.advance(10_000);
    h.reconnect();
    h.ok_all();
    h.advance(51_000);
    let terminated: Vec<NodeId> = h
        .take_calls()
        .into_iter()
        .filter_map(|(_, rpc)| match rpc {
            Rpc::TerminateNode { node_id } => Some(node_id),
            _ => None,
        })
        .collect();
    assert_eq!(terminated, vec![NodeId::from("a")], "the forced drain ends on time");
}

/// A promoted standby, hydrated from Manager's snapshot, in which a spare
/// its predecessor provisioned (tagged for this AutoManager's pool and
/// cloud tier, not for a job) has started and now carries a `singleUse`
/// job.
fn promoted_with_a_single_use_job_on_a_predecessors_spare() -> (Harness, norsk_auto_manager::model::JobId, NodeId) {
    let mut h = Harness::new();
    let node = NodeId::from("production-aws-old-1");
    let node_tags = [(tags::POOL, "production"), (tags::TIER, "aws")];
    h.event(ManagerEvent::NodeStarted(node_info(node.as_str(), &node_tags)));
    h.event(ManagerEvent::NodeInventory {
        node_id: node.clone(),
        inventory: inventory(ProviderKind::Aws, 4.0),
    });
    let b = bundle("b", SINGLE_USE);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    for mut runtime in jobs_of(&b) {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(node.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(node.clone()));
    (h, job, node)
}

#[test]
fn a_promoted_core_releases_a_single_use_jobs_node_its_predecessor_provisioned() {
    // "singleUse: the node is terminated when the job finishes" holds for a
    // node the old leader provisioned: its pool and cloud-tier tags name it
    // this AutoManager's, whichever process asked for it.
    let (mut h, job, node) = promoted_with_a_single_use_job_on_a_predecessors_spare();
    assert!(h.take_calls().is_empty(), "the running job is left alone");
    job_ends(&mut h, &job);
    assert!(
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node)),
        "the single-use job's node is released"
    );
}

#[test]
fn a_promoted_core_terminates_a_predecessors_launching_node_at_its_provision_deadline_from_its_creation() {
    // The old leader asked for the node; its provision deadline went with
    // its process. The new leader holds it to `provisionTimeoutMs` counted
    // from when Manager created it, not from the promotion.
    let mut h = Harness::new();
    let timeout = 600_000;
    let node = NodeId::from("production-aws-old-2");
    let mut info = node_info(node.as_str(), &[(tags::POOL, "production"), (tags::TIER, "aws")]);
    let created = h.now - timeout + 60_000;
    info.created_at = Some(created);
    h.event(ManagerEvent::NodeStarting(info));
    h.event(ManagerEvent::InitialDataComplete);
    let terminated = |h: &mut Harness| {
        h.take_calls()
            .iter()
            .any(|(_, r)| matches!(r, Rpc::TerminateNode { node_id } if *node_id == node))
    };
    assert!(!terminated(&mut h), "terminated before its deadline");
    assert_eq!(
        h.next_deadline,
        Some(created + timeout),
        "the core wakes at the deadline"
    );
    h.advance(60_000);
    assert!(terminated(&mut h), "a node that never started is not left launching");
}
