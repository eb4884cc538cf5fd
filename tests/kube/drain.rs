//! Drains and migrations through the operator, against the real control
//! plane (see `support/control_plane.rs`) with the Manager simulator
//! in-process: a `NodeDrain` empties its node and owns a `JobMigration` per
//! job; deleting it before the terminate cancels it; a `JobMigration`
//! moves a job and records each phase, and `spec.abort` rolls it back; a
//! provider's interruption notice makes the operator create a `NodeDrain`
//! itself; a migration in flight when the operator stops is accounted for
//! by the next term; a node a maintenance drain kept cordoned stays so
//! under the next leader.
//!
//! Every test takes a namespace and a simulator of its own (its nodes are
//! `<ns>-a` and `<ns>-b`) and runs its own operator.

use k8s_openapi::api::events::v1::Event;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Resource, ResourceExt};
use norsk_auto_manager::automanager::{AutoSettings, MigrationSettings};
use norsk_auto_manager::crd::{Bundle, InterruptionKind, JobMigration, NodeDrain};
use norsk_auto_manager::decide::node_status::node_resource_name;
use norsk_auto_manager::manager::proto::{manager as pb, sim_admin};
use norsk_auto_manager::model::{DrainJobStatus, DrainPhase, MigrationPhase, wire_name};

use crate::control_plane;
use crate::operator_support::{Operator, WAIT, event_where, installed, is_ready, simulator, small_bundle, until};
use crate::sim_support::Sim;

/// A simulated day: on the compressed clock, about 86 real seconds.
const SIMULATED_DAY_MS: u64 = 86_400_000;

/// Every migration phase may last a simulated day: a target hanging in
/// `starting` stays there long enough (in real time) for a test to act on
/// it, and a busy machine never trips a phase deadline.
fn patient_migrations() -> AutoSettings {
    AutoSettings {
        migration: MigrationSettings {
            placing_timeout_ms: SIMULATED_DAY_MS,
            preparing_timeout_ms: SIMULATED_DAY_MS,
            starting_timeout_ms: SIMULATED_DAY_MS,
            awaiting_ready_timeout_ms: SIMULATED_DAY_MS,
            stopping_output_timeout_ms: SIMULATED_DAY_MS,
            applying_timeout_ms: SIMULATED_DAY_MS,
            stopping_source_timeout_ms: SIMULATED_DAY_MS,
            starting_target_timeout_ms: SIMULATED_DAY_MS,
        },
        ..AutoSettings::default()
    }
}

/// Applies a one-job bundle and waits until it runs; its node.
async fn running_bundle(cp: &control_plane::ControlPlane, ns: &str, name: &str) -> String {
    cp.kubectl_apply(ns, &small_bundle(name)).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), ns);
    let ready = until(&bundles, name, "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    ready.status.and_then(|s| s.primary_node).expect("placed")
}

/// The runtime job of a one-job bundle.
fn job_of(ns: &str, bundle: &str) -> String {
    format!("{ns}/{bundle}/0/encode")
}

/// The target of `job` never reaches running.
async fn hang_starts(sim: &Sim, job: &str) {
    set_behaviour(sim, job, sim_admin::JobBehaviour::HangStart).await;
}

async fn set_behaviour(sim: &Sim, job: &str, behaviour: sim_admin::JobBehaviour) {
    sim.admin
        .clone()
        .set_job_behaviour(sim_admin::SetJobBehaviourRequest {
            job_id: job.to_owned(),
            behaviour: behaviour as i32,
        })
        .await
        .expect("behaviour set");
}

/// The spec's drain-then-terminate of `node` (a simulator cluster server:
/// no `after` terminates it too).
fn node_drain(name: &str, node: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: {name}}}\nspec:\n  nodeId: {node}\n  strategy: overlap\n{extra}"
    )
}

fn job_migration(name: &str, bundle: &str, extra: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {{name: {name}}}\nspec:\n  bundle: {bundle}\n  jobName: encode\n  strategy: overlap\n{extra}"
    )
}

fn drain_phase(d: Option<&NodeDrain>) -> Option<DrainPhase> {
    d?.status.as_ref()?.phase
}

fn migration_phase(m: Option<&JobMigration>) -> Option<MigrationPhase> {
    m?.status.as_ref()?.phase
}

fn condition_of(
    conditions: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition],
    type_: &str,
) -> Option<(String, String)> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

/// Waits for an Event with `reason` about `name` in `namespace`.
async fn event_about(cp: &control_plane::ControlPlane, namespace: &str, name: &str, reason: &str) -> Event {
    event_where(cp, namespace, &format!("{reason} Event about {name}"), |e| {
        e.reason.as_deref() == Some(reason) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
    })
    .await
}

#[tokio::test]
async fn an_applied_node_drain_empties_the_node_with_a_job_migration_per_job_it_owns() {
    let cp = installed().await;
    let ns = cp.namespace("drain").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start_with(cp, &ns, &sim, "drain-0", patient_migrations()).await;
    let node = running_bundle(cp, &ns, "one").await;
    let other = running_bundle(cp, &ns, "two").await;
    let drain_name = format!("{ns}-empty");
    cp.kubectl_apply("default", &node_drain(&drain_name, &node, ""))
        .expect("drain applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let done = until(&drains, &drain_name, "done", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Done)
    })
    .await;
    let status = done.status.clone().expect("status");
    assert_eq!(
        condition_of(&status.conditions, "Ready"),
        Some(("True".to_owned(), "Drained".to_owned()))
    );
    let on_node: Vec<String> = [("one", &node), ("two", &other)]
        .iter()
        .filter(|(_, n)| **n == node)
        .map(|(b, _)| job_of(&ns, b))
        .collect();
    let drained: Vec<String> = status.jobs.iter().map(|j| j.job_id.clone()).collect();
    assert_eq!(drained, on_node, "the drain covers exactly the node's jobs");
    assert!(
        status.jobs.iter().all(|j| j.status == DrainJobStatus::Migrated),
        "{status:#?}"
    );
    // A JobMigration per migration, owned by the drain, each ended done.
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    let uid = done.meta().uid.clone().expect("uid");
    for job in &status.jobs {
        let id = job.migration_id.clone().expect("each job migrated by a migration");
        let listed = migrations.list(&ListParams::default()).await.expect("list");
        let owned = listed
            .items
            .iter()
            .find(|m| m.annotations().get("automanager.norsk.video/migration-id") == Some(&id))
            .unwrap_or_else(|| panic!("no JobMigration for migration {id}"));
        assert!(
            owned
                .owner_references()
                .iter()
                .any(|o| o.uid == uid && o.kind == "NodeDrain")
        );
        let ended = until(&migrations, &owned.name_any(), "done", |m: Option<&JobMigration>| {
            migration_phase(m) == Some(MigrationPhase::Done)
        })
        .await;
        let target = ended.status.and_then(|s| s.target_node_id);
        assert_ne!(target, Some(node.clone()));
        // The drain's status names where each job went: its migration's target.
        assert_eq!(job.target_node_id, target, "{status:#?}");
    }
    // Each phase transition is an Event on the drain.
    let event = event_about(cp, "default", &drain_name, "DrainDone").await;
    assert!(event.note.unwrap_or_default().contains(&node));
    // The node was terminated on Manager: gone, or on its way out.
    let snapshot = sim.snapshot().await;
    let left = snapshot.nodes.iter().find(|n| n.id.as_str() == node);
    assert!(left.is_none_or(|n| format!("{:?}", n.phase) != "Running"), "{left:?}");
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn deleting_a_node_drain_before_its_terminate_cancels_it_and_uncordons_the_node() {
    let cp = installed().await;
    let ns = cp.namespace("cancel").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start_with(cp, &ns, &sim, "cancel-0", patient_migrations()).await;
    let node = running_bundle(cp, &ns, "stuck").await;
    hang_starts(&sim, &job_of(&ns, "stuck")).await;
    let drain_name = format!("{ns}-cancel");
    cp.kubectl_apply("default", &node_drain(&drain_name, &node, "  timeoutSeconds: 86400\n"))
        .expect("drain applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let running = until(&drains, &drain_name, "in flight", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Migrating)
    })
    .await;
    assert_eq!(
        condition_of(&running.status.clone().expect("status").conditions, "Reconciling").map(|c| c.0),
        Some("True".to_owned())
    );
    let uid = running.metadata.uid.clone().expect("uid");
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    tokio::time::timeout(
        WAIT,
        await_condition(drains.clone(), &drain_name, conditions::is_deleted(&uid)),
    )
    .await
    .expect("the finalizer lets the drain go")
    .expect("watch the drain");
    event_about(cp, "default", &drain_name, "DrainCancelled").await;
    // Uncordoned: with the other cluster server gone, a new bundle lands
    // on the node again rather than on a provisioned one.
    let other = if node.ends_with("-a") {
        format!("{ns}-b")
    } else {
        format!("{ns}-a")
    };
    sim.admin
        .clone()
        .kill_node(sim_admin::NodeRef { node_id: other })
        .await
        .expect("node killed");
    assert_eq!(running_bundle(cp, &ns, "after").await, node);
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_job_migration_with_overlap_moves_the_job_and_records_each_phase() {
    let cp = installed().await;
    let ns = cp.namespace("migrate").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start_with(cp, &ns, &sim, "migrate-0", patient_migrations()).await;
    let source = running_bundle(cp, &ns, "mover").await;
    cp.kubectl_apply(&ns, &job_migration("move-it", "mover", ""))
        .expect("migration applies");
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    let done = until(&migrations, "move-it", "done", |m: Option<&JobMigration>| {
        migration_phase(m) == Some(MigrationPhase::Done)
    })
    .await;
    let status = done.status.expect("status");
    let phases: Vec<String> = status.transitions.iter().map(|t| wire_name(&t.phase)).collect();
    assert_eq!(phases, ["placing", "starting", "stoppingSource", "done"], "{status:#?}");
    assert!(status.transitions.iter().all(|t| !t.at.is_empty()));
    assert_eq!(status.source_node_id.as_deref(), Some(source.as_str()));
    let target = status.target_node_id.clone().expect("target");
    assert_ne!(target, source);
    assert!(status.source_instance_key.is_some() && status.target_instance_key.is_some());
    assert!(status.point_of_no_return_passed);
    assert_eq!(
        condition_of(&status.conditions, "Ready").map(|c| c.0),
        Some("True".to_owned())
    );
    let completed = event_about(cp, &ns, "move-it", "MigrationCompleted").await;
    assert!(completed.note.unwrap_or_default().contains("/mover/0/encode"));
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    until(&bundles, "mover", "Ready on the target", |b: Option<&Bundle>| {
        is_ready(b) && b.and_then(|b| b.status.as_ref()?.primary_node.clone()) == Some(target.clone())
    })
    .await;
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn aborting_a_job_migration_before_the_point_of_no_return_rolls_it_back() {
    let cp = installed().await;
    let ns = cp.namespace("abort").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start_with(cp, &ns, &sim, "abort-0", patient_migrations()).await;
    let source = running_bundle(cp, &ns, "stay").await;
    hang_starts(&sim, &job_of(&ns, "stay")).await;
    cp.kubectl_apply(&ns, &job_migration("abort-it", "stay", ""))
        .expect("migration applies");
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    until(&migrations, "abort-it", "starting", |m: Option<&JobMigration>| {
        migration_phase(m) == Some(MigrationPhase::Starting)
    })
    .await;
    let patch = serde_json::json!({"spec": {"abort": true}});
    migrations
        .patch("abort-it", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .expect("abort asked");
    let aborted = until(&migrations, "abort-it", "aborted", |m: Option<&JobMigration>| {
        migration_phase(m) == Some(MigrationPhase::Aborted)
    })
    .await;
    let status = aborted.status.expect("status");
    assert!(!status.point_of_no_return_passed);
    assert_eq!(
        condition_of(&status.conditions, "Stalled"),
        Some(("True".to_owned(), "Aborted".to_owned()))
    );
    assert!(status.reason.unwrap_or_default().contains("spec.abort"));
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let still = bundles.get("stay").await.expect("bundle");
    assert_eq!(still.status.and_then(|s| s.primary_node), Some(source));
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn an_interruption_notice_makes_the_operator_create_a_node_drain_with_it() {
    let cp = installed().await;
    let ns = cp.namespace("interrupt").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start_with(cp, &ns, &sim, "interrupt-0", patient_migrations()).await;
    let node = running_bundle(cp, &ns, "spot").await;
    sim.admin
        .clone()
        .interrupt_node(sim_admin::InterruptNodeRequest {
            node_id: node.clone(),
            kind: pb::InterruptionKind::SpotInterruption as i32,
            // A simulated day: the drain ends before the reclaim.
            deadline_s: 86_400.0,
        })
        .await
        .expect("notice sent");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    // Named after the node, in this operator's fleet.
    let name = node_resource_name(&ns, &node);
    let drain = until(&drains, &name, "created", |d: Option<&NodeDrain>| d.is_some()).await;
    let interruption = drain.spec.interruption.clone().expect("the interruption is recorded");
    assert_eq!(interruption.kind, InterruptionKind::SpotInterruption);
    assert!(interruption.deadline.is_some());
    assert_eq!(drain.spec.node_id, node);
    let done = until(&drains, &name, "done", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Done)
    })
    .await;
    let status = done.status.expect("status");
    assert_eq!(status.jobs.len(), 1);
    assert_eq!(status.jobs[0].job_id, job_of(&ns, "spot"));
    event_about(cp, "default", &name, "NodeInterrupted").await;
    drains.delete(&name, &DeleteParams::default()).await.expect("delete");
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_migration_in_flight_when_the_operator_stops_is_started_again_by_the_next_term() {
    let cp = installed().await;
    let ns = cp.namespace("restart").await;
    let sim = simulator(&ns).await;
    let first = Operator::start_with(cp, &ns, &sim, "restart-0", patient_migrations()).await;
    let source = running_bundle(cp, &ns, "held").await;
    hang_starts(&sim, &job_of(&ns, "held")).await;
    cp.kubectl_apply(&ns, &job_migration("in-flight", "held", ""))
        .expect("migration applies");
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    let in_flight = until(&migrations, "in-flight", "starting", |m: Option<&JobMigration>| {
        migration_phase(m) == Some(MigrationPhase::Starting)
    })
    .await;
    let first_id = in_flight.status.and_then(|s| s.migration_id).expect("a migration id");
    first.stop().await;
    // Starts succeed again: the next term's attempt can finish.
    set_behaviour(&sim, &job_of(&ns, "held"), sim_admin::JobBehaviour::Cooperative).await;
    let second = Operator::start_with(cp, &ns, &sim, "restart-1", patient_migrations()).await;
    // Closing the first term's core rolled the saga back before its point of no return;
    // the person's request still stands, so the next term starts it again and says so.
    let restarted = event_about(cp, &ns, "in-flight", "Restarted").await;
    let note = restarted.note.unwrap_or_default();
    assert!(note.contains("starting") && note.contains(&source), "{note}");
    let done = until(&migrations, "in-flight", "done", |m: Option<&JobMigration>| {
        migration_phase(m).is_some_and(MigrationPhase::is_ended)
    })
    .await;
    let status = done.status.expect("status");
    assert_eq!(status.phase, Some(MigrationPhase::Done), "{status:#?}");
    assert_ne!(status.migration_id.as_deref(), Some(first_id.as_str()), "a new saga");
    assert_ne!(status.target_node_id.as_deref(), Some(source.as_str()));
    second.stop().await;
    sim.shutdown().await;
}

/// The `JobMigration`s the operator made for drain `drain`, once there
/// are at least `count` (polled until `WAIT`).
async fn drain_migrations(api: &Api<JobMigration>, drain: &str, count: usize) -> Vec<JobMigration> {
    let params = ListParams::default().labels(&format!("automanager.norsk.video/drain={drain}"));
    tokio::time::timeout(WAIT, async {
        loop {
            let listed = api.list(&params).await.expect("list").items;
            if listed.len() >= count {
                return listed;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("fewer than {count} JobMigrations of {drain}"))
}

#[tokio::test]
async fn a_drain_in_flight_when_the_operator_stops_is_resumed_by_the_next_term() {
    let cp = installed().await;
    let ns = cp.namespace("resume").await;
    let sim = simulator(&ns).await;
    let first = Operator::start_with(cp, &ns, &sim, "resume-0", patient_migrations()).await;
    let node = running_bundle(cp, &ns, "slow").await;
    hang_starts(&sim, &job_of(&ns, "slow")).await;
    let drain_name = format!("{ns}-resume");
    cp.kubectl_apply("default", &node_drain(&drain_name, &node, "  timeoutSeconds: 86400\n"))
        .expect("drain applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let before = until(&drains, &drain_name, "migrating", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Migrating)
    })
    .await;
    let first_started = before.status.and_then(|s| s.started);
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    let old = drain_migrations(&migrations, &drain_name, 1).await[0].name_any();
    until(&migrations, &old, "starting", |m: Option<&JobMigration>| {
        migration_phase(m) == Some(MigrationPhase::Starting)
    })
    .await;
    first.stop().await;
    let second = Operator::start_with(cp, &ns, &sim, "resume-1", patient_migrations()).await;
    event_about(cp, "default", &drain_name, "DrainResumed").await;
    let resumed = until(&drains, &drain_name, "started again", |d: Option<&NodeDrain>| {
        d.and_then(|d| d.status.as_ref()?.started.clone()) != first_started
    })
    .await;
    assert_eq!(drain_phase(Some(&resumed)), Some(DrainPhase::Migrating));
    // The first term's migration is accounted for, not dropped; the
    // resumed drain's migration has a JobMigration of its own.
    let ended = until(&migrations, &old, "an end", |m: Option<&JobMigration>| {
        migration_phase(m).is_some_and(MigrationPhase::is_ended)
    })
    .await;
    assert!(
        ended
            .status
            .and_then(|s| s.reason)
            .is_some_and(|r| r.contains("term ended"))
    );
    let both = drain_migrations(&migrations, &drain_name, 2).await;
    assert!(both.iter().any(|m| m.name_any() != old));
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    second.stop().await;
    sim.shutdown().await;
}

/// A one-job bundle on the cluster tier of `production` asking `capacity`.
fn sized_bundle(name: &str, capacity: u32) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: production\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: {capacity}}}}}\n"
    )
}

#[tokio::test]
async fn a_node_a_maintenance_drain_kept_cordoned_takes_no_job_under_the_next_leader_until_uncordoned() {
    let cp = installed().await;
    let ns = cp.namespace("kept").await;
    let sim = simulator(&ns).await;
    let first = Operator::start(cp, &ns, &sim, "kept-0").await;
    let kept = running_bundle(cp, &ns, "one").await;
    // A standby follows from the start: it is the next term's core.
    let second = Operator::start(cp, &ns, &sim, "kept-1").await;
    let drain_name = format!("{ns}-kept");
    cp.kubectl_apply("default", &node_drain(&drain_name, &kept, "  after: keep\n"))
        .expect("drain applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    until(&drains, &drain_name, "done", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Done)
    })
    .await;
    // The cordon is handed to the NorskNode, where a person lifts it.
    let name = node_resource_name(&ns, &kept);
    let nodes: Api<norsk_auto_manager::crd::NorskNode> = Api::all(cp.client());
    let node = nodes.get(&name).await.expect("the kept node is mirrored");
    assert!(node.spec.cordoned, "the kept drain set spec.cordoned: {:?}", node.spec);
    event_about(cp, "default", &drain_name, "NodeKeptCordoned").await;

    // A new term: the standby takes the Lease the first leader lets go.
    first.stop().await;
    tokio::time::timeout(WAIT, async {
        while !second.is_leading() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the standby leads once the leader has stopped");
    let cordoned = |n: Option<&norsk_auto_manager::crd::NorskNode>| {
        n.and_then(|n| n.status.as_ref())
            .and_then(|s| condition_of(&s.conditions, "Cordoned"))
            .is_some_and(|(status, _)| status == "True")
    };
    until(&nodes, &name, "Cordoned under the new leader", cordoned).await;
    for bundle in ["two", "three"] {
        let placed = running_bundle(cp, &ns, bundle).await;
        assert_ne!(
            placed, kept,
            "{bundle} was placed on the node kept cordoned for maintenance"
        );
    }
    let still = nodes.get(&name).await.expect("node");
    assert!(
        cordoned(Some(&still)),
        "the new leader shows the node cordoned: {:?}",
        still.status
    );

    // Every process restarted: a fresh operator reads the cordon from the
    // NorskNode before it leads, and its first round already honours it.
    second.stop().await;
    let third = Operator::start(cp, &ns, &sim, "kept-2").await;
    tokio::time::timeout(WAIT, async {
        while !third.is_leading() {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("a fresh operator leads with a cordoned node in its fleet");
    let placed = running_bundle(cp, &ns, "four").await;
    assert_ne!(placed, kept, "four was placed on the cordoned node after a restart");

    // Uncordoned, the node is in service again: a job the other server has
    // no room left for lands there.
    nodes
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(&serde_json::json!({"spec": {"cordoned": false}})),
        )
        .await
        .expect("uncordon");
    until(
        &nodes,
        &name,
        "uncordoned",
        |n: Option<&norsk_auto_manager::crd::NorskNode>| !cordoned(n),
    )
    .await;
    cp.kubectl_apply(&ns, &sized_bundle("big", 3)).expect("bundle applies");
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let big = until(&bundles, "big", "Ready", |b: Option<&Bundle>| is_ready(b)).await;
    assert_eq!(big.status.and_then(|s| s.primary_node), Some(kept));
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    third.stop().await;
    sim.shutdown().await;
}

/// A `NodeDrain` that acts at once on `node`: `mode` is `evict` or
/// `terminate`.
fn node_drain_at_once(name: &str, node: &str, mode: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: {name}}}\nspec:\n  nodeId: {node}\n  mode: {mode}\n"
    )
}

#[tokio::test]
async fn an_evict_node_drain_terminates_the_node_at_once_and_its_job_recovers_on_another() {
    let cp = installed().await;
    let ns = cp.namespace("evict").await;
    let sim = simulator(&ns).await;
    let first = Operator::start(cp, &ns, &sim, "evict-0").await;
    let node = running_bundle(cp, &ns, "one").await;
    let drain_name = format!("{ns}-evict");
    cp.kubectl_apply("default", &node_drain_at_once(&drain_name, &node, "evict"))
        .expect("evict applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let done = until(&drains, &drain_name, "done", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Done)
    })
    .await;
    let status = done.status.clone().expect("status");
    assert_eq!(
        condition_of(&status.conditions, "Ready"),
        Some(("True".to_owned(), "Terminated".to_owned()))
    );
    let reason = status.reason.clone().unwrap_or_default();
    assert!(
        reason.contains(&job_of(&ns, "one")),
        "the reason names the job: {reason}"
    );
    assert!(status.jobs.is_empty(), "nothing migrated: {status:#?}");
    let issued = event_about(cp, "default", &drain_name, "NodeEvicted").await;
    assert!(
        issued
            .note
            .unwrap_or_default()
            .contains("cordoned and terminated at once")
    );
    event_about(cp, "default", &drain_name, "DrainDone").await;
    // No JobMigration: the job went down with the node...
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    assert!(
        migrations
            .list(&ListParams::default())
            .await
            .expect("list")
            .items
            .is_empty()
    );
    // ...and recovered per its onRuntimeFailure, on the other server.
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let moved = until(&bundles, "one", "Ready elsewhere", |b: Option<&Bundle>| {
        is_ready(b)
            && b.and_then(|b| b.status.as_ref())
                .and_then(|s| s.primary_node.as_ref())
                .is_some_and(|n| *n != node)
    })
    .await;
    assert_ne!(moved.status.and_then(|s| s.primary_node), Some(node.clone()));
    let snapshot = sim.snapshot().await;
    let left = snapshot.nodes.iter().find(|n| n.id.as_str() == node);
    assert!(left.is_none_or(|n| format!("{:?}", n.phase) != "Running"), "{left:?}");

    // The next term reads `done` and issues nothing again: a new core that
    // no longer knows the node would have ended a second terminate `failed`.
    first.stop().await;
    let second = Operator::start(cp, &ns, &sim, "evict-1").await;
    tokio::time::timeout(WAIT, async {
        while second.metrics.reconciles_of("nodedrain") == 0 {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await
    .expect("the next term reconciles the drain");
    let after = drains.get(&drain_name).await.expect("drain");
    assert_eq!(drain_phase(Some(&after)), Some(DrainPhase::Done));
    let terminates = sim
        .snapshot()
        .await
        .audit
        .iter()
        .filter(|e| e.action == "node.terminate" && e.subject == node)
        .count();
    assert_eq!(terminates, 1, "one terminate of {node}");

    // Deleting it cancels nothing: no DrainCancelled, the node stays gone.
    let uid = after.metadata.uid.clone().expect("uid");
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    tokio::time::timeout(
        WAIT,
        await_condition(drains.clone(), &drain_name, conditions::is_deleted(&uid)),
    )
    .await
    .expect("the finalizer lets the evict go")
    .expect("watch the drain");
    let events: Api<Event> = Api::namespaced(cp.client(), "default");
    let cancelled = events
        .list(&ListParams::default())
        .await
        .expect("events")
        .items
        .into_iter()
        .any(|e| {
            e.reason.as_deref() == Some("DrainCancelled")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(drain_name.as_str())
        });
    assert!(!cancelled, "an evict has nothing to cancel");
    second.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn a_terminate_node_drain_terminates_an_idle_node_without_cordoning_it_first() {
    let cp = installed().await;
    let ns = cp.namespace("terminate").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "terminate-0").await;
    let busy = running_bundle(cp, &ns, "one").await;
    let idle = if busy.ends_with("-a") {
        format!("{ns}-b")
    } else {
        format!("{ns}-a")
    };
    let drain_name = format!("{ns}-terminate");
    cp.kubectl_apply("default", &node_drain_at_once(&drain_name, &idle, "terminate"))
        .expect("terminate applies");
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let done = until(&drains, &drain_name, "done", |d: Option<&NodeDrain>| {
        drain_phase(d) == Some(DrainPhase::Done)
    })
    .await;
    let reason = done.status.and_then(|s| s.reason).unwrap_or_default();
    assert!(reason.contains("terminated at once, with no job on it"), "{reason}");
    event_about(cp, "default", &drain_name, "NodeTerminated").await;
    // The busy node and its job are untouched.
    let bundles: Api<Bundle> = Api::namespaced(cp.client(), &ns);
    let one = bundles.get("one").await.expect("bundle");
    assert_eq!(one.status.and_then(|s| s.primary_node), Some(busy));
    drains
        .delete(&drain_name, &DeleteParams::default())
        .await
        .expect("delete");
    operator.stop().await;
    sim.shutdown().await;
}
