//! Rules found broken in Manager's snapshot are repaired when a core takes
//! over: a stray instance is stopped, and of jobs kept apart, an
//! over-committed node or a double-booked GPU the newest instance is stopped
//! and placed again; a co-located group split across nodes is put back
//! together.

use norsk_auto_manager::automanager::{Notification, RequestId, Rpc};
use norsk_auto_manager::model::{InstanceKey, JobHistoryEntry, ManagerEvent, NodeId, ProviderKind, Slot, tags};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn a_promoted_core_stops_a_predecessors_stray_instance_at_hydration() {
    // The old leader moved the job (or prepared a migration target) and
    // its last start landed after it was gone: Manager holds a second
    // instance that is neither the job's placement nor any migration's.
    // Left alone, the job would run on two nodes.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle("b", ONE_JOB);
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    let primary = InstanceKey::slot(Slot::Primary);
    let stray = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let mut runtime = jobs_of(&b).remove(0);
    runtime.history.push(JobHistoryEntry::Running {
        at: Some(h.now),
        role: primary.clone(),
        node_id: Some(NodeId::from("a")),
    });
    runtime.history.push(JobHistoryEntry::Provisioned {
        at: Some(h.now),
        role: stray.clone(),
        node_id: Some(NodeId::from("b")),
    });
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&job), Some(NodeId::from("a")), "the placement stands");
    let calls = h.take_calls();
    assert!(
        calls.iter().any(|(_, r)| matches!(
            r,
            Rpc::StopJob { job_id, instance_key, node_id, .. }
                if *job_id == job && *instance_key == stray && node_id.as_str() == "b"
        )),
        "the stray instance is stopped: {calls:?}"
    );
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { instance_key, .. } if *instance_key == primary)),
        "the job's own instance keeps running"
    );
}

#[test]
fn a_strays_stop_on_its_way_keeps_it_from_carrying_the_job_after_a_stream_break() {
    // The promoted core is stopping a predecessor's stray instance on `b`
    // when the job's own instance on `a` fails and the job is dropped.
    // The stream then breaks before Manager carried out the stop: the
    // successor reads a history in which the stray still runs after the
    // job's instance stopped, the way a migration target that took over
    // reads. It is no such target — a stop is on its way to it — so the
    // dropped job stays unbound and the node it is going from is nobody's.
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.cluster_node("b", 4.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, essential: false, onRuntimeFailure: drop}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let job = job_id("b", 0, "encode");
    let primary = InstanceKey::slot(Slot::Primary);
    let stray = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let mut runtime = jobs_of(&b).remove(0);
    for (key, node) in [(&primary, "a"), (&stray, "b")] {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now),
            role: key.clone(),
            node_id: Some(NodeId::from(node)),
        });
    }
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    let stops = h.take_calls();
    assert!(
        stops
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { instance_key, .. } if *instance_key == stray)),
        "the stray's stop is on its way: {stops:?}"
    );
    h.advance(1_000);
    h.failed(&job, &NodeId::from("a"));
    assert_eq!(h.bound_node(&job), None, "the job is dropped");
    h.reconnect();
    assert_eq!(
        h.bound_node(&job),
        None,
        "the stray a stop is on its way to does not take the job over"
    );
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a dropped job is not started again"
    );
}

#[test]
fn jobs_kept_apart_found_on_one_node_at_hydration_are_parted_the_newest_placed_again() {
    // The old leader migrated `j0` off `a` (`stopThenStart`): its stop of
    // the source was never confirmed when the phase deadlines moved the job
    // onto its target, and it placed `j1` — kept apart from `j0` — on `a`,
    // then died. Manager gave the stop up and the target's late start is a
    // stray: the new leader finds `j0` and `j1` running side by side on
    // `a`, against a hard rule. The newest is stopped and placed again,
    // nothing counted as a failure; `j0` keeps running.
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    h.cluster_node("b", 8.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: j0, requirements: {requiredCapacity: 2}}\n  - {jobName: j1, separateFrom: [j0], requirements: {requiredCapacity: 2}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let a = NodeId::from("a");
    for (mut runtime, at) in jobs_of(&b).into_iter().zip([h.now - 60_000, h.now]) {
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(a.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (j0, j1) = (job_id("b", 0, "j0"), job_id("b", 0, "j1"));
    assert_eq!(h.bound_node(&j0), Some(a.clone()), "the oldest stays");
    let calls = h.take_calls();
    let stop = calls
        .iter()
        .find(|(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == j1 && *node_id == a));
    let Some((stop, _)) = stop else {
        panic!("the newest is stopped on the node it shares with the job it is kept apart from: {calls:?}");
    };
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { job_id, .. } if *job_id == j0)),
        "the oldest keeps running"
    );
    let notes = h.take_notifications();
    assert!(
        notes
            .iter()
            .any(|n| matches!(n, Notification::Error { message } if message.contains("kept apart"))),
        "the operator is told why: {notes:?}"
    );
    h.ok(*stop);
    h.stopped(&j1, &a, InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(j1.0.clone(), "b".to_owned())],
        "placed again apart from j0"
    );
    assert!(
        h.core.job(&j1).is_some_and(|r| r.restarts.count(h.now) == 0),
        "not counted against the restart ceiling"
    );
}

#[test]
fn a_node_running_more_than_it_holds_at_hydration_keeps_its_oldest_instance_and_places_the_newest_again() {
    // The old leader stopped `old` on `a` and placed `new` in its room; the
    // stop never landed. Both run on a node that holds one: the newest is
    // stopped and placed again, and nothing is counted as a failure.
    let mut h = Harness::new();
    h.cluster_node("a", 2.0);
    h.cluster_node("b", 2.0);
    let old = bundle("old", ONE_JOB);
    let new = bundle("new", ONE_JOB);
    for (b, at) in [(&old, h.now - 60_000), (&new, h.now)] {
        h.event(ManagerEvent::BundleUpdated(b.clone()));
        let mut runtime = jobs_of(b).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from("a")),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (old_job, new_job) = (job_id("old", 0, "encode"), job_id("new", 0, "encode"));
    assert_eq!(h.bound_node(&old_job), Some(NodeId::from("a")), "the oldest stays");
    let calls = h.take_calls();
    let stop = calls.iter().find(
        |(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == new_job && node_id.as_str() == "a"),
    );
    let Some((stop, _)) = stop else {
        panic!("the newest instance is stopped: {calls:?}");
    };
    assert!(
        !calls
            .iter()
            .any(|(_, r)| matches!(r, Rpc::StopJob { job_id, .. } if *job_id == old_job)),
        "the oldest keeps running"
    );
    h.ok(*stop);
    h.stopped(&new_job, &NodeId::from("a"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(new_job.0.clone(), "b".to_owned())],
        "placed again where there is room"
    );
    assert!(
        h.core.job(&new_job).is_some_and(|r| r.restarts.count(h.now) == 0),
        "not counted against the restart ceiling"
    );
}

#[test]
fn a_start_awaited_when_the_stream_breaks_binds_its_job_in_the_successor_while_an_earlier_stop_of_the_job_is_on_its_way()
 {
    // A new leader found two instances of `new` it must stop: a migration
    // target a predecessor's late call made on `b`, and its instance on
    // `a`, a node running more than it holds. The stop on `a` landed and
    // `new` was started on `b`; the stream broke with that start and the
    // stop of the stray target still on their way. The start is what the
    // successor awaits for the job: when it lands the job runs on `b`, once,
    // as the core says.
    let primary = InstanceKey::slot(Slot::Primary);
    let target = InstanceKey(format!("{}@0ld7a29e", primary.as_str()));
    let (a, b) = (NodeId::from("a"), NodeId::from("b"));
    let mut h = Harness::new();
    h.cluster_node("a", 2.0);
    h.cluster_node("b", 2.0);
    let old = bundle("old", ONE_JOB);
    let new = bundle("new", ONE_JOB);
    for (bundle, at) in [(&old, h.now - 60_000), (&new, h.now)] {
        h.event(ManagerEvent::BundleUpdated(bundle.clone()));
        let mut runtime = jobs_of(bundle).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: primary.clone(),
            node_id: Some(a.clone()),
        });
        h.event(ManagerEvent::JobActive(runtime));
    }
    let new_job = job_id("new", 0, "encode");
    let mut runtime = h.core.job(&new_job).expect("job known").job.clone();
    runtime.history.push(JobHistoryEntry::Provisioned {
        at: Some(h.now),
        role: target.clone(),
        node_id: Some(b.clone()),
    });
    h.event(ManagerEvent::JobActive(runtime));
    h.event(ManagerEvent::InitialDataComplete);
    let stop_on = |calls: &[(RequestId, Rpc)], key: &InstanceKey, node: &NodeId| {
        calls.iter().find_map(|(id, rpc)| match rpc {
            Rpc::StopJob {
                job_id,
                instance_key,
                node_id,
            } if *job_id == new_job && instance_key == key && node_id == node => Some(*id),
            _ => None,
        })
    };
    let calls = h.take_calls();
    let stray_stop = stop_on(&calls, &target, &b).expect("the stray target is stopped");
    let shed = stop_on(&calls, &primary, &a).expect("the newest instance on the over-committed node is stopped");
    h.ok(shed);
    h.stopped(&new_job, &a, primary.clone());
    let calls = h.take_calls();
    let start = calls
        .iter()
        .find_map(|(id, rpc)| {
            matches!(rpc, Rpc::StartJob { job_id, node_id, .. } if *job_id == new_job && *node_id == b).then_some(*id)
        })
        .unwrap_or_else(|| panic!("placed again where there is room: {calls:?}"));
    h.reconnect();
    h.ok(start);
    h.history(
        &new_job,
        JobHistoryEntry::Running {
            at: Some(h.now),
            role: primary.clone(),
            node_id: Some(b.clone()),
        },
    );
    assert_eq!(
        h.bound_node(&new_job),
        Some(b.clone()),
        "the start that landed is the job's placement"
    );
    h.ok(stray_stop);
    h.stopped(&new_job, &b, target);
    let calls = h.take_calls();
    assert!(
        !calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StartJob { job_id, .. } if *job_id == new_job)),
        "the job runs once, not started again: {calls:?}"
    );
    assert!(
        stop_on(&calls, &primary, &b).is_none(),
        "its instance is not stopped as an orphan: {calls:?}"
    );
    assert_eq!(h.bound_node(&new_job), Some(b));
}

#[test]
fn a_co_located_group_split_across_nodes_at_hydration_is_placed_back_together() {
    // "Co-located jobs share a node." The old leader moved `package` off
    // `a` and its stop of the new instance on `b` never landed; nothing is
    // migrating. The group stays where its oldest instance runs, and
    // `package` is stopped on `b` to be placed with it.
    let mut h = Harness::new();
    h.cluster_node("a", 8.0);
    h.cluster_node("b", 8.0);
    let b = bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1}}\n  - {jobName: package, coLocateWith: [encode], requirements: {requiredCapacity: 1}}\n",
    );
    h.event(ManagerEvent::BundleUpdated(b.clone()));
    let encode = job_id("b", 0, "encode");
    let package = job_id("b", 0, "package");
    let mut jobs = jobs_of(&b);
    for (job, (node, at)) in jobs.iter_mut().zip([("a", h.now - 60_000), ("b", h.now)]) {
        job.history.push(JobHistoryEntry::Running {
            at: Some(at),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from(node)),
        });
    }
    for job in jobs {
        h.event(ManagerEvent::JobActive(job));
    }
    h.event(ManagerEvent::InitialDataComplete);
    assert_eq!(h.bound_node(&encode), Some(NodeId::from("a")));
    let calls = h.take_calls();
    let Some((stop, _)) = calls.iter().find(
        |(_, r)| matches!(r, Rpc::StopJob { job_id, node_id, .. } if *job_id == package && node_id.as_str() == "b"),
    ) else {
        panic!("the member apart from its group is stopped: {calls:?}");
    };
    h.ok(*stop);
    h.stopped(&package, &NodeId::from("b"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(package.0.clone(), "a".to_owned())],
        "placed with its group"
    );
}

/// A cluster node of pool `production` with 8 vCPUs and one GPU device.
fn gpu_node(h: &mut Harness, id: &str) {
    h.event(ManagerEvent::NodeStarted(node_info(id, &[(tags::POOL, "production")])));
    let mut inventory = inventory(ProviderKind::LocalServers, 8.0);
    inventory.gpus = vec![norsk_auto_manager::model::Gpu {
        model: "t4".into(),
        total_capacity: 1.0,
    }];
    h.event(ManagerEvent::NodeInventory {
        node_id: NodeId::from(id),
        inventory,
    });
}

#[test]
fn a_successor_stops_the_newest_instance_a_gpu_cannot_hold_and_places_it_again() {
    // A leader undid a start whose answer was lost (its stop never landed)
    // and gave the GPU to another job; its successor finds both on the
    // node's one device. No device is ever double-booked: the newest
    // instance is stopped, and its job placed again where a GPU is free.
    let mut h = Harness::new();
    gpu_node(&mut h, "a");
    gpu_node(&mut h, "b");
    let spec = "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 1, requiredGpuCapacity: 0.6}}\n";
    let mut runtimes = Vec::new();
    for (i, name) in ["older", "newer"].into_iter().enumerate() {
        let b = bundle(name, spec);
        h.event(ManagerEvent::BundleUpdated(b.clone()));
        let mut runtime = jobs_of(&b).remove(0);
        runtime.history.push(JobHistoryEntry::Running {
            at: Some(h.now + i as i64),
            role: InstanceKey::slot(Slot::Primary),
            node_id: Some(NodeId::from("a")),
        });
        runtimes.push(runtime);
    }
    for runtime in runtimes {
        h.event(ManagerEvent::JobActive(runtime));
    }
    h.event(ManagerEvent::InitialDataComplete);
    let (older, newer) = (job_id("older", 0, "encode"), job_id("newer", 0, "encode"));
    let calls = h.take_calls();
    assert!(
        calls
            .iter()
            .any(|(_, rpc)| matches!(rpc, Rpc::StopJob { job_id, node_id, .. }
            if *job_id == newer && node_id.as_str() == "a")),
        "the newer instance is stopped: {calls:?}"
    );
    assert_eq!(h.bound_node(&older), Some(NodeId::from("a")), "the older one stays");
    for (id, _) in &calls {
        h.ok(*id);
    }
    h.stopped(&newer, &NodeId::from("a"), InstanceKey::slot(Slot::Primary));
    assert_eq!(
        start_jobs(&h.take_calls()),
        vec![(newer.0.clone(), "b".to_owned())],
        "placed again where a GPU is free"
    );
}
