//! `norsk-auto-manager plan` on the files in `examples/`: through the
//! library function the command uses, and through the built binary (exit
//! codes, the documented JSON, errors naming file, document, field and
//! line; input decoded as strictly as the API server admits it).

use std::path::{Path, PathBuf};
use std::process::Command;

use norsk_auto_manager::cli::plan::{Args, Inputs, Output, PlanCommandError, plan_output};
use serde_json::Value;

fn example(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples").join(name)
}

fn args(bundles: &[&str], output: Output) -> Args {
    Args {
        inputs: Inputs {
            pools: example("pools.yaml"),
            hot_spares: Some(example("hot-spares.yaml")),
            fleet: example("fleets/studio.yaml"),
        },
        bundles: bundles.iter().map(|b| example(b)).collect(),
        output,
        explain: false,
    }
}

fn placements(json: &str) -> Vec<Value> {
    let plan: Value = serde_json::from_str(json).expect("plan prints JSON");
    plan["placements"].as_array().expect("placements array").clone()
}

fn summary(p: &Value) -> (String, u64, String, String, String) {
    let s = |k: &str| p[k].as_str().unwrap_or("-").to_owned();
    (
        s("bundle"),
        p["replicaIndex"].as_u64().unwrap(),
        s("jobName"),
        s("outcome"),
        s("nodeId"),
    )
}

#[test]
fn plan_places_the_example_bundles_in_file_order() {
    let json = plan_output(&args(&["bundle-channel.yaml", "bundle-gpu.yaml"], Output::Json)).unwrap();
    let rows: Vec<_> = placements(&json).iter().map(summary).collect();
    let expected = [
        ("default/ch1", 0, "encode", "placed", "node-b"),
        ("default/ch1", 0, "package", "placed", "node-b"),
        ("default/ch1", 1, "encode", "placed", "oci-1"),
        ("default/ch1", 1, "package", "placed", "oci-1"),
        ("default/ch2", 0, "encode", "provision", "production-reserved-1"),
        (
            "studio/gpu-transcode",
            0,
            "transcode",
            "provision",
            "production-on-demand-1",
        ),
        (
            "studio/gpu-transcode",
            0,
            "thumbnails",
            "provision",
            "production-reserved-2",
        ),
    ];
    let expected: Vec<_> = expected
        .iter()
        .map(|(b, r, j, o, n)| (b.to_string(), *r, j.to_string(), o.to_string(), n.to_string()))
        .collect();
    assert_eq!(rows, expected);
}

#[test]
fn plan_json_has_exactly_the_documented_fields() {
    let json = plan_output(&args(&["bundle-gpu.yaml"], Output::Json)).unwrap();
    let first = &placements(&json)[0];
    let mut keys: Vec<&str> = first.as_object().unwrap().keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        vec![
            "bundle",
            "errors",
            "gpuIndex",
            "instanceType",
            "jobName",
            "nodeId",
            "outcome",
            "pool",
            "replicaIndex",
            "resilienceViolations",
            "tier",
            "trace"
        ]
    );
    assert_eq!(first["instanceType"], "g4dn.xlarge");
    assert_eq!(first["gpuIndex"], 0);
    assert_eq!(first["trace"], serde_json::json!({}));
}

#[test]
fn plan_table_explains_every_node_with_its_reason() {
    let mut args = args(&["bundle-channel.yaml"], Output::Table);
    args.explain = true;
    let table = plan_output(&args).unwrap();
    assert!(
        table.contains("cluster-1  rejected: capacity  needs 3 vCPU, 1 free"),
        "{table}"
    );
    assert!(table.contains("cluster-2  rejected: cordoned"), "{table}");
    assert!(table.contains("=> placed on node-b"), "{table}");
}

#[test]
fn an_invalid_bundle_is_reported_with_its_codes_and_the_plan_goes_on() {
    let dir = std::env::temp_dir().join(format!("plan-invalid-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: bad}\nspec:\n  pool: nowhere\n  jobs: [{jobName: j}]\n",
    )
    .unwrap();
    let mut args = args(&["bundle-gpu.yaml"], Output::Json);
    args.bundles.insert(0, file);
    let rows = placements(&plan_output(&args).unwrap());
    assert_eq!(rows[0]["outcome"], "invalid");
    assert_eq!(rows[0]["errors"][0]["code"], "unknownPool");
    assert_eq!(rows[1]["outcome"], "provision");
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn unreadable_input_names_the_file_the_document_and_the_field() {
    let dir = std::env::temp_dir().join(format!("plan-unreadable-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("broken.yaml");
    std::fs::write(
        &file,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: ok}\nspec: {pool: production, jobs: []}\n---\napiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: broken}\nspec:\n  pool: production\n  jobs:\n    - jobName: j\n      requirements: {requiredCapacity: lots}\n",
    )
    .unwrap();
    let mut args = args(&[], Output::Json);
    args.bundles.push(file.clone());
    let error = plan_output(&args).unwrap_err();
    assert!(matches!(error, PlanCommandError::Input(_)));
    let message = error.to_string();
    assert!(message.contains("broken.yaml"), "{message}");
    assert!(message.contains("document 2"), "{message}");
    assert!(
        message.contains("spec.jobs[0].requirements.requiredCapacity"),
        "{message}"
    );
    std::fs::remove_dir_all(dir).ok();
}

#[test]
fn the_binary_prints_the_plan_and_exits_zero() {
    let output = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .arg("plan")
        .arg("--pools")
        .arg(example("pools.yaml"))
        .arg("--hot-spares")
        .arg(example("hot-spares.yaml"))
        .arg("--fleet")
        .arg(example("fleets/studio.yaml"))
        .arg(example("bundle-channel.yaml"))
        .args(["--output", "json"])
        .output()
        .unwrap();
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let rows = placements(&String::from_utf8(output.stdout).unwrap());
    assert_eq!(rows.len(), 5);
}

#[test]
fn the_binary_exits_two_on_a_document_of_the_wrong_kind() {
    let output = Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .arg("plan")
        .arg("--pools")
        .arg(example("bundle-gpu.yaml"))
        .arg("--fleet")
        .arg(example("fleets/studio.yaml"))
        .arg(example("bundle-channel.yaml"))
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bundle-gpu.yaml: document 1 (Bundle studio/gpu-transcode): kind: expected PlacementPool"),
        "{stderr}"
    );
}

fn plan_binary(bundle: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_norsk-auto-manager"))
        .arg("plan")
        .arg("--pools")
        .arg(example("pools.yaml"))
        .arg("--fleet")
        .arg(example("fleets/studio.yaml"))
        .arg(bundle)
        .args(["--output", "json"])
        .output()
        .unwrap()
}

#[test]
fn plan_exits_non_zero_naming_the_invalid_bundle_its_file_field_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.yaml");
    std::fs::write(
        &file,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: bad}\nspec:\n  pool: nowhere\n  jobs: [{jobName: j}]\n",
    )
    .unwrap();
    let output = plan_binary(&file);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.yaml: document 1 (Bundle default/bad): invalid: spec.pool:"),
        "{stderr}"
    );
    assert!(stderr.contains("at line 5 column 3"), "{stderr}");
    // The plan is still printed: the invalid rows say what was refused.
    let rows = placements(&String::from_utf8(output.stdout).unwrap());
    assert_eq!(rows[0]["outcome"], "invalid");
}

#[test]
fn plan_refuses_a_misspelt_field_instead_of_planning_with_the_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("typo.yaml");
    std::fs::write(
        &file,
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {name: typo}\nspec:\n  pool: production\n  jobs:\n    - jobName: encode\n      requirements:\n        requiredCapcity: 2\n",
    )
    .unwrap();
    let output = plan_binary(&file);
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "typo.yaml: document 1 (Bundle default/typo): spec.jobs[0].requirements.requiredCapcity: unknown field"
        ),
        "{stderr}"
    );
    assert!(stderr.contains("at line 9 column 9"), "{stderr}");
    assert!(output.stdout.is_empty(), "nothing is planned from refused input");
}
