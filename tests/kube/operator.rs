//! The operator against the real control plane (etcd + kube-apiserver, see
//! `support/control_plane.rs`) with the Manager simulator in-process: what
//! `kubectl apply` of the examples leads to, recovery after a node loss, the
//! delete finalizer, `Stalled` policies, status writes only on change, a
//! manual job started and stopped from its Bundle, and one leader among two
//! operator processes.
//!
//! Every test takes a namespace and a simulator of its own, and runs its
//! own operator over that namespace's bundles (pools and hot-spare
//! policies are cluster-wide and shared; every operator agrees on them).

use std::pin::pin;
use std::time::Duration;

use futures::TryStreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::events::v1::Event;
use kube::api::{Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use norsk_auto_manager::automanager::AutoSettings;
use norsk_auto_manager::controller::leader::{LeaseSettings, elect};
use norsk_auto_manager::crd::{self, Bundle, HotSparePolicy, NorskNode};
use norsk_auto_manager::decide::node_status::node_resource_name;
use norsk_auto_manager::manager::proto::sim_admin;
use norsk_auto_manager::model::{DrainJobStatus, JobPhase, JobState, MigrationPhase, NodePhase, SchedulePhase};
use norsk_auto_manager::telemetry::ResultLabels;

use crate::control_plane;
use crate::operator_support::{
    Operator, WAIT, cluster_pool, condition, event_where, example, installed, instances_of, is_ready, manual_bundle,
    primary_job, simulator, simulator_in, small_bundle, until,
};

#[tokio::test]
async fn applied_examples_become_ready_with_their_nodes_in_status() {
    let cp = installed().await;
    let ns = cp.namespace("examples").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "examples-0").await;
    for file in ["bundle-channel.yaml", "bundle-gpu.yaml"] {
        cp.kubectl_apply(&ns, &example(file)).expect("example applies");
    }
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    for name in ["ch1", "ch2", "gpu-transcode"] {
        let ready = until(&bundles, name, "Ready", |b: Option<&Bundle>| is_ready(b)).await;
        let status = ready.status.expect("status");
        assert!(status.primary_node.is_some(), "{name}: {status:#?}");
        assert!(
            status.replicas[0]
                .jobs
                .iter()
                .all(|j| j.state == JobPhase::Running && j.node.is_some())
        );
        assert_eq!(status.observed_generation, ready.metadata.generation);
    }
    // ch1 has a resilience policy: its backup runs in OCI, not on a cluster node.
    let ch1 = bundles.get("ch1").await.unwrap().status.unwrap();
    let backup = ch1.backup_node.expect("ch1 has a backup node");
    assert!(
        !backup.starts_with("node-"),
        "backup {backup} must leave the primary's cloud"
    );
    // Reconciling again finds Manager's copy equal to the resource: no
    // update is sent (every bundle is still at generation 1 on Manager).
    let reconciles = operator.metrics.reconciles_of("bundle");
    let patch = serde_json::json!({"metadata": {"annotations": {"example.com/touch": "1"}}});
    bundles
        .patch("ch1", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("annotate");
    tokio::time::timeout(WAIT, async {
        while operator.metrics.reconciles_of("bundle") <= reconciles {
            // The reconcile runs on the operator's task; poll its counter.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the touch is reconciled");
    for stored in sim.snapshot().await.bundles {
        assert_eq!(stored.generation, 1, "{} was updated for nothing", stored.bundle_id);
    }
    // `kubectl get norsk` lists pools and bundles together.
    let out = cp
        .kubectl()
        .args(["get", "norsk", "-A"])
        .output()
        .expect("kubectl runs");
    let listing = String::from_utf8_lossy(&out.stdout);
    for expected in [
        "placementpool.automanager.norsk.video/production",
        "bundle.automanager.norsk.video/ch1",
    ] {
        assert!(listing.contains(expected), "{expected} missing from:\n{listing}");
    }
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_killed_node_moves_the_bundle_and_an_event_says_why() {
    let cp = installed().await;
    let ns = cp.namespace("recovery").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "recovery-0").await;
    cp.kubectl_apply(&ns, &small_bundle("news")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "news", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let first = ready.status.and_then(|s| s.primary_node).expect("placed");
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef { node_id: first.clone() })
        .await
        .expect("node killed");
    let moved = until(&bundles, "news", "Ready on another node", |b: Option<&Bundle>| {
        is_ready(b)
            && b.and_then(|b| b.status.as_ref()?.primary_node.clone())
                .is_some_and(|n| n != first)
    })
    .await;
    let uid = moved.metadata.uid.clone();
    let now_on = moved.status.and_then(|s| s.primary_node).expect("placed again");
    assert_ne!(now_on, first);
    let events = watcher(Api::<Event>::namespaced(cp.client(), &ns), watcher::Config::default()).applied_objects();
    let recovered = tokio::time::timeout(WAIT, async {
        let mut events = pin!(events);
        while let Some(e) = events.try_next().await.expect("watch events") {
            if e.reason.as_deref() == Some("Recovered")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("news")
            {
                return e;
            }
        }
        panic!("the event watch ended")
    })
    .await
    .expect("a Recovered event on the bundle");
    // `kubectl describe` lists the Events whose regarding.uid is the object's own.
    assert_eq!(recovered.regarding.as_ref().and_then(|r| r.uid.clone()), uid);
    let note = recovered.note.unwrap_or_default();
    assert!(note.contains("re-placed") && note.contains(&now_on), "{note}");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn deleting_a_bundle_removes_it_on_manager_before_the_finalizer_goes() {
    let cp = installed().await;
    let ns = cp.namespace("delete").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "delete-0").await;
    cp.kubectl_apply(&ns, &small_bundle("gone")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "gone", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    assert!(ready.finalizers().iter().any(|f| f == "automanager.norsk.video/bundle"));
    let id = format!("{ns}/gone");
    assert!(sim.snapshot().await.bundles.iter().any(|b| b.bundle_id.0 == id));
    bundles
        .delete("gone", &Default::default())
        .await
        .expect("delete accepted");
    let uid = ready.uid().expect("uid");
    tokio::time::timeout(
        WAIT,
        await_condition(bundles.clone(), "gone", conditions::is_deleted(&uid)),
    )
    .await
    .expect("deleted in time")
    .expect("watch");
    let snapshot = sim.snapshot().await;
    assert!(
        !snapshot.bundles.iter().any(|b| b.bundle_id.0 == id),
        "Manager still holds {id}"
    );
    assert!(
        !snapshot.jobs.iter().any(|j| j.job_id.0.starts_with(&id)),
        "Manager still holds a job of {id}"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_hot_spare_policy_naming_an_unknown_pool_is_stalled() {
    let cp = installed().await;
    let ns = cp.namespace("spares").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "spares-0").await;
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {name: atlantis}\nspec:\n  pool: atlantis\n  targetCount: 1\n  spec: {instanceType: m5.xlarge, region: eu-west-1}\n",
    )
    .expect("policy applies");
    let policies: Api<HotSparePolicy> = Api::all(cp.client());
    let stalled = until(&policies, "atlantis", "Stalled", |p: Option<&HotSparePolicy>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Stalled" && c.status == "True"))
    })
    .await;
    let status = stalled.status.unwrap();
    let stall = status.conditions.iter().find(|c| c.type_ == "Stalled").unwrap();
    assert_eq!(stall.reason, "UnknownPool");
    assert!(stall.message.contains("atlantis"), "{}", stall.message);
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "False");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn status_is_written_only_when_something_changed() {
    let cp = installed().await;
    let ns = cp.namespace("writes").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "writes-0").await;
    cp.kubectl_apply(&ns, &small_bundle("steady")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let before = until(&bundles, "steady", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    // Three changes that are not the bundle's business: each is reconciled,
    // none changes what the status says. Counting starts once the first
    // touch is reconciled, so no write from before Ready is in flight.
    let mut writes = 0;
    let mut version = String::new();
    for i in 0..3 {
        let reconciles = operator.metrics.reconciles_of("bundle");
        let patch = serde_json::json!({"metadata": {"annotations": {"example.com/touch": i.to_string()}}});
        let touched = bundles
            .patch("steady", &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("annotate");
        version = touched.resource_version().expect("resourceVersion");
        tokio::time::timeout(WAIT, async {
            while operator.metrics.reconciles_of("bundle") <= reconciles {
                // The reconcile runs on the operator's task; poll its counter.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
        .await
        .expect("the touch is reconciled");
        if i == 0 {
            writes = operator.metrics.status_writes_of("bundle");
            assert!(writes >= 1);
        }
    }
    let after = bundles.get("steady").await.unwrap();
    assert_eq!(
        operator.metrics.status_writes_of("bundle"),
        writes,
        "a reconcile rewrote an unchanged status: {:#?} -> {:#?}",
        before.status,
        after.status
    );
    assert_eq!(
        bundles.get("steady").await.unwrap().resource_version(),
        Some(version),
        "the status write bumped resourceVersion"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn of_two_operators_only_the_leader_writes_and_the_other_takes_over() {
    let cp = installed().await;
    let ns = cp.namespace("leader").await;
    let sim = simulator(&ns).await;
    let first = Operator::start(cp, &ns, &sim, "leader-0").await;
    let second = Operator::start(cp, &ns, &sim, "leader-1").await;
    cp.kubectl_apply(&ns, &small_bundle("shared")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    until(&bundles, "shared", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    assert!(
        first.is_leading() != second.is_leading(),
        "exactly one operator leads: {} {}",
        first.is_leading(),
        second.is_leading()
    );
    let (leader, follower) = if first.is_leading() {
        (first, second)
    } else {
        (second, first)
    };
    assert!(leader.metrics.status_writes_of("bundle") >= 1);
    assert_eq!(
        follower.metrics.status_writes_of("bundle"),
        0,
        "a follower wrote status"
    );
    assert_eq!(follower.metrics.reconciles_of("bundle"), 0, "a follower reconciled");
    // The follower's standby core follows Manager, ready to take over.
    tokio::time::timeout(WAIT, async {
        while follower.metrics.manager_connected.get() != 1 {
            // The standby runs on the operator's task; poll its gauge.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the follower's standby has Manager's snapshot");
    leader.stop().await;
    // The follower takes the Lease once it is released, and carries on.
    cp.kubectl_apply(&ns, &small_bundle("after")).expect("bundle applies");
    until(&bundles, "after", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    assert!(follower.is_leading());
    let snapshot = sim.snapshot().await;
    let shared_jobs = snapshot
        .jobs
        .iter()
        .filter(|j| j.job_id.0.starts_with(&format!("{ns}/shared/")))
        .count();
    assert_eq!(shared_jobs, 1, "the new leader created the bundle's job again");
    follower.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn the_fleet_is_mirrored_into_norsk_nodes_and_a_swept_node_goes() {
    let cp = installed().await;
    let ns = cp.namespace("mirror").await;
    let sim = simulator(&ns).await;
    let settings = AutoSettings {
        // One simulated second: the sweep follows the stop at once.
        remove_stopped_nodes_after: 1,
        ..AutoSettings::default()
    };
    let operator = Operator::start_with(cp, &ns, &sim, "mirror-0", settings).await;
    cp.kubectl_apply(&ns, &small_bundle("busy")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "busy", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let busy_id = ready.status.and_then(|s| s.primary_node).expect("placed");
    let busy_node = node_resource_name(&ns, &busy_id);
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let mirrored = until(&nodes, &busy_node, "mirrored with its job", |n: Option<&NorskNode>| {
        n.and_then(|n| n.status.as_ref()).is_some_and(|s| s.job_count == 1)
    })
    .await;
    let status = mirrored.status.clone().unwrap();
    assert_eq!(mirrored.spec.node_id, busy_id);
    assert_eq!(status.phase, NodePhase::Running);
    assert_eq!(status.pool.as_deref(), Some("production"));
    assert_eq!(status.jobs, vec![format!("{ns}/busy/0/encode")]);
    assert_eq!(status.inventory.map(|i| i.total_capacity), Some(8.0));
    // What placement reads of it: the job's reservation, and back into a fleet node.
    let placement = status.placement.expect("placement mirrored");
    assert_eq!(placement.pool.as_deref(), Some("production"));
    assert_eq!(
        placement
            .jobs
            .iter()
            .map(|j| (j.job_id.0.as_str(), j.required_capacity))
            .collect::<Vec<_>>(),
        vec![(format!("{ns}/busy/0/encode").as_str(), 2.0)]
    );
    let node = mirrored.fleet_node().expect("the status converts");
    assert_eq!(node.id.0, busy_id);
    assert_eq!(node.inventory.map(|i| i.total_capacity), Some(8.0));
    let uid = mirrored.uid().expect("uid");
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef { node_id: busy_id })
        .await
        .expect("node killed");
    tokio::time::timeout(
        WAIT,
        await_condition(nodes.clone(), &busy_node, conditions::is_deleted(&uid)),
    )
    .await
    .expect("the swept node's resource is deleted in time")
    .expect("watch");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_bundle_naming_an_unknown_pool_is_stalled_until_it_changes() {
    let cp = installed().await;
    let ns = cp.namespace("invalid").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "invalid-0").await;
    let manifest = small_bundle("lost").replace("pool: production", "pool: atlantis");
    cp.kubectl_apply(&ns, &manifest)
        .expect("the API server cannot know the pools");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let stalled = until(&bundles, "lost", "Stalled", |b: Option<&Bundle>| {
        b.is_some_and(|b| condition(b, "Stalled").is_some_and(|(s, _)| s == "True"))
    })
    .await;
    assert_eq!(
        condition(&stalled, "Ready"),
        Some(("False".into(), "InvalidBundle".into()))
    );
    assert!(
        sim.snapshot().await.bundles.is_empty(),
        "an invalid bundle reached Manager"
    );
    // Fixed, it goes through.
    cp.kubectl_apply(&ns, &small_bundle("lost"))
        .expect("fixed bundle applies");
    until(&bundles, "lost", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_bundle_the_fleet_cannot_hold_says_no_capacity() {
    let cp = installed().await;
    let ns = cp.namespace("capacity").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "capacity-0").await;
    // Bigger than any cluster server and any candidate shape of `production`.
    let manifest = small_bundle("huge").replace("requiredCapacity: 2", "requiredCapacity: 64");
    cp.kubectl_apply(&ns, &manifest).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let waiting = until(&bundles, "huge", "Admitted=False", |b: Option<&Bundle>| {
        b.is_some_and(|b| condition(b, "Admitted").is_some_and(|(s, _)| s == "False"))
    })
    .await;
    assert_eq!(condition(&waiting, "Admitted").map(|c| c.1), Some("NoCapacity".into()));
    assert_eq!(condition(&waiting, "Ready").map(|c| c.0), Some("False".into()));
    assert_eq!(condition(&waiting, "Placed").map(|c| c.0), Some("False".into()));
    // The condition says what decided it, as `kubectl norsk explain` would.
    let placed = until(
        &bundles,
        "huge",
        "Placed naming the tiers' verdicts",
        |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref())
                .and_then(|s| s.conditions.iter().find(|c| c.type_ == "Placed"))
                .is_some_and(|c| c.message.contains("no candidate instance type fits"))
        },
    )
    .await;
    let message = placed
        .status
        .unwrap()
        .conditions
        .into_iter()
        .find(|c| c.type_ == "Placed")
        .unwrap()
        .message;
    assert!(
        message.starts_with("no tier could place or provision 0/encode (no capacity in any pool: tier "),
        "{message}"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_hot_spare_policy_keeps_a_live_spare_in_its_pool() {
    let cp = installed().await;
    let ns = cp.namespace("spares-live").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "spares-live-0").await;
    cp.kubectl_apply(&ns, &example("hot-spares.yaml"))
        .expect("policy applies");
    let policies: Api<HotSparePolicy> = Api::all(cp.client());
    let applied = until(
        &policies,
        "production",
        "Applied with a live spare",
        |p: Option<&HotSparePolicy>| {
            p.and_then(|p| p.status.as_ref()).is_some_and(|s| {
                s.live_spares == 1 && s.conditions.iter().any(|c| c.type_ == "Applied" && c.status == "True")
            })
        },
    )
    .await;
    assert_eq!(applied.status.unwrap().observed_generation, applied.metadata.generation);
    // Every operator keeps spares for the cluster-wide policy in its own
    // fleet: this one's live spare is mirrored as a running spare NorskNode
    // of its fleet. (On a loaded machine a spare may miss its provision
    // timeout on the compressed clock and be replaced; the replaced one is
    // mirrored as stopped until it is swept.)
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let fleet = watcher::Config::default().labels(&format!("automanager.norsk.video/fleet={ns}"));
    let spare = tokio::time::timeout(WAIT, async {
        let events = watcher(nodes, fleet).applied_objects();
        let mut events = pin!(events);
        while let Some(n) = events.try_next().await.expect("watch nodes") {
            if n.status
                .as_ref()
                .is_some_and(|s| s.spare && s.phase == NodePhase::Running)
            {
                return n;
            }
        }
        panic!("the node watch ended")
    })
    .await
    .expect("a spare is mirrored");
    let status = spare.status.clone().expect("status");
    assert_eq!(status.instance_type.as_deref(), Some("m5.xlarge"));
    assert_eq!(status.pool.as_deref(), Some("production"));
    let held = sim
        .snapshot()
        .await
        .nodes
        .into_iter()
        .any(|n| n.id.as_str() == spare.spec.node_id);
    assert!(
        held,
        "the spare {} is not in this operator's fleet (status {status:?})",
        spare.spec.node_id
    );
    policies
        .delete("production", &Default::default())
        .await
        .expect("policy deleted");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_deleted_pool_is_taken_from_the_core_live() {
    let cp = installed().await;
    let ns = cp.namespace("pool-gone").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "pool-gone-0").await;
    let pool = format!("{ns}-pool");
    cp.kubectl_apply(&ns, &cluster_pool(&pool)).expect("pool applies");
    let pools: Api<crd::PlacementPool> = Api::all(cp.client());
    until(&pools, &pool, "InForce", |p: Option<&crd::PlacementPool>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Ready" && c.reason == "InForce"))
    })
    .await;
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let accepted = |b: Option<&Bundle>| b.is_some_and(|b| condition(b, "Placed").is_some());
    let stalled = |b: Option<&Bundle>| b.is_some_and(|b| condition(b, "Stalled").is_some_and(|(s, _)| s == "True"));
    cp.kubectl_apply(
        &ns,
        &small_bundle("first").replace("pool: production", &format!("pool: {pool}")),
    )
    .expect("bundle applies");
    let first = until(&bundles, "first", "accepted", accepted).await;
    assert_eq!(condition(&first, "Stalled"), None);
    pools.delete(&pool, &Default::default()).await.expect("pool deleted");
    cp.kubectl_apply(
        &ns,
        &small_bundle("second").replace("pool: production", &format!("pool: {pool}")),
    )
    .expect("bundle applies");
    let second = until(&bundles, "second", "Stalled", stalled).await;
    assert_eq!(condition(&second, "Ready").map(|c| c.1), Some("InvalidBundle".into()));
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn cordoning_a_norsk_node_keeps_new_placements_off_it() {
    let cp = installed().await;
    let ns = cp.namespace("cordon").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "cordon-0").await;
    cp.kubectl_apply(&ns, &small_bundle("first")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let first = until(&bundles, "first", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let busy_id = first.status.and_then(|s| s.primary_node).expect("placed");
    let busy = node_resource_name(&ns, &busy_id);
    let nodes: Api<NorskNode> = Api::all(cp.client());
    until(&nodes, &busy, "mirrored", |n: Option<&NorskNode>| n.is_some()).await;
    let cordon = |on: bool| serde_json::json!({"spec": {"cordoned": on}});
    nodes
        .patch(&busy, &PatchParams::default(), &Patch::Merge(&cordon(true)))
        .await
        .expect("cordon");
    let cordoned = |want: &'static str| {
        move |n: Option<&NorskNode>| {
            n.and_then(|n| n.status.as_ref())
                .is_some_and(|s| s.conditions.iter().any(|c| c.type_ == "Cordoned" && c.status == want))
        }
    };
    until(&nodes, &busy, "Cordoned", cordoned("True")).await;
    // Binpack would put the next job beside the first; the cordon says no.
    cp.kubectl_apply(&ns, &small_bundle("second")).expect("bundle applies");
    let second = until(&bundles, "second", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let other = second.status.and_then(|s| s.primary_node).expect("placed");
    assert_ne!(other, busy_id, "a job was placed on a cordoned node");
    nodes
        .patch(&busy, &PatchParams::default(), &Patch::Merge(&cordon(false)))
        .await
        .expect("uncordon");
    until(&nodes, &busy, "uncordoned", cordoned("False")).await;
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_node_drain_migrates_the_jobs_away_and_reports_the_drain_state() {
    let cp = installed().await;
    let ns = cp.namespace("drain").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "drain-0").await;
    cp.kubectl_apply(&ns, &small_bundle("moving")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "moving", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let source = ready.status.and_then(|s| s.primary_node).expect("placed");
    cp.kubectl_apply(
        &ns,
        &format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: {source}}}\nspec: {{nodeId: {source}, strategy: overlap}}\n"
        ),
    )
    .expect("drain applies");
    let drains: Api<crd::NodeDrain> = Api::all(cp.client());
    let job = format!("{ns}/moving/0/encode");
    let drained = until(&drains, &source, "the job migrated", |d: Option<&crd::NodeDrain>| {
        d.and_then(|d| d.status.as_ref()).is_some_and(|s| {
            s.jobs
                .iter()
                .any(|j| j.job_id == job && (j.status == DrainJobStatus::Migrated || j.status == DrainJobStatus::Moved))
        })
    })
    .await;
    assert!(drained.status.unwrap().started.is_some());
    let moved = until(&bundles, "moving", "Ready elsewhere", |b: Option<&Bundle>| {
        is_ready(b)
            && b.and_then(|b| b.status.as_ref()?.primary_node.clone())
                .is_some_and(|n| n != source)
    })
    .await;
    assert_ne!(moved.status.and_then(|s| s.primary_node), Some(source.clone()));
    // The drain's migration is recorded as a JobMigration it owns.
    let migrations: Api<crd::JobMigration> = Api::namespaced(cp.client(), &ns);
    let recorded = tokio::time::timeout(WAIT, async {
        let events = watcher(migrations, watcher::Config::default()).applied_objects();
        let mut events = pin!(events);
        while let Some(m) = events.try_next().await.expect("watch migrations") {
            if m.status.as_ref().is_some_and(|s| s.phase == Some(MigrationPhase::Done)) {
                return m;
            }
        }
        panic!("the migration watch ended")
    })
    .await
    .expect("the drain's migration is recorded and done");
    assert_eq!(recorded.spec.bundle, "moving");
    assert_eq!(recorded.spec.job_name, "encode");
    assert_eq!(recorded.spec.strategy, Some(crd::MigrationStrategy::Overlap));
    assert!(
        recorded
            .owner_references()
            .iter()
            .any(|o| o.kind == "NodeDrain" && o.name == source)
    );
    drains
        .delete(&source, &Default::default())
        .await
        .expect("drain deleted");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_migration_moves_the_job_and_records_every_phase() {
    let cp = installed().await;
    let ns = cp.namespace("migrate").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "migrate-0").await;
    cp.kubectl_apply(&ns, &small_bundle("mobile")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "mobile", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let source = ready.status.and_then(|s| s.primary_node).expect("placed");
    cp.kubectl_apply(
        &ns,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {name: move-encode}\nspec: {bundle: mobile, jobName: encode, strategy: stopThenStart}\n",
    )
    .expect("migration applies");
    let migrations: Api<crd::JobMigration> = Api::namespaced(cp.client(), &ns);
    let done = until(&migrations, "move-encode", "done", |m: Option<&crd::JobMigration>| {
        m.and_then(|m| m.status.as_ref())
            .is_some_and(|s| s.phase == Some(MigrationPhase::Done))
    })
    .await;
    let status = done.status.unwrap();
    assert_eq!(status.source_node_id.as_deref(), Some(source.as_str()));
    assert_ne!(status.target_node_id.as_deref(), Some(source.as_str()));
    assert!(status.point_of_no_return_passed);
    assert!(status.transitions.len() >= 2, "{:?}", status.transitions);
    assert_eq!(status.transitions.last().map(|t| t.phase), Some(MigrationPhase::Done));
    let ready = status.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");
    until(&bundles, "mobile", "on the target", |b: Option<&Bundle>| {
        b.and_then(|b| b.status.as_ref()?.primary_node.clone()) == status.target_node_id
    })
    .await;
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn an_interruption_notice_produces_a_node_drain_by_itself() {
    let cp = installed().await;
    let ns = cp.namespace("interrupt").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "interrupt-0").await;
    cp.kubectl_apply(&ns, &small_bundle("reclaimed"))
        .expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let ready = until(&bundles, "reclaimed", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let node = ready.status.and_then(|s| s.primary_node).expect("placed");
    sim.admin
        .clone()
        .interrupt_node(sim_admin::InterruptNodeRequest {
            node_id: node.clone(),
            kind: norsk_auto_manager::manager::proto::manager::InterruptionKind::SpotInterruption as i32,
            deadline_s: 0.0,
        })
        .await
        .expect("notice sent");
    let drains: Api<crd::NodeDrain> = Api::all(cp.client());
    let name = node_resource_name(&ns, &node);
    let drain = until(
        &drains,
        &name,
        "recorded with its drain state",
        |d: Option<&crd::NodeDrain>| d.and_then(|d| d.status.as_ref()).is_some_and(|s| s.phase.is_some()),
    )
    .await;
    assert_eq!(drain.spec.node_id, node);
    assert!(drain.spec.force);
    assert_eq!(
        drain.spec.interruption.map(|i| i.kind),
        Some(crd::InterruptionKind::SpotInterruption)
    );
    drains.delete(&name, &Default::default()).await.expect("drain deleted");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn two_candidates_racing_for_a_free_lease_never_both_lead() {
    let cp = installed().await;
    let ns = cp.namespace("lease-race").await;
    let leases: Api<Lease> = Api::namespaced(cp.client(), &ns);
    // Each round both candidates find the Lease free and try to lock it at
    // once; only one lock may take.
    for round in 0..8 {
        let settings = |identity: &str| LeaseSettings {
            namespace: ns.clone(),
            name: format!("race-{round}"),
            identity: identity.to_owned(),
            duration_s: 15,
            grace_s: 5,
        };
        let (first, second) = (settings("a"), settings("b"));
        let (mut a, mut b) = (elect(cp.client(), &first), elect(cp.client(), &second));
        let holder = until(&leases, &format!("race-{round}"), "held", |l: Option<&Lease>| {
            l.and_then(|l| l.spec.as_ref()?.holder_identity.as_ref()).is_some()
        })
        .await
        .spec
        .and_then(|s| s.holder_identity)
        .expect("a holder");
        let (winner, loser) = if holder == "a" { (&mut a, &b) } else { (&mut b, &a) };
        tokio::time::timeout(WAIT, winner.leading.wait_for(|l| *l))
            .await
            .expect("the holder leads in time")
            .expect("the election runs");
        assert!(
            !*loser.leading.borrow(),
            "round {round}: both candidates lead (the Lease is held by {holder})"
        );
        drop((a, b));
    }
}

#[tokio::test]
async fn a_manual_job_is_started_and_stopped_from_the_bundle_resource() {
    let cp = installed().await;
    let ns = cp.namespace("manual").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "manual-0").await;
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let record = format!("{ns}/show/0/record");
    cp.kubectl_apply(&ns, &manual_bundle("show", &[]))
        .expect("bundle applies");
    let dormant = until(&bundles, "show", "Ready with record dormant", |b: Option<&Bundle>| {
        is_ready(b) && primary_job(b, "record").is_some_and(|(s, _)| s == JobPhase::Dormant)
    })
    .await;
    let encode_node = primary_job(Some(&dormant), "encode")
        .and_then(|(_, n)| n)
        .expect("encode placed");
    assert!(instances_of(&sim, &record).await.is_empty(), "a dormant job runs");

    cp.kubectl_apply(&ns, &manual_bundle("show", &[0]))
        .expect("started in the spec");
    let running = until(&bundles, "show", "record running", |b: Option<&Bundle>| {
        primary_job(b, "record").is_some_and(|(s, n)| s == JobPhase::Running && n.is_some())
    })
    .await;
    let (_, node) = primary_job(Some(&running), "record").expect("record in status");
    assert_eq!(instances_of(&sim, &record).await, [node.expect("placed")]);

    cp.kubectl_apply(&ns, &manual_bundle("show", &[]))
        .expect("stopped in the spec");
    until(
        &bundles,
        "show",
        "record dormant and off its node",
        |b: Option<&Bundle>| primary_job(b, "record").is_some_and(|(s, n)| s == JobPhase::Dormant && n.is_none()),
    )
    .await;
    // Its instance is stopped, not left running (Manager's StopBundleJob
    // alone would leave it).
    tokio::time::timeout(WAIT, async {
        while !instances_of(&sim, &record).await.is_empty() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the stopped job's instance is gone");
    let after = bundles.get("show").await.expect("bundle");
    assert_eq!(
        primary_job(Some(&after), "encode"),
        Some((JobPhase::Running, Some(encode_node))),
        "the auto job was touched"
    );
    // Starting and stopping is no revision: Manager still holds the bundle
    // it was created with.
    let stored = sim.snapshot().await.bundles;
    assert_eq!(stored.iter().map(|b| b.generation).collect::<Vec<_>>(), [1]);
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_scheduled_bundle_shows_its_schedule_and_waits_for_it_or_ends_with_it() {
    let cp = installed().await;
    let ns = cp.namespace("scheduled").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "scheduled-0").await;
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    // The example, booked ahead: nothing runs, and it says when it will.
    cp.kubectl_apply(&ns, &example("scheduled-match.yaml"))
        .expect("example applies");
    let waiting = until(
        &bundles,
        "match-final",
        "waiting for its start",
        |b: Option<&Bundle>| {
            b.and_then(|b| b.status.as_ref()?.schedule.as_ref())
                .is_some_and(|s| s.phase == SchedulePhase::Waiting)
                && primary_job(b, "record").is_some_and(|(s, _)| s == JobPhase::Scheduled)
        },
    )
    .await;
    assert_eq!(
        condition(&waiting, "Ready"),
        Some(("True".to_owned(), "Scheduled".to_owned()))
    );
    let schedule = waiting
        .status
        .as_ref()
        .and_then(|s| s.schedule.clone())
        .expect("schedule");
    assert_eq!(schedule.start.to_string(), "2027-05-29T19:00:00Z");
    assert_eq!(
        schedule.placing_from.to_string(),
        "2027-05-29T18:55:00Z",
        "the cloud tiers' lead"
    );
    assert_eq!(schedule.next_phase, Some(SchedulePhase::Placing));
    assert_eq!(schedule.next_transition_time, Some(schedule.placing_from));
    assert!(
        instances_of(&sim, &format!("{ns}/match-final/0/encode"))
            .await
            .is_empty()
    );
    // The same production in the past: ended, its jobs completed, nothing on air.
    let ended = example("scheduled-match.yaml")
        .replace("name: match-final", "name: match-past")
        .replace("2027-05-29", "2026-05-29");
    cp.kubectl_apply(&ns, &ended).expect("applies");
    let past = until(&bundles, "match-past", "ended", |b: Option<&Bundle>| {
        b.and_then(|b| b.status.as_ref()?.schedule.as_ref())
            .is_some_and(|s| s.phase == SchedulePhase::Ended)
            && ["encode", "record"]
                .iter()
                .all(|j| primary_job(b, j).is_some_and(|(s, _)| s == JobPhase::Ended))
    })
    .await;
    assert_eq!(condition(&past, "Ready"), Some(("True".to_owned(), "Ended".to_owned())));
    let jobs = sim.snapshot().await.jobs;
    let completed: Vec<_> = jobs
        .iter()
        .filter(|j| j.job_id.0.starts_with(&format!("{ns}/match-past/")))
        .map(|j| j.state)
        .collect();
    assert_eq!(completed, [JobState::Post, JobState::Post], "completed on Manager");
    assert!(
        instances_of(&sim, &format!("{ns}/match-past/0/encode"))
            .await
            .is_empty()
    );
    operator.stop().await;
    sim.shutdown().await;
}

/// A bundle whose only job is dropped on a runtime failure: the loss of
/// its node is terminal for it.
fn dropped_on_failure_bundle(name: &str, pool: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: {pool}\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: 1, onRuntimeFailure: drop}}}}\n"
    )
}

// On a pool of the test's own, with its two cluster servers:
// PlacementPools are cluster-wide, and every operator of this binary
// writes the status of the example ones.
#[tokio::test]
async fn headroom_marks_each_bundle_resilient_or_not_and_the_pool_s_lost_headroom_is_its_status_and_an_event() {
    let cp = installed().await;
    let ns = cp.namespace("headroom").await;
    let pool = format!("{ns}-pool");
    cp.kubectl_apply(&ns, &cluster_pool(&pool)).expect("pool applies");
    let sim = simulator_in(&ns, &pool).await;
    let mut settings = AutoSettings::default();
    settings.experimental.headroom = true;
    let operator = Operator::start_with(cp, &ns, &sim, "headroom-0", settings).await;
    cp.kubectl_apply(
        &ns,
        &small_bundle("sturdy").replace("pool: production", &format!("pool: {pool}")),
    )
    .expect("bundle applies");
    cp.kubectl_apply(&ns, &dropped_on_failure_bundle("fragile", &pool))
        .expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    // A node's loss re-places sturdy's job (on the other server, or a
    // provisioned one).
    let sturdy = until(&bundles, "sturdy", "Resilient", |b: Option<&Bundle>| {
        b.and_then(|b| condition(b, "Resilient"))
            .is_some_and(|(s, _)| s == "True")
    })
    .await;
    assert_eq!(
        condition(&sturdy, "Resilient"),
        Some(("True".to_owned(), "LossAbsorbed".to_owned()))
    );
    // fragile's job would be dropped: its node's loss takes it off the air.
    let fragile = until(&bundles, "fragile", "not Resilient", |b: Option<&Bundle>| {
        b.and_then(|b| condition(b, "Resilient"))
            .is_some_and(|(s, _)| s == "False")
    })
    .await;
    let status = fragile.status.clone().expect("status");
    let node = status.primary_node.clone().expect("fragile is placed");
    let resilient = status
        .conditions
        .iter()
        .find(|c| c.type_ == "Resilient")
        .expect("the condition");
    assert_eq!(resilient.reason, "LossNotAbsorbed");
    assert!(
        resilient.message.contains(&format!("node {node}")) && resilient.message.contains("drop"),
        "{}",
        resilient.message
    );
    // The pool's status: of its two nodes, one loss is absorbed and the
    // worst is fragile's node, taking one bundle off the air.
    let pools: Api<crd::PlacementPool> = Api::all(cp.client());
    let headroom = |p: Option<&crd::PlacementPool>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.headroom.iter().find(|h| h.kind == "node"))
            .cloned()
    };
    let watched = until(
        &pools,
        &pool,
        "node headroom with fragile's node worst",
        |p: Option<&crd::PlacementPool>| headroom(p).is_some_and(|h| h.worst.as_ref().is_some_and(|w| w.name == node)),
    )
    .await;
    let nodes = headroom(Some(&watched)).expect("node headroom");
    assert_eq!(
        (nodes.domains, nodes.absorbed, nodes.survives),
        (2, 1, false),
        "{nodes:#?}"
    );
    let worst = nodes.worst.expect("the worst node");
    assert_eq!(worst.dark_bundles, 1, "{worst:#?}");
    assert!(worst.why.contains("fragile"), "{worst:#?}");
    // The pool's verdict on a node's loss turned bad: a warning on the
    // PlacementPool (cluster-scoped: its Events are in `default`), naming
    // this test's node.
    let events = watcher(
        Api::<Event>::namespaced(cp.client(), "default"),
        watcher::Config::default(),
    )
    .applied_objects();
    let lost = tokio::time::timeout(WAIT, async {
        let mut events = pin!(events);
        while let Some(e) = events.try_next().await.expect("watch events") {
            let on_pool = e.regarding.as_ref().is_some_and(|r| {
                r.kind.as_deref() == Some("PlacementPool") && r.name.as_deref() == Some(pool.as_str())
            });
            if on_pool
                && e.reason.as_deref() == Some("HeadroomLost")
                && e.note.as_deref().is_some_and(|n| n.contains(&node))
            {
                return e;
            }
        }
        panic!("the event watch ended")
    })
    .await
    .expect("a HeadroomLost event on the pool");
    assert_eq!(lost.type_.as_deref(), Some("Warning"));
    let note = lost.note.unwrap_or_default();
    assert!(
        note.contains(&format!("cannot absorb the loss of node {node}")) && note.contains("fragile"),
        "{note}"
    );
    pools.delete(&pool, &Default::default()).await.expect("pool deleted");
    operator.stop().await;
    sim.shutdown().await;
}

/// Waits for an Event with `reason` about cluster-scoped `name` whose note
/// contains `says`; its note.
async fn event_saying(cp: &control_plane::ControlPlane, name: &str, reason: &str, says: &str) -> String {
    let event = event_where(
        cp,
        "default",
        &format!("{reason} Event about {name} saying {says:?}"),
        |e| {
            e.reason.as_deref() == Some(reason)
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                && e.note.as_deref().is_some_and(|n| n.contains(says))
        },
    )
    .await;
    event.note.unwrap_or_default()
}

#[tokio::test]
async fn a_live_change_of_a_hot_spare_policy_says_what_changed_on_the_policy() {
    let cp = installed().await;
    let ns = cp.namespace("spare-diff").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "spare-diff-0").await;
    // Leading first: a standby applies a policy silently before it leads,
    // and the leader then has nothing left to change.
    until_leading(&operator).await;
    // A pool and policy of this test's own, cluster-wide like every policy:
    // a target of none provisions nothing in any operator's fleet.
    let pool = format!("{ns}-cloud");
    cp.kubectl_apply(&ns, &elastic_pool(&pool)).expect("pool applies");
    let policy = |warm_for: &str, exclusive: bool| {
        format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {{name: {pool}}}\nspec:\n  pool: {pool}\n  targetCount: 0\n  spec: {{instanceType: m5.xlarge, region: eu-west-1}}\n  warmFor: {warm_for}\n  reservedFor: [encoder]\n  exclusive: {exclusive}\n"
        )
    };
    cp.kubectl_apply(&ns, &policy("[]", false)).expect("policy applies");
    let added = event_saying(cp, &pool, "SparePolicyInForce", "are kept from now on").await;
    assert!(added.contains("reservedFor [encoder]"), "{added}");
    cp.kubectl_apply(&ns, &policy("[encoder]", true))
        .expect("policy changes");
    let changed = event_saying(cp, &pool, "SparePolicyChanged", "changed live").await;
    assert_eq!(
        changed,
        format!("spares of pool {pool} changed live: warmFor [] -> [encoder], exclusive false -> true")
    );
    let policies: Api<HotSparePolicy> = Api::all(cp.client());
    policies
        .delete(&pool, &Default::default())
        .await
        .expect("policy deleted");
    let pools: Api<crd::PlacementPool> = Api::all(cp.client());
    pools.delete(&pool, &Default::default()).await.expect("pool deleted");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_placed_bundle_moves_the_dispatched_placements_counter() {
    let cp = installed().await;
    let ns = cp.namespace("counters").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "counters-0").await;
    let succeeded = |operator: &Operator| {
        operator
            .metrics
            .placement_results
            .get_or_create(&ResultLabels {
                result: "succeeded".to_owned(),
            })
            .get()
    };
    let before = succeeded(&operator);
    cp.kubectl_apply(&ns, &small_bundle("counted")).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    until(&bundles, "counted", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    tokio::time::timeout(WAIT, async {
        while succeeded(&operator) <= before {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("placement_results_total{result=\"succeeded\"} moved");
    assert!(operator.metrics.placement_attempts.get() >= succeeded(&operator));
    let text = operator.metrics.encode_prometheus_text();
    assert!(
        text.contains("norsk_automanager_placement_results_total{result=\"succeeded\"}"),
        "{text}"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn on_a_published_manager_a_consumed_spare_stays_consumed_under_the_next_leader() {
    let cp = installed().await;
    let ns = cp.namespace("kept-tags").await;
    // A published Manager cannot untag a spare that took a job: the
    // operator keeps that, and records it on the NorskNode.
    let sim = crate::sim_support::Sim::start_with(norsk_auto_manager::sim::SimConfig {
        seed: 7,
        time_scale: crate::sim_support::TIME_SCALE,
        published_api_only: true,
        ..norsk_auto_manager::sim::SimConfig::default()
    })
    .await;
    let first = Operator::start(cp, &ns, &sim, "kept-tags-0").await;
    until_leading(&first).await;
    // A pool and policy of this test's own (cluster-wide, like every pool).
    let pool = format!("{ns}-cloud");
    cp.kubectl_apply(&ns, &elastic_pool(&pool)).expect("pool applies");
    cp.kubectl_apply(
        &ns,
        &format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {{name: {pool}}}\nspec:\n  pool: {pool}\n  targetCount: 1\n  spec: {{instanceType: m5.xlarge, region: eu-west-1}}\n"
        ),
    )
    .expect("policy applies");
    let policies: Api<HotSparePolicy> = Api::all(cp.client());
    let one_live = |p: Option<&HotSparePolicy>| {
        p.and_then(|p| p.status.as_ref())
            .is_some_and(|s| s.live_spares == 1 && s.provisioning_spares == 0)
    };
    until(&policies, &pool, "one live spare", one_live).await;
    // A bundle that may launch on a spare takes it.
    cp.kubectl_apply(
        &ns,
        &format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: live}}\nspec:\n  pool: {pool}\n  onLaunch: allowSpare\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: 2}}}}\n"
        ),
    )
    .expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let placed = until(&bundles, "live", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    let consumed = placed.status.and_then(|s| s.primary_node).expect("placed");
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let name = node_resource_name(&ns, &consumed);
    let recorded = |n: Option<&NorskNode>| {
        n.and_then(|n| n.status.as_ref())
            .is_some_and(|s| !s.spare && s.kept_tags.as_ref().is_some_and(|k| k.removed.contains("spare")))
    };
    until(&nodes, &name, "the consumed spare recorded", recorded).await;
    // The policy keeps its one live spare: a new one replaced the consumed.
    until(&policies, &pool, "a replacement spare", one_live).await;

    // A new term, then the job leaves the consumed spare: the node is an
    // ordinary empty node to the new leader, not a second live spare.
    let second = Operator::start(cp, &ns, &sim, "kept-tags-1").await;
    first.stop().await;
    tokio::time::timeout(WAIT, async {
        while !second.is_leading() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the standby leads once the leader has stopped");
    bundles
        .delete("live", &Default::default())
        .await
        .expect("bundle deleted");
    await_condition(bundles.clone(), "live", conditions::is_deleted(""))
        .await
        .expect("the bundle goes");
    let empty = until(&nodes, &name, "the consumed spare emptied", |n: Option<&NorskNode>| {
        n.and_then(|n| n.status.as_ref()).is_some_and(|s| s.job_count == 0)
    })
    .await;
    let status = empty.status.expect("status");
    assert!(
        !status.spare,
        "the new leader took the consumed spare for a live one: {status:?}"
    );
    assert!(
        status.kept_tags.as_ref().is_some_and(|k| k.removed.contains("spare")),
        "the new leader records the node as it found it: {status:?}"
    );
    let policy = policies.get(&pool).await.expect("policy");
    assert_eq!(
        policy.status.map(|s| s.live_spares),
        Some(1),
        "the emptied node is not counted as a spare"
    );
    policies
        .delete(&pool, &Default::default())
        .await
        .expect("policy deleted");
    let pools: Api<crd::PlacementPool> = Api::all(cp.client());
    pools.delete(&pool, &Default::default()).await.expect("pool deleted");
    second.stop().await;
    sim.shutdown().await;
}

/// A PlacementPool `name` of one elastic AWS tier of m5.xlarge nodes.
fn elastic_pool(name: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {{name: {name}}}\nspec:\n  tiers:\n    - {{name: cloud, kind: aws, region: eu-west-1, scaleOut: elastic, candidateInstanceTypes: [{{instanceType: m5.xlarge, totalCapacity: 4, totalCores: 4, capabilities: []}}]}}\n"
    )
}

/// Waits (bounded) until `operator` leads: a standby applies policies
/// silently, so a test that watches what the leader says waits for it.
async fn until_leading(operator: &Operator) {
    tokio::time::timeout(WAIT, async {
        while !operator.is_leading() {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the operator leads");
}
