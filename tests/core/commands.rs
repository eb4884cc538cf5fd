//! Commands and what the core reports: an invalid bundle is refused
//! without calling Manager, a deleted bundle is not placed again, nothing is
//! hydrated or accepted after `close`, notification kinds are the callback
//! names, and pool gauges are computed on read.

use norsk_auto_manager::automanager::{Command, CommandError, Input, Notification, Rpc};
use norsk_auto_manager::model::{ManagerEvent, NodeId};

use crate::support::scenario::*;
use crate::support::*;

#[test]
fn invalid_bundle_is_refused_without_calling_manager() {
    let mut h = Harness::hydrated();
    let bad = bundle("b", "pool: nowhere\njobs:\n  - {jobName: encode}\n");
    let id = h.command(Command::CreateBundle(bad));
    assert!(h.take_calls().is_empty());
    let replies = h.take_replies();
    assert_eq!(replies[0].0, id);
    assert!(matches!(replies[0].1, Err(CommandError::InvalidBundle { .. })));
}

#[test]
fn snapshot_after_close_is_not_hydrated() {
    let mut h = Harness::new();
    h.cluster_node("a", 4.0);
    h.bundle("b", ONE_JOB);
    h.input(Input::Close);
    h.event(ManagerEvent::InitialDataComplete);
    assert!(!h.core.is_hydrated());
    assert!(h.take_calls().is_empty());
    assert_eq!(h.next_deadline, None, "a timer survived close");
    h.command(Command::DeleteBundle("b".into()));
    assert!(matches!(h.take_replies()[0].1, Err(CommandError::Closed)));
}

#[test]
fn notification_kinds_are_callback_names_without_on() {
    let node_id = NodeId::from("a");
    let cases = [
        (
            Notification::NodeUnhealthy {
                node_id: node_id.clone(),
            },
            "nodeUnhealthy",
        ),
        (
            Notification::NodeTerminated {
                node_id: node_id.clone(),
            },
            "nodeTerminated",
        ),
        (
            Notification::BundleBroken {
                bundle_id: "b".into(),
                reason: "r".into(),
            },
            "bundleBroken",
        ),
        (
            Notification::PlacementFailed {
                job_id: job_id("b", 0, "j"),
                reason: "r".into(),
            },
            "placementFailed",
        ),
    ];
    for (notification, name) in cases {
        assert_eq!(kinds(&[notification]), vec![name.to_owned()]);
    }
}

#[test]
fn pool_gauges_are_computed_on_read() {
    let mut h = Harness::hydrated();
    h.bundle("b", ONE_JOB);
    h.start_all();
    let pool = &h.core.metrics(h.now).pools[0];
    assert_eq!(pool.pool_name, "production");
    assert_eq!(pool.node_count, 2);
    assert!((pool.used_capacity_fraction - 0.25).abs() < 1e-9);
}

#[test]
fn a_bundle_whose_delete_manager_took_is_not_placed_again_before_its_jobs_are_deleted() {
    let mut h = Harness::hydrated();
    h.bundle(
        "b",
        "pool: production\njobs:\n  - {jobName: encode, requirements: {requiredCapacity: 2, onRuntimeFailure: drop}}\n",
    );
    let job = job_id("b", 0, "encode");
    let (_, node) = h.start_all().remove(0);
    h.failed(&job, &node);
    assert!(
        h.take_notifications()
            .iter()
            .any(|n| matches!(n, Notification::JobDropped { .. }))
    );
    h.take_calls();
    let command = h.command(Command::DeleteBundle("b".into()));
    let (id, rpc) = h.take_calls().remove(0);
    assert!(matches!(rpc, Rpc::DeleteBundle(_)));
    h.ok(id);
    assert_eq!(h.take_replies(), vec![(command, Ok(()))]);
    h.advance(60_000);
    assert!(
        start_jobs(&h.take_calls()).is_empty(),
        "a job of a bundle being deleted is not placed again, dropped mark cleared or not"
    );
}
