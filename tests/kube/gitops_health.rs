//! GitOps health: the Argo CD health check of every kind answers its test data, and a kstatus
//! reader (cli-utils rules) sees Ready / InProgress / Failed from the conditions the operator
//! writes — built here with the operator's own condition types and merge.

mod argocd;
mod kstatus;

use std::collections::BTreeSet;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kstatus::Status;
use norsk_auto_manager::crd;
use norsk_auto_manager::decide::bundle_status::{BROKEN, DEGRADED, PLACED};
use norsk_auto_manager::decide::conditions::{Observed, READY, STALLED, merge};
use norsk_auto_manager::decide::node::CORDONED;
use serde_json::{Value, json};

fn kind_dirs() -> Vec<std::path::PathBuf> {
    let mut dirs: Vec<_> = std::fs::read_dir(argocd::customizations_dir())
        .expect("resource customizations directory")
        .map(|entry| entry.expect("directory entry").path())
        .filter(|path| path.is_dir())
        .collect();
    dirs.sort();
    dirs
}

#[test]
fn every_kind_has_an_argocd_health_check() {
    let kinds: BTreeSet<String> = crd::definitions().into_iter().map(|d| d.spec.names.kind).collect();
    let checked: BTreeSet<String> = kind_dirs()
        .iter()
        .filter(|dir| dir.join("health.lua").is_file() && dir.join("health_test.yaml").is_file())
        .filter_map(|dir| dir.file_name().map(|n| n.to_string_lossy().into_owned()))
        .collect();
    assert_eq!(kinds, checked);
}

#[test]
fn argocd_health_checks_answer_their_test_data() {
    let mut ran = 0;
    for dir in kind_dirs() {
        for case in argocd::cases(&dir) {
            let object = argocd::read_object(&dir.join(&case.input_path));
            let health = argocd::run(&dir, &object);
            assert_eq!(health, case.health_status, "{}/{}", dir.display(), case.input_path);
            ran += 1;
        }
    }
    assert!(ran >= 6 * 4, "only {ran} cases ran");
}

/// Argo CD's verdict as kstatus would put it: a cordoned node is settled (Suspended), a
/// degraded bundle (running without its resilience) is Current for kstatus, which reads
/// only Ready and Stalled.
fn as_kstatus(kind: &str, object: &Value, health: &str) -> Status {
    match health {
        "Healthy" | "Suspended" => Status::Current,
        "Degraded" if kind == "Bundle" && !holds(object, "Stalled") => {
            if holds(object, "Ready") {
                Status::Current
            } else {
                Status::InProgress
            }
        }
        "Degraded" if kind == "NorskNode" => Status::InProgress,
        "Degraded" => Status::Failed,
        _ => Status::InProgress,
    }
}

fn holds(object: &Value, type_: &str) -> bool {
    object["status"]["conditions"]
        .as_array()
        .is_some_and(|cs| cs.iter().any(|c| c["type"] == type_ && c["status"] == "True"))
}

#[test]
fn kstatus_and_argocd_agree_on_every_test_case() {
    for dir in kind_dirs() {
        let kind = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        for case in argocd::cases(&dir) {
            let object = argocd::read_object(&dir.join(&case.input_path));
            assert_eq!(
                kstatus::compute(&object),
                as_kstatus(&kind, &object, &case.health_status.status),
                "{kind}/{}",
                case.input_path
            );
        }
    }
}

/// A resource of `kind` at `generation` whose status the operator wrote for
/// `observed_generation` with `conditions`.
fn resource(kind: &str, generation: i64, observed_generation: i64, observed: Vec<Observed>) -> Value {
    let conditions: Vec<Condition> = merge(&[], observed, Some(observed_generation));
    json!({
        "apiVersion": crd::API_VERSION,
        "kind": kind,
        "metadata": {"name": "r", "generation": generation},
        "status": {"observedGeneration": observed_generation, "conditions": conditions},
    })
}

/// Both readers on one resource: kstatus and the kind's Argo CD check.
fn read(kind: &str, object: &Value) -> (Status, String) {
    let health = argocd::run(&argocd::customizations_dir().join(kind), object);
    (kstatus::compute(object), health.status)
}

#[test]
fn running_bundle_reads_ready() {
    let object = resource(
        "Bundle",
        1,
        1,
        vec![
            Observed::yes(READY, "Running", "4 of 4 jobs running"),
            Observed::yes(PLACED, "Placed", "4 of 4 jobs placed"),
            Observed::no(DEGRADED, "ResilienceHonoured", ""),
            Observed::no(BROKEN, "NotBroken", ""),
        ],
    );
    assert_eq!(read("Bundle", &object), (Status::Current, "Healthy".to_owned()));
}

#[test]
fn placing_bundle_reads_in_progress() {
    let object = resource(
        "Bundle",
        1,
        1,
        vec![
            Observed::no(READY, "Placing", "1 of 4 jobs placed"),
            Observed::no(PLACED, "Pending", "1 of 4 jobs placed"),
        ],
    );
    assert_eq!(read("Bundle", &object), (Status::InProgress, "Progressing".to_owned()));
}

#[test]
fn refused_bundle_reads_failed() {
    let object = resource(
        "Bundle",
        2,
        2,
        vec![
            Observed::no(READY, "InvalidBundle", "jobs[0].name: empty"),
            Observed::yes(STALLED, "InvalidBundle", "jobs[0].name: empty"),
        ],
    );
    assert_eq!(read("Bundle", &object), (Status::Failed, "Degraded".to_owned()));
}

#[test]
fn invalid_pool_reads_failed_and_valid_pool_ready() {
    let invalid = resource(
        "PlacementPool",
        1,
        1,
        vec![
            Observed::no(READY, "InvalidPool", "tier gpu: unknown capability"),
            Observed::yes(STALLED, "InvalidPool", "tier gpu: unknown capability"),
        ],
    );
    assert_eq!(read("PlacementPool", &invalid), (Status::Failed, "Degraded".to_owned()));
    let valid = resource(
        "PlacementPool",
        1,
        1,
        vec![
            Observed::yes(READY, "InForce", "the core places with this pool"),
            Observed::no(STALLED, "InForce", ""),
        ],
    );
    assert_eq!(read("PlacementPool", &valid), (Status::Current, "Healthy".to_owned()));
}

#[test]
fn status_of_an_older_generation_reads_in_progress() {
    // Ready for generation 1, but the spec is at 2: nothing has settled yet.
    let object = resource(
        "HotSparePolicy",
        2,
        1,
        vec![Observed::yes(READY, "Valid", "pool edge is in force")],
    );
    assert_eq!(
        read("HotSparePolicy", &object),
        (Status::InProgress, "Progressing".to_owned())
    );
}

#[test]
fn cordoned_running_node_reads_ready_and_suspended() {
    let object = resource(
        "NorskNode",
        2,
        2,
        vec![
            Observed::yes(READY, "Running", ""),
            Observed::yes(CORDONED, "Cordoned", "cordoned by spec.cordoned"),
        ],
    );
    assert_eq!(read("NorskNode", &object), (Status::Current, "Suspended".to_owned()));
}

#[test]
fn resource_without_status_reads_in_progress() {
    let object =
        json!({"apiVersion": crd::API_VERSION, "kind": "JobMigration", "metadata": {"name": "m", "generation": 1}});
    assert_eq!(
        read("JobMigration", &object),
        (Status::InProgress, "Progressing".to_owned())
    );
}

#[test]
fn deleted_resource_reads_terminating() {
    let mut object = resource("NodeDrain", 1, 1, vec![Observed::yes(READY, "Done", "node terminated")]);
    object["metadata"]["deletionTimestamp"] = json!("2026-11-29T10:00:00Z");
    assert_eq!(kstatus::compute(&object), Status::Terminating);
}
