//! `kubectl-norsk` against the real API server (see `support/control_plane.rs`): what each
//! command writes (cordon's patch, drain's and interrupt's NodeDrain, migrate's JobMigration),
//! a followed drain ending with its phase, `plan` printing what `norsk-auto-manager plan`
//! prints for the same pools, bundles and fleet file, and `plan` on the live fleet (the
//! NorskNodes an operator running against the simulator mirrors) choosing the node the
//! operator then places on, and `start` / `stop` of a manual job through a real operator.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use futures::StreamExt;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use norsk_auto_manager::cli::plan::{self as offline, Output};
use norsk_auto_manager::crd::{
    self, InterruptionKind, JobMigration, MigrationStrategy, NodeDrain, NodePlacementStatus, NorskNode, NorskNodeSpec,
    NorskNodeStatus,
};
use norsk_auto_manager::decide::node_status::node_resource_name;
use norsk_auto_manager::model::{FleetNode, JobPhase, NodeId, NodeInventory, NodePhase};
use norsk_auto_manager::plugin::{self, Command, FleetSource, ManualJobArgs, PlanWarning, PluginError, Strategy};
use serde_json::json;

use crate::control_plane;
use crate::operator_support::{
    Operator, WAIT, installed, instances_of, is_ready, manual_bundle, primary_job, simulator, until,
};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A NorskNode `name` mirroring Manager node `node_id`, as the operator would create it.
async fn norsk_node(cp: &control_plane::ControlPlane, name: &str, node_id: &str) {
    let nodes: Api<NorskNode> = Api::all(cp.client());
    nodes
        .create(
            &PostParams::default(),
            &NorskNode::new(
                name,
                NorskNodeSpec {
                    node_id: node_id.to_owned(),
                    ..NorskNodeSpec::default()
                },
            ),
        )
        .await
        .expect("create NorskNode");
}

#[tokio::test]
async fn cordon_and_uncordon_patch_the_norsk_node_by_name_or_node_id() {
    let cp = installed().await;
    norsk_node(cp, "ec2-i-0cordon", "EC2/i-0cordon").await;
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let by_id = Command::Cordon {
        node: "EC2/i-0cordon".to_owned(),
    };
    assert_eq!(
        plugin::run(cp.client(), "default", by_id).await.expect("cordon"),
        ExitCode::SUCCESS
    );
    assert!(nodes.get("ec2-i-0cordon").await.expect("get").spec.cordoned);
    let by_name = Command::Uncordon {
        node: "ec2-i-0cordon".to_owned(),
    };
    assert_eq!(
        plugin::run(cp.client(), "default", by_name).await.expect("uncordon"),
        ExitCode::SUCCESS
    );
    let node = nodes.get("ec2-i-0cordon").await.expect("get");
    assert!(!node.spec.cordoned);
    assert_eq!(node.spec.node_id, "EC2/i-0cordon", "the rest of the spec is kept");
}

#[tokio::test]
async fn cordon_of_an_unknown_node_says_so() {
    let cp = installed().await;
    let missing = Command::Cordon {
        node: "no-such-node".to_owned(),
    };
    match plugin::run(cp.client(), "default", missing).await {
        Err(PluginError::UnknownNode(node)) => assert_eq!(node, "no-such-node"),
        other => panic!("expected UnknownNode, got {other:?}"),
    }
}

/// Waits (a watch, bounded by `WAIT`) for the NodeDrain of `node_id` the command creates.
async fn drain_of(cp: &control_plane::ControlPlane, node_id: &str) -> NodeDrain {
    let drains: Api<NodeDrain> = Api::all(cp.client());
    let mut seen = watcher(drains, watcher::Config::default())
        .default_backoff()
        .applied_objects()
        .boxed();
    let found = tokio::time::timeout(WAIT, async {
        // Watch errors (an expired resource version) are retried by the watcher.
        while let Some(drain) = seen.next().await {
            if let Ok(drain) = drain
                && drain.spec.node_id == node_id
            {
                return Some(drain);
            }
        }
        None
    })
    .await;
    found
        .ok()
        .flatten()
        .unwrap_or_else(|| panic!("no NodeDrain of {node_id} appeared"))
}

/// Writes `phase` (and jobs) into the drain's status, as the operator would.
async fn set_phase(cp: &control_plane::ControlPlane, name: &str, phase: &str, jobs: serde_json::Value) {
    let drains: Api<NodeDrain> = Api::all(cp.client());
    drains
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": phase, "jobs": jobs, "reason": "job b/1/x stuck"}})),
        )
        .await
        .expect("status patch");
}

#[tokio::test]
async fn drain_creates_a_node_drain_and_follows_it_until_done() {
    let cp = installed().await;
    norsk_node(cp, "drain-done", "drain-done").await;
    let command = Command::Drain {
        node: "drain-done".to_owned(),
        timeout: Some(120),
        force: true,
        strategy: Some(Strategy::Overlap),
        keep: false,
        terminate: false,
        no_wait: false,
    };
    let client = cp.client();
    let running = tokio::spawn(async move { plugin::run(client, "default", command).await });
    let drain = drain_of(cp, "drain-done").await;
    assert_eq!(drain.spec.timeout_seconds, Some(120));
    assert!(drain.spec.force);
    assert_eq!(drain.spec.strategy, Some(MigrationStrategy::Overlap));
    assert!(drain.spec.interruption.is_none());
    let name = drain.name_any();
    set_phase(
        cp,
        &name,
        "migrating",
        json!([{"jobId": "b/0/x", "status": "migrating"}]),
    )
    .await;
    assert!(!running.is_finished(), "the drain is followed until it ends");
    set_phase(cp, &name, "done", json!([{"jobId": "b/0/x", "status": "migrated"}])).await;
    let code = tokio::time::timeout(WAIT, running)
        .await
        .expect("drain returns once done")
        .expect("task")
        .expect("drain");
    assert_eq!(code, ExitCode::SUCCESS);
}

#[tokio::test]
async fn drain_that_ends_partial_exits_with_failure() {
    let cp = installed().await;
    norsk_node(cp, "drain-partial", "drain-partial").await;
    let command = Command::Drain {
        node: "drain-partial".to_owned(),
        timeout: None,
        force: false,
        strategy: Some(Strategy::StopThenStart),
        keep: false,
        terminate: false,
        no_wait: false,
    };
    let client = cp.client();
    let running = tokio::spawn(async move { plugin::run(client, "default", command).await });
    let drain = drain_of(cp, "drain-partial").await;
    assert_eq!(drain.spec.timeout_seconds, None);
    assert!(!drain.spec.force);
    set_phase(
        cp,
        &drain.name_any(),
        "partial",
        json!([{"jobId": "b/1/x", "status": "stuck"}]),
    )
    .await;
    let code = tokio::time::timeout(WAIT, running)
        .await
        .expect("drain returns once partial")
        .expect("task")
        .expect("drain");
    assert_eq!(code, ExitCode::FAILURE);
}

/// Runs `command` (an evict or terminate of `node_id`); once its NodeDrain appears, the
/// operator's part is played by writing `phases` into its status; the NodeDrain and the exit
/// code.
async fn at_once_answered(
    cp: &control_plane::ControlPlane,
    node_id: &str,
    command: Command,
    phases: &[(&str, &str)],
) -> (NodeDrain, ExitCode) {
    norsk_node(cp, node_id, node_id).await;
    let client = cp.client();
    let running = tokio::spawn(async move { plugin::run(client, "default", command).await });
    let drain = drain_of(cp, node_id).await;
    let drains: Api<NodeDrain> = Api::all(cp.client());
    for (phase, reason) in phases {
        assert!(!running.is_finished(), "followed until it ends");
        drains
            .patch_status(
                &drain.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"status": {"phase": phase, "reason": reason}})),
            )
            .await
            .expect("status patch");
    }
    let code = tokio::time::timeout(WAIT, running)
        .await
        .expect("returns once ended")
        .expect("task")
        .expect("command");
    (drain, code)
}

#[tokio::test]
async fn evict_creates_an_evict_node_drain_and_exits_with_success_once_done() {
    let cp = installed().await;
    let command = Command::Evict {
        node: "evict-done".to_owned(),
        no_wait: false,
    };
    let (drain, code) = at_once_answered(
        cp,
        "evict-done",
        command,
        &[
            ("terminating", "cordoned and terminated at once"),
            ("done", "Manager stopped the node"),
        ],
    )
    .await;
    assert_eq!(drain.spec.mode, Some(crd::DrainMode::Evict));
    assert!(!drain.spec.force && drain.spec.strategy.is_none() && drain.spec.after.is_none());
    assert_eq!(code, ExitCode::SUCCESS);
}

#[tokio::test]
async fn terminate_that_fails_exits_with_failure() {
    let cp = installed().await;
    let command = Command::Terminate {
        node: "terminate-refused".to_owned(),
        no_wait: false,
    };
    let (drain, code) = at_once_answered(
        cp,
        "terminate-refused",
        command,
        &[("failed", "Manager refused the terminate: permission denied")],
    )
    .await;
    assert_eq!(drain.spec.mode, Some(crd::DrainMode::Terminate));
    assert_eq!(code, ExitCode::FAILURE);
}

#[tokio::test]
async fn interrupt_creates_a_forced_drain_carrying_the_notice() {
    let cp = installed().await;
    norsk_node(cp, "spot-1", "aws/i-0spot").await;
    let command = Command::Interrupt {
        node: "spot-1".to_owned(),
        kind: plugin::Notice::Rebalance,
        deadline: Some("2026-11-29T23:00:00Z".to_owned()),
        strategy: None,
        no_wait: true,
    };
    assert_eq!(
        plugin::run(cp.client(), "default", command).await.expect("interrupt"),
        ExitCode::SUCCESS
    );
    let drain = drain_of(cp, "aws/i-0spot").await;
    assert!(drain.spec.force);
    let notice = drain.spec.interruption.expect("the notice");
    assert_eq!(notice.kind, InterruptionKind::Rebalance);
    assert_eq!(notice.deadline.as_deref(), Some("2026-11-29T23:00:00Z"));
}

#[tokio::test]
async fn migrate_creates_a_job_migration_in_the_namespace() {
    let cp = installed().await;
    let ns = cp.namespace("migrate").await;
    let command = Command::Migrate {
        bundle: "ch1".to_owned(),
        job: "encode".to_owned(),
        replica: 1,
        to: Some("node-b".to_owned()),
        strategy: Some(Strategy::Handover),
        override_reservation: true,
        no_wait: true,
    };
    assert_eq!(
        plugin::run(cp.client(), &ns, command).await.expect("migrate"),
        ExitCode::SUCCESS
    );
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    let created = migrations.list(&ListParams::default()).await.expect("list").items;
    assert_eq!(created.len(), 1);
    let spec = &created[0].spec;
    assert_eq!(
        (spec.bundle.as_str(), spec.job_name.as_str(), spec.replica_index),
        ("ch1", "encode", 1)
    );
    assert_eq!(spec.target_node_id.as_deref(), Some("node-b"));
    assert_eq!(spec.strategy, Some(MigrationStrategy::Handover));
    assert!(spec.override_reservation && !spec.abort);
    assert!(created[0].name_any().starts_with("ch1-encode-"));
}

/// The one JobMigration `migrate` created in `ns`, once it exists.
async fn migration_in(cp: &control_plane::ControlPlane, ns: &str) -> JobMigration {
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), ns);
    let found = tokio::time::timeout(WAIT, async {
        loop {
            if let Some(found) = migrations
                .list(&ListParams::default())
                .await
                .ok()
                .and_then(|l| l.items.into_iter().next())
            {
                return found;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    })
    .await;
    found.expect("the JobMigration was created")
}

/// Runs `kubectl norsk migrate ch1 package` in `prefix`'s namespace, answers the
/// JobMigration it creates with `status` as the operator would, and returns the exit code;
/// the command must still be waiting before the answer.
async fn migrate_answered(prefix: &str, strategy: Strategy, status: serde_json::Value) -> ExitCode {
    let cp = installed().await;
    let ns = cp.namespace(prefix).await;
    let command = Command::Migrate {
        bundle: "ch1".to_owned(),
        job: "package".to_owned(),
        replica: 0,
        to: None,
        strategy: Some(strategy),
        override_reservation: false,
        no_wait: false,
    };
    let client = cp.client();
    let namespace = ns.clone();
    let running = tokio::spawn(async move { plugin::run(client, &namespace, command).await });
    let created = migration_in(cp, &ns).await;
    assert!(!running.is_finished(), "migrate waits for the operator's answer");
    let migrations: Api<JobMigration> = Api::namespaced(cp.client(), &ns);
    migrations
        .patch_status(
            &created.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({ "status": status })),
        )
        .await
        .expect("status patch");
    tokio::time::timeout(WAIT, running)
        .await
        .expect("migrate returns once answered")
        .expect("task")
        .expect("migrate")
}

#[tokio::test]
async fn migrate_waits_for_the_operator_and_exits_with_failure_when_refused() {
    let refused = json!({"reason": "job default/ch1/0/package is not running"});
    let code = migrate_answered("migrate-refused", Strategy::StopThenStart, refused).await;
    assert_eq!(code, ExitCode::FAILURE);
}

#[tokio::test]
async fn migrate_exits_with_success_once_the_operator_accepted() {
    let accepted = json!({
        "migrationId": "0000abcd", "phase": "starting",
        "sourceNodeId": "node-a", "targetNodeId": "node-s1",
        "group": [{"jobId": "default/ch1/0/encode", "migrationId": "0000abce"}]
    });
    let code = migrate_answered("migrate-accepted", Strategy::Overlap, accepted).await;
    assert_eq!(code, ExitCode::SUCCESS);
}

#[tokio::test]
async fn plan_prints_what_the_offline_plan_prints_for_the_same_inputs() {
    let cp = installed().await;
    let ns = cp.namespace("plan").await;
    let pools = repo().join("examples/pools.yaml");
    let bundle = repo().join("examples/bundle-gpu.yaml");
    let fleet = repo().join("examples/fleets/studio.yaml");
    let read = |p: &Path| std::fs::read_to_string(p).expect("example");
    cp.kubectl_apply("default", &read(&pools)).expect("pools apply");
    let bundle_text: String = read(&bundle)
        .lines()
        .filter(|l| !l.trim_start().starts_with("namespace:"))
        .collect::<Vec<_>>()
        .join("\n");
    cp.kubectl_apply(&ns, &bundle_text).expect("bundle applies");
    let bundle_file = std::env::temp_dir().join(format!("norsk-plugin-plan-{ns}.yaml"));
    // The offline plan names the bundle by its namespace too.
    std::fs::write(
        &bundle_file,
        bundle_text.replace("metadata:", &format!("metadata:\n  namespace: {ns}")),
    )
    .expect("write bundle file");
    let offline = offline::plan_output(&offline::Args {
        inputs: offline::Inputs {
            pools,
            hot_spares: None,
            fleet: fleet.clone(),
        },
        bundles: vec![bundle_file.clone()],
        output: Output::Json,
        explain: false,
    })
    .expect("offline plan");
    let _ = std::fs::remove_file(&bundle_file);
    let file = FleetSource::File(fleet.clone());
    let live = plugin::plan::plan(cp.client(), Some(&ns), &file, &[], Output::Json)
        .await
        .expect("live plan")
        .text;
    assert_eq!(live, offline);
    assert!(live.contains(&format!("\"bundle\": \"{ns}/")), "{live}");
    // Nothing placed it yet (no operator runs here): explain says so, then traces it.
    let explained = plugin::plan::explain(cp.client(), &ns, &file, "gpu-transcode", Some("transcode"))
        .await
        .expect("explain")
        .text;
    assert!(explained.contains("no placement recorded yet"), "{explained}");
    assert!(
        explained.contains("transcode") && !explained.contains("thumbnails"),
        "{explained}"
    );
}

#[tokio::test]
async fn explain_shows_the_last_placement_the_status_recorded() {
    let cp = installed().await;
    let ns = cp.namespace("explain").await;
    let bundle = "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: news}\nspec:\n  pool: production\n  jobs:\n    - {jobName: encode, template: encoder, requirements: {requiredCapacity: 2}}\n";
    cp.kubectl_apply(&ns, bundle).expect("bundle applies");
    let bundles: Api<crd::Bundle> = Api::namespaced(cp.client(), &ns);
    let job = json!({
        "jobName": "encode", "jobId": format!("{ns}/news/0/encode"), "node": "node-a",
        "state": "running", "lastPlacement": "tier cluster: node-a, most free capacity",
    });
    bundles
        .patch_status(
            "news",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"replicas": [{"index": 0, "jobs": [job]}]}})),
        )
        .await
        .expect("status patch");
    let fleet = FleetSource::Live(ns.clone());
    let explained = plugin::plan::explain(cp.client(), &ns, &fleet, "news", Some("encode"))
        .await
        .expect("explain")
        .text;
    let row = explained.lines().nth(1).unwrap_or_default();
    for cell in [
        "encode",
        "node-a",
        "running",
        "tier cluster: node-a, most free capacity",
    ] {
        assert!(row.contains(cell), "{cell} missing from {explained}");
    }
    match plugin::plan::explain(cp.client(), &ns, &fleet, "gone", None).await {
        Err(plugin::plan::PlanError::UnknownBundle(name, _)) => assert_eq!(name, "gone"),
        other => panic!("expected UnknownBundle, got {other:?}"),
    }
}

/// A one-job bundle of `production` reserving `vcpus`.
fn sized_bundle(name: &str, vcpus: f64) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n  pool: production\n  jobs:\n    - {{jobName: encode, template: encoder, requirements: {{requiredCapacity: {vcpus}}}}}\n"
    )
}

/// The node the plan's JSON places the first job on.
fn planned_node(plan: &str) -> String {
    let plan: serde_json::Value = serde_json::from_str(plan).expect("plan JSON");
    plan["placements"][0]["nodeId"]
        .as_str()
        .unwrap_or_else(|| panic!("no node in {plan:#}"))
        .to_owned()
}

/// Waits until the NorskNode of `node` lists the reservation of `bundle`'s job.
async fn mirrored_with(cp: &control_plane::ControlPlane, fleet: &str, node: &str, bundle: &str) {
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let job = format!("/{bundle}/0/encode");
    until(
        &nodes,
        &node_resource_name(fleet, node),
        "mirrored with the job's reservation",
        |n: Option<&NorskNode>| {
            n.and_then(|n| n.status.as_ref()?.placement.as_ref())
                .is_some_and(|p| p.jobs.iter().any(|j| j.job_id.0.ends_with(&job)))
        },
    )
    .await;
}

/// Plans `bundle` (already applied) on the live fleet, then waits for the operator to place
/// it: the node the plan chose and the node the operator chose.
async fn planned_and_placed(cp: &control_plane::ControlPlane, ns: &str, bundle: &str) -> (String, String) {
    let live = FleetSource::Live(ns.to_owned());
    let planned = plugin::plan::plan(cp.client(), Some(ns), &live, &[bundle.to_owned()], Output::Json)
        .await
        .expect("plan on the live fleet");
    assert_eq!(planned.warnings, Vec::new());
    let bundles: Api<crd::Bundle> = Api::namespaced(cp.client(), ns);
    let ready = until(&bundles, bundle, "Ready", |b: Option<&crd::Bundle>| is_ready(b)).await;
    let placed = ready.status.and_then(|s| s.primary_node).expect("placed");
    (planned_node(&planned.text), placed)
}

#[tokio::test]
async fn plan_on_the_live_fleet_chooses_the_node_the_operator_places_on() {
    let cp = installed().await;
    let ns = cp.namespace("live-plan").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "live-plan-0").await;
    let bundles: Api<crd::Bundle> = Api::namespaced(cp.client(), &ns);
    // 6 of one cluster server's 8 vCPUs taken.
    cp.kubectl_apply(&ns, &sized_bundle("fill", 6.0))
        .expect("bundle applies");
    let fill = until(&bundles, "fill", "Ready", |b: Option<&crd::Bundle>| is_ready(b)).await;
    let filled = fill.status.and_then(|s| s.primary_node).expect("placed");
    mirrored_with(cp, &ns, &filled, "fill").await;
    // 4 vCPUs no longer fit on the filled server: the plan must see its reservation.
    cp.kubectl_apply(&ns, &sized_bundle("big", 4.0))
        .expect("bundle applies");
    let (planned, placed) = planned_and_placed(cp, &ns, "big").await;
    assert_eq!(planned, placed, "the plan chose what the operator chose");
    assert_ne!(placed, filled, "a server without room for the job is not chosen");
    mirrored_with(cp, &ns, &placed, "big").await;
    // 1 vCPU fits on both: bin-packing ranks them by what is left, as the operator does.
    cp.kubectl_apply(&ns, &sized_bundle("small", 1.0))
        .expect("bundle applies");
    let (planned, placed) = planned_and_placed(cp, &ns, "small").await;
    assert_eq!(planned, placed, "the plan chose what the operator chose");
    assert_eq!(placed, filled, "binpack fills the fuller server");
    // Explain traces the placement against the live fleet too, the bundle's own job aside.
    let live = FleetSource::Live(ns.clone());
    let explained = plugin::plan::explain(cp.client(), &ns, &live, "small", Some("encode"))
        .await
        .expect("explain");
    let again = explained
        .text
        .split_once("Placed again now")
        .map(|(_, trace)| trace.to_owned())
        .unwrap_or_default();
    assert!(
        again.contains(&format!("the live fleet \"{ns}\"")) && again.contains(&filled),
        "{}",
        explained.text
    );
    // Headroom on the live fleet: the loss of the filled server takes exactly the jobs
    // the operator put there, each with its fate, and the exit code says whether it is absorbed.
    mirrored_with(cp, &ns, &filled, "small").await;
    let selection = plugin_headroom_selection(&filled);
    let found = plugin::plan::headroom(cp.client(), &live, &selection, Output::Json, false)
        .await
        .expect("headroom");
    let report: serde_json::Value = serde_json::from_str(&found.planned.text).expect("a JSON report");
    let domain = &report["domains"][0];
    assert_eq!(domain["domain"]["name"], filled.as_str(), "{report:#}");
    let mut lost: Vec<String> = domain["bundles"]
        .as_array()
        .expect("bundles")
        .iter()
        .map(|b| b["bundle"].as_str().unwrap_or_default().to_owned())
        .collect();
    lost.sort();
    assert_eq!(lost, [format!("{ns}/fill"), format!("{ns}/small")], "{report:#}");
    assert_eq!(domain["jobsLost"], 2, "{report:#}");
    assert_eq!(domain["absorbed"].as_bool(), Some(found.absorbed), "{report:#}");
    operator.stop().await;
    sim.shutdown().await;
}

/// `--node NODE`, as `kubectl norsk headroom` reads it.
fn plugin_headroom_selection(node: &str) -> norsk_auto_manager::placement::headroom::Selection {
    norsk_auto_manager::cli::headroom::DomainArgs {
        nodes: vec![node.to_owned()],
        ..Default::default()
    }
    .selection()
}

/// A NorskNode of fleet `fleet` as the operator mirrors it, with `status`.
async fn mirrored_node(cp: &control_plane::ControlPlane, fleet: &str, name: &str, status: Option<NorskNodeStatus>) {
    let nodes: Api<NorskNode> = Api::all(cp.client());
    let mut node = NorskNode::new(
        name,
        NorskNodeSpec {
            node_id: name.to_owned(),
            ..NorskNodeSpec::default()
        },
    );
    node.metadata.labels = Some(
        [
            ("app.kubernetes.io/managed-by", "norsk-auto-manager"),
            ("automanager.norsk.video/fleet", fleet),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect(),
    );
    nodes
        .create(&PostParams::default(), &node)
        .await
        .expect("create NorskNode");
    if let Some(status) = status {
        nodes
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
            .await
            .expect("status patch");
    }
}

/// A running 8-vCPU cluster server of `production`, as its status reads.
fn cluster_server(id: &str, vcpus: f64) -> NorskNodeStatus {
    let node = FleetNode {
        id: NodeId(id.to_owned()),
        pool: Some("production".to_owned()),
        tier: None,
        phase: NodePhase::Running,
        cordoned: false,
        unhealthy: false,
        spare: false,
        spare_spec: Default::default(),
        tags: Default::default(),
        inventory: Some(NodeInventory::local_server("studio", "rack-1", "r640", vcpus)),
        jobs: Vec::new(),
    };
    NorskNodeStatus {
        placement: Some(NodePlacementStatus::of(&node, &Default::default())),
        ..NorskNodeStatus::default()
    }
}

#[tokio::test]
async fn plan_leaves_out_a_norsk_node_whose_status_does_not_convert_and_says_which() {
    let cp = installed().await;
    let ns = cp.namespace("broken-node").await;
    let (good, broken, fresh) = (format!("{ns}-good"), format!("{ns}-broken"), format!("{ns}-fresh"));
    mirrored_node(cp, &ns, &good, Some(cluster_server(&good, 8.0))).await;
    mirrored_node(cp, &ns, &broken, Some(cluster_server(&broken, -8.0))).await;
    mirrored_node(cp, &ns, &fresh, None).await;
    cp.kubectl_apply(&ns, &sized_bundle("news", 2.0))
        .expect("bundle applies");
    let live = FleetSource::Live(ns.clone());
    let planned = plugin::plan::plan(cp.client(), Some(&ns), &live, &[], Output::Json)
        .await
        .expect("the plan runs without the broken nodes");
    assert_eq!(planned_node(&planned.text), good);
    let warnings: Vec<String> = planned.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(warnings.len(), 2, "{warnings:?}");
    assert!(
        warnings.iter().any(|w| w.starts_with(&format!("norsknode/{broken}:"))
            && w.contains("inventory.totalCapacity is -8")
            && w.ends_with("left out of the plan")),
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with(&format!("norsknode/{fresh}:")) && w.contains("no status.placement")),
        "{warnings:?}"
    );
    // A fleet name nothing mirrors is said to be empty.
    let elsewhere = FleetSource::Live(format!("{ns}-elsewhere"));
    let empty = plugin::plan::plan(cp.client(), Some(&ns), &elsewhere, &[], Output::Json)
        .await
        .expect("plan");
    assert!(
        matches!(&empty.warnings[..], [PlanWarning::NoNodes { fleet }] if fleet == &format!("{ns}-elsewhere")),
        "{:?}",
        empty.warnings
    );
}

/// The `start` / `stop` command for `show`'s manual job `record`.
fn start_stop(start: bool, job: &str, replica: Option<u32>) -> Command {
    let job = ManualJobArgs {
        bundle: "show".to_owned(),
        job: job.to_owned(),
        replica,
        no_wait: false,
    };
    if start { Command::Start(job) } else { Command::Stop(job) }
}

#[tokio::test]
async fn start_and_stop_change_the_bundle_and_wait_for_the_operator_to_act() {
    let cp = installed().await;
    let ns = cp.namespace("start-stop").await;
    let sim = simulator(&ns).await;
    let operator = Operator::start(cp, &ns, &sim, "start-stop-0").await;
    let bundles: Api<crd::Bundle> = Api::namespaced(cp.client(), &ns);
    let record = format!("{ns}/show/0/record");
    cp.kubectl_apply(&ns, &manual_bundle("show", &[]))
        .expect("bundle applies");
    until(&bundles, "show", "Ready", |b: Option<&crd::Bundle>| is_ready(b)).await;

    let started = tokio::time::timeout(WAIT, plugin::run(cp.client(), &ns, start_stop(true, "record", None)))
        .await
        .expect("start returns once the operator started the job")
        .expect("start");
    assert_eq!(started, ExitCode::SUCCESS);
    let bundle = bundles.get("show").await.expect("bundle");
    assert_eq!(
        bundle.spec.0.jobs[1].started_replicas,
        [0],
        "the desired state is in the spec"
    );
    let (state, _) = primary_job(Some(&bundle), "record").expect("record in status");
    assert_ne!(state, JobPhase::Dormant, "start returned before the operator acted");
    until(&bundles, "show", "record running", |b: Option<&crd::Bundle>| {
        primary_job(b, "record").is_some_and(|(s, _)| s == JobPhase::Running)
    })
    .await;
    assert_eq!(instances_of(&sim, &record).await.len(), 1);

    let stopped = tokio::time::timeout(
        WAIT,
        plugin::run(cp.client(), &ns, start_stop(false, "record", Some(0))),
    )
    .await
    .expect("stop returns once the operator stopped the job")
    .expect("stop");
    assert_eq!(stopped, ExitCode::SUCCESS);
    let bundle = bundles.get("show").await.expect("bundle");
    assert!(bundle.spec.0.jobs[1].started_replicas.is_empty());
    assert_eq!(
        primary_job(Some(&bundle), "record"),
        Some((JobPhase::Dormant, None)),
        "stop returned before the job was off its node"
    );
    operator.stop().await;
    sim.shutdown().await;
}

#[tokio::test]
async fn start_of_an_auto_job_or_a_missing_replica_says_so_and_changes_nothing() {
    let cp = installed().await;
    let ns = cp.namespace("start-refused").await;
    cp.kubectl_apply(&ns, &manual_bundle("show", &[]))
        .expect("bundle applies");
    let bundles: Api<crd::Bundle> = Api::namespaced(cp.client(), &ns);
    let before = bundles.get("show").await.expect("bundle").metadata.resource_version;
    match plugin::run(cp.client(), &ns, start_stop(true, "encode", None)).await {
        Err(e @ PluginError::NotManualJob { .. }) => assert!(e.to_string().contains("startMode auto"), "{e}"),
        other => panic!("expected NotManualJob, got {other:?}"),
    }
    match plugin::run(cp.client(), &ns, start_stop(true, "record", Some(1))).await {
        Err(e @ PluginError::UnknownReplica { .. }) => assert!(e.to_string().contains("no backup"), "{e}"),
        other => panic!("expected UnknownReplica, got {other:?}"),
    }
    match plugin::run(cp.client(), &ns, start_stop(false, "mux", None)).await {
        Err(PluginError::UnknownJob { job, .. }) => assert_eq!(job, "mux"),
        other => panic!("expected UnknownJob, got {other:?}"),
    }
    let after = bundles.get("show").await.expect("bundle").metadata.resource_version;
    assert_eq!(before, after, "a refused command wrote to the Bundle");
}

/// A kubeconfig whose current context points nowhere and whose context `real` (namespace
/// `namespace`) is the test cluster: a command reaches the cluster only through `--context`.
fn two_context_kubeconfig(cp: &control_plane::ControlPlane, dir: &Path, namespace: &str) -> PathBuf {
    let mut config: yaml_serde::Value =
        yaml_serde::from_str(&std::fs::read_to_string(cp.kubeconfig()).unwrap()).unwrap();
    let real = yaml_serde::from_str::<yaml_serde::Value>(&format!(
        "name: real\ncontext: {{cluster: norsk-test, user: admin, namespace: {namespace}}}"
    ))
    .unwrap();
    let broken =
        yaml_serde::from_str::<yaml_serde::Value>("name: broken\ncontext: {cluster: nowhere, user: admin}").unwrap();
    config["contexts"] = yaml_serde::Value::Sequence(vec![real, broken]);
    let nowhere =
        yaml_serde::from_str::<yaml_serde::Value>("name: nowhere\ncluster: {server: 'https://127.0.0.1:1'}").unwrap();
    config["clusters"].as_sequence_mut().unwrap().push(nowhere);
    config["current-context"] = "broken".into();
    let path = dir.join("kubeconfig");
    std::fs::write(&path, yaml_serde::to_string(&config).unwrap()).unwrap();
    path
}

/// `kubectl norsk ARGS` through kubectl itself, the plugin found on `PATH`, with no
/// `KUBECONFIG` and an empty home: only the flags say which cluster.
fn kubectl_norsk(cp: &control_plane::ControlPlane, home: &Path, args: &[&str]) -> std::process::Output {
    let plugin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-norsk"))
        .parent()
        .unwrap()
        .to_owned();
    let path = std::env::join_paths(
        std::iter::once(plugin_dir).chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )
    .unwrap();
    std::process::Command::new(cp.bin("kubectl"))
        .arg("norsk")
        .args(args)
        .env_remove("KUBECONFIG")
        .env("HOME", home)
        .env("PATH", path)
        .output()
        .expect("kubectl runs")
}

#[tokio::test]
async fn the_plugin_takes_kubectls_connection_flags_and_lists_every_namespace_with_where_jobs_run() {
    let cp = installed().await;
    let (first, second) = (cp.namespace("flags-a").await, cp.namespace("flags-b").await);
    // Node `a` runs first's `news` today; `b` is empty.
    let (a, b) = (format!("{first}-a"), format!("{first}-b"));
    let mut busy = cluster_server(&a, 8.0);
    let running: serde_json::Value = json!({
        "jobId": format!("{first}/news/0/encode"), "bundle": format!("{first}/news"), "replicaIndex": 0,
        "jobName": "encode", "template": "", "requiredCapacity": 2.0,
    });
    let mut placement = serde_json::to_value(busy.placement.take().unwrap()).unwrap();
    placement["jobs"] = json!([running]);
    busy.placement = Some(serde_json::from_value(placement).expect("a placement with a job"));
    mirrored_node(cp, &first, &a, Some(busy)).await;
    mirrored_node(cp, &first, &b, Some(cluster_server(&b, 8.0))).await;
    cp.kubectl_apply(&first, &sized_bundle("news", 2.0))
        .expect("bundle applies");
    cp.kubectl_apply(&second, &sized_bundle("sport", 2.0))
        .expect("bundle applies");
    let home = tempfile::tempdir().unwrap();
    let kubeconfig = two_context_kubeconfig(cp, home.path(), &first);
    let kubeconfig = kubeconfig.to_str().unwrap();
    let fleet = format!("--fleet-name={first}");

    // Without --context, the kubeconfig's current context is the one that points nowhere.
    let unreachable = kubectl_norsk(cp, home.path(), &["--kubeconfig", kubeconfig, "plan", &fleet]);
    assert!(
        !unreachable.status.success(),
        "planned against a cluster that does not exist"
    );

    // The context's namespace, and where its job runs now.
    let wide = kubectl_norsk(
        cp,
        home.path(),
        &[
            "--kubeconfig",
            kubeconfig,
            "--context",
            "real",
            "plan",
            "-o",
            "wide",
            &fleet,
        ],
    );
    let stdout = String::from_utf8_lossy(&wide.stdout);
    assert!(
        wide.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&wide.stderr)
    );
    let header: Vec<&str> = stdout.lines().next().unwrap().split_whitespace().collect();
    assert!(header.ends_with(&["CURRENT", "MOVE"]), "{stdout}");
    let row = stdout
        .lines()
        .find(|l| l.contains(&format!("{first}/news")))
        .unwrap_or_else(|| panic!("no row of {first}/news:\n{stdout}"));
    let cells: Vec<&str> = row.split_whitespace().collect();
    let (planned, current, moves) = (cells[4], cells[cells.len() - 2], cells[cells.len() - 1]);
    assert_eq!(current, a, "{stdout}");
    assert_eq!(moves, if planned == a { "no" } else { "yes" }, "{stdout}");
    assert!(!stdout.contains("sport"), "only the context's namespace:\n{stdout}");

    // -A: every namespace's bundles; YAML as asked.
    let all = kubectl_norsk(
        cp,
        home.path(),
        &[
            "--kubeconfig",
            kubeconfig,
            "--context=real",
            "-A",
            "plan",
            "-o",
            "yaml",
            &fleet,
        ],
    );
    let stdout = String::from_utf8_lossy(&all.stdout);
    assert!(all.status.success(), "{stdout}{}", String::from_utf8_lossy(&all.stderr));
    let document: yaml_serde::Value = yaml_serde::from_str(&stdout).expect("plan -o yaml is YAML");
    let bundles: Vec<&str> = document["placements"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|p| p["bundle"].as_str())
        .collect();
    assert!(
        bundles.contains(&format!("{first}/news").as_str()) && bundles.contains(&format!("{second}/sport").as_str()),
        "{bundles:?}"
    );

    // -A means nothing to a command on one resource: refused, naming why.
    let refused = kubectl_norsk(
        cp,
        home.path(),
        &["--kubeconfig", kubeconfig, "--context", "real", "-A", "explain", "news"],
    );
    assert!(!refused.status.success());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("--all-namespaces applies to plan only"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
}

#[test]
fn both_binaries_print_completion_scripts_their_shells_accept() {
    for (binary, subcommand) in [
        (env!("CARGO_BIN_EXE_kubectl-norsk"), "drain"),
        (env!("CARGO_BIN_EXE_norsk-auto-manager"), "standalone"),
    ] {
        for shell in ["bash", "zsh", "fish"] {
            let out = std::process::Command::new(binary)
                .args(["completion", shell])
                .output()
                .expect("the binary runs");
            let script = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "{binary} completion {shell}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(
                script.contains(subcommand),
                "{binary} completion {shell} misses {subcommand}"
            );
        }
        // bash parses the script and registers the completion.
        let check = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "source <('{binary}' completion bash) && complete -p {}",
                Path::new(binary).file_name().unwrap().to_string_lossy()
            ))
            .output()
            .expect("bash runs");
        assert!(check.status.success(), "{}", String::from_utf8_lossy(&check.stderr));
    }
}
