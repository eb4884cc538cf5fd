//! The custom resource definitions: `crds/` is exactly what the Rust types
//! generate, the real API server accepts them and every document in
//! `examples/`, and it refuses each shape error with the CEL rule's message
//! (one test per rule).

use std::path::Path;

use norsk_auto_manager::cli::crds::render;
use norsk_auto_manager::crd;

use crate::control_plane;

#[test]
fn crds_directory_matches_the_generated_definitions() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("crds");
    for definition in crd::definitions() {
        let path = dir.join(crd::file_name(&definition));
        let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
        assert_eq!(
            on_disk,
            render(&definition).unwrap(),
            "{} is out of date: run `cargo run -- crds --dir crds`",
            path.display()
        );
    }
    let files = std::fs::read_dir(&dir).unwrap().count();
    assert_eq!(files, crd::definitions().len(), "crds/ holds a file no type generates");
}

/// The control plane with the definitions installed and served.
async fn installed() -> &'static control_plane::ControlPlane {
    let cp = control_plane::shared().await;
    cp.install_definitions().await;
    cp
}

/// Applies a manifest and returns the API server's refusal.
async fn refused(manifest: &str) -> String {
    let cp = installed().await;
    let ns = cp.namespace("crd").await;
    match cp.kubectl_apply(&ns, manifest) {
        Ok(out) => panic!("the API server accepted an invalid object: {out}"),
        Err(message) => message,
    }
}

fn bundle(name: &str, spec: &str) -> String {
    format!("apiVersion: automanager.norsk.video/v1alpha1\nkind: Bundle\nmetadata: {{name: {name}}}\nspec:\n{spec}")
}

#[tokio::test]
async fn the_examples_apply_cleanly() {
    let cp = installed().await;
    let examples = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    // As on a fresh cluster: the examples create the namespace they use.
    let out = cp
        .kubectl()
        .args(["apply", "-f"])
        .arg(&examples)
        .output()
        .expect("run kubectl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kubectl apply -f examples/ failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("placementpool.automanager.norsk.video/production"),
        "{stdout}"
    );
    assert!(
        stdout.contains("hotsparepolicy.automanager.norsk.video/production"),
        "{stdout}"
    );
    assert!(stdout.contains("bundle.automanager.norsk.video/"), "{stdout}");
    assert!(stdout.contains("namespace/studio"), "{stdout}");
}

#[tokio::test]
async fn duplicate_job_names_are_refused() {
    let msg = refused(&bundle(
        "dup",
        "  pool: p\n  jobs: [{jobName: encode}, {jobName: encode}]\n",
    ))
    .await;
    assert!(msg.contains("job names must be unique within a bundle"), "{msg}");
}

#[tokio::test]
async fn co_locate_with_must_name_a_job_of_the_bundle() {
    let msg = refused(&bundle(
        "coloc",
        "  pool: p\n  jobs: [{jobName: encode, coLocateWith: [ghost]}]\n",
    ))
    .await;
    assert!(
        msg.contains("coLocateWith must name other jobs of this bundle"),
        "{msg}"
    );
    assert!(
        msg.contains("spec.jobs: Invalid value"),
        "the message names the field: {msg}"
    );
}

#[tokio::test]
async fn separate_from_must_name_a_job_of_the_bundle() {
    let msg = refused(&bundle(
        "sep",
        "  pool: p\n  jobs: [{jobName: encode, separateFrom: [encode]}]\n",
    ))
    .await;
    assert!(
        msg.contains("separateFrom must name other jobs of this bundle"),
        "{msg}"
    );
}

#[tokio::test]
async fn co_locating_and_separating_the_same_job_is_refused() {
    let spec = "  pool: p\n  jobs:\n  - {jobName: a, coLocateWith: [b], separateFrom: [b]}\n  - {jobName: b}\n";
    let msg = refused(&bundle("contra", spec)).await;
    assert!(
        msg.contains("cannot both co-locate with and separate from the same job"),
        "{msg}"
    );
}

#[tokio::test]
async fn single_use_requires_exclusive() {
    let msg = refused(&bundle(
        "single",
        "  pool: p\n  jobs: [{jobName: encode, singleUse: true}]\n",
    ))
    .await;
    assert!(msg.contains("singleUse requires exclusive: true"), "{msg}");
}

#[tokio::test]
async fn backup_overrides_must_name_jobs_of_the_bundle() {
    let spec = "  pool: p\n  jobs: [{jobName: encode}]\n  backupParameterOverrides: {ghost: {bitrate: '1'}}\n";
    let msg = refused(&bundle("overrides", spec)).await;
    assert!(
        msg.contains("backupParameterOverrides must be keyed by job names of this bundle"),
        "{msg}"
    );
}

#[tokio::test]
async fn capacities_and_ports_out_of_range_are_refused_naming_the_field() {
    for (requirements, field) in [
        ("{requiredCapacity: -2}", "spec.jobs[0].requirements.requiredCapacity"),
        (
            "{requiredGpuCapacity: -0.5}",
            "spec.jobs[0].requirements.requiredGpuCapacity",
        ),
        (
            "{requiredHostPorts: ['70000/tcp']}",
            "spec.jobs[0].requirements.requiredHostPorts[0]",
        ),
        (
            "{requiredHostPorts: ['0/udp']}",
            "spec.jobs[0].requirements.requiredHostPorts[0]",
        ),
    ] {
        let spec = format!("  pool: p\n  jobs: [{{jobName: encode, requirements: {requirements}}}]\n");
        let msg = refused(&bundle("range", &spec)).await;
        assert!(msg.contains(field), "{requirements}: {msg}");
    }
    let shape = "{instanceType: m5.xlarge, totalCapacity: -4, totalCores: 4}";
    let msg = refused(&pool(&format!(
        "  - {{name: cloud, kind: aws, candidateInstanceTypes: [{shape}]}}\n"
    )))
    .await;
    assert!(
        msg.contains("spec.tiers[0].candidateInstanceTypes[0].totalCapacity"),
        "{msg}"
    );
}

#[tokio::test]
async fn an_elastic_tier_needs_an_instance_type_to_provision() {
    let msg = refused(&pool("  - {name: cloud, kind: aws, region: eu-west-1}\n")).await;
    assert!(
        msg.contains("tier cloud is elastic (scaleOut: elastic, the default) but lists no candidateInstanceTypes"),
        "{msg}"
    );
    assert!(msg.contains("spec.tiers[0].candidateInstanceTypes"), "{msg}");
}

#[tokio::test]
async fn host_ports_must_be_port_slash_protocol() {
    let spec = "  pool: p\n  jobs: [{jobName: encode, requirements: {requiredHostPorts: ['1935']}}]\n";
    let msg = refused(&bundle("ports", spec)).await;
    assert!(msg.contains("requiredHostPorts"), "{msg}");
}

#[tokio::test]
async fn enums_are_refused_with_their_allowed_values() {
    let spec = "  pool: p\n  onLaunch: sometimes\n  jobs: [{jobName: encode}]\n";
    let msg = refused(&bundle("enum", spec)).await;
    assert!(msg.contains("Unsupported value: \"sometimes\""), "{msg}");
}

fn pool(tiers: &str) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: PlacementPool\nmetadata: {{name: bad-pool}}\nspec:\n  tiers:\n{tiers}"
    )
}

#[tokio::test]
async fn tier_names_must_be_unique() {
    let msg = refused(&pool("  - {name: a, kind: aws}\n  - {name: a, kind: oci}\n")).await;
    assert!(msg.contains("tier names must be unique within a pool"), "{msg}");
}

#[tokio::test]
async fn a_pool_has_at_most_one_fixed_tier() {
    let tiers =
        "  - {name: a, kind: local-servers, scaleOut: fixed}\n  - {name: b, kind: local-servers, scaleOut: fixed}\n";
    let msg = refused(&pool(tiers)).await;
    assert!(msg.contains("at most one fixed tier"), "{msg}");
}

#[tokio::test]
async fn a_hot_spare_policy_is_named_after_its_pool() {
    let manifest = "apiVersion: automanager.norsk.video/v1alpha1\nkind: HotSparePolicy\nmetadata: {name: spares}\n\
                    spec: {pool: production, targetCount: 1, spec: {instanceType: m5.xlarge}}\n";
    let msg = refused(manifest).await;
    assert!(msg.contains("metadata.name must equal spec.pool"), "{msg}");
}

/// Applies `first`, then refuses `second` (a change of the same object) and
/// returns the API server's message.
async fn refused_change(first: &str, second: &str) -> String {
    let cp = installed().await;
    let ns = cp.namespace("crd").await;
    cp.kubectl_apply(&ns, first).expect("the first version is accepted");
    match cp.kubectl_apply(&ns, second) {
        Ok(out) => panic!("the API server accepted an invalid change: {out}"),
        Err(message) => message,
    }
}

#[tokio::test]
async fn a_norsk_node_keeps_the_node_id_it_mirrors() {
    let node = |id: &str| {
        format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: NorskNode\nmetadata: {{name: mirror-1}}\nspec: {{nodeId: {id}}}\n"
        )
    };
    let msg = refused_change(&node("node-a"), &node("node-b")).await;
    assert!(
        msg.contains("nodeId is the Manager node this resource mirrors"),
        "{msg}"
    );
}

#[tokio::test]
async fn a_node_drain_keeps_its_node() {
    let drain = |id: &str| {
        format!(
            "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {{name: drain-1}}\nspec: {{nodeId: {id}}}\n"
        )
    };
    let msg = refused_change(&drain("node-a"), &drain("node-b")).await;
    assert!(msg.contains("nodeId cannot change"), "{msg}");
}

fn migration(job: &str, abort: bool) -> String {
    format!(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: JobMigration\nmetadata: {{name: move-1}}\n\
         spec: {{bundle: ch1, jobName: {job}, abort: {abort}}}\n"
    )
}

#[tokio::test]
async fn a_job_migration_keeps_its_job() {
    let msg = refused_change(&migration("encode", false), &migration("package", false)).await;
    assert!(msg.contains("a migration's job and strategy cannot change"), "{msg}");
}

#[tokio::test]
async fn an_aborted_job_migration_stays_aborted() {
    let msg = refused_change(&migration("encode", true), &migration("encode", false)).await;
    assert!(msg.contains("an aborted migration cannot be resumed"), "{msg}");
}

#[tokio::test]
async fn a_drain_strategy_is_one_the_saga_knows() {
    let msg = refused(
        "apiVersion: automanager.norsk.video/v1alpha1\nkind: NodeDrain\nmetadata: {name: drain-2}\nspec: {nodeId: n, strategy: teleport}\n",
    )
    .await;
    assert!(msg.contains("Unsupported value: \"teleport\""), "{msg}");
}

#[tokio::test]
async fn a_schedule_must_end_after_it_starts() {
    let spec = "  pool: p\n  schedule: {start: '2026-12-05T19:00:00Z', end: '2026-12-05T20:00:00+01:00'}\n  jobs: [{jobName: encode}]\n";
    let msg = refused(&bundle("ends-early", spec)).await;
    assert!(msg.contains("schedule.end must be after schedule.start"), "{msg}");
    let cp = installed().await;
    let ns = cp.namespace("crd").await;
    let fine = "  pool: p\n  schedule: {start: '2026-12-05T19:00:00Z', end: '2026-12-05T21:00:00+01:00'}\n  jobs: [{jobName: encode}]\n";
    cp.kubectl_apply(&ns, &bundle("ends-later", fine))
        .expect("an end after the start is accepted");
}

#[tokio::test]
async fn schedule_times_are_rfc3339_with_an_offset() {
    let spec = "  pool: p\n  schedule: {start: '2026-12-05T19:00:00'}\n  jobs: [{jobName: encode}]\n";
    let msg = refused(&bundle("no-offset", spec)).await;
    assert!(msg.contains("spec.schedule.start"), "{msg}");
}

#[tokio::test]
async fn started_replicas_are_for_manual_jobs() {
    let spec = "  pool: p\n  jobs: [{jobName: encode, startedReplicas: [0]}]\n";
    let msg = refused(&bundle("started-auto", spec)).await;
    assert!(msg.contains("startedReplicas is for startMode: manual jobs"), "{msg}");
}

#[tokio::test]
async fn started_replicas_name_replicas_the_bundle_has() {
    let spec = "  pool: p\n  jobs: [{jobName: record, startMode: manual, startedReplicas: [1]}]\n";
    let msg = refused(&bundle("started-backup", spec)).await;
    assert!(
        msg.contains("startedReplicas must name replicas the bundle has"),
        "{msg}"
    );
    let spec = "  pool: p\n  jobs: [{jobName: record, startMode: manual, startedReplicas: [0, 0]}]\n";
    let msg = refused(&bundle("started-twice", spec)).await;
    assert!(msg.contains("Duplicate value"), "{msg}");
}

/// The field's name as words (`requiredCapacity` -> `required capacity`).
fn name_words(name: &str) -> Vec<String> {
    let mut words = vec![String::new()];
    for c in name.chars() {
        if c.is_uppercase() && !words.last().unwrap().is_empty() {
            words.push(String::new());
        }
        words.last_mut().unwrap().push(c.to_ascii_lowercase());
    }
    words
}

fn descriptions(schema: &serde_json::Value, path: &str, out: &mut Vec<(String, String)>) {
    if let Some(text) = schema["description"].as_str() {
        out.push((path.to_owned(), text.to_owned()));
    }
    if let Some(properties) = schema["properties"].as_object() {
        for (name, property) in properties {
            descriptions(property, &format!("{path}.{name}"), out);
        }
    }
    if schema["items"].is_object() {
        descriptions(&schema["items"], &format!("{path}[]"), out);
    }
}

#[test]
fn every_field_description_says_more_than_the_fields_name_and_speaks_no_jargon() {
    let filler = ["the", "a", "an", "its", "of"];
    let mut problems = Vec::new();
    for definition in crd::definitions() {
        let kind = definition.spec.names.kind.clone();
        for version in &definition.spec.versions {
            let schema = serde_json::to_value(&version.schema.as_ref().unwrap().open_api_v3_schema).unwrap();
            let mut found = Vec::new();
            descriptions(&schema, &kind, &mut found);
            for (path, text) in found {
                let field = path.rsplit('.').next().unwrap().trim_end_matches("[]");
                let said: Vec<String> = text
                    .to_lowercase()
                    .split(|c: char| !c.is_ascii_alphanumeric())
                    .filter(|w| !w.is_empty() && !filler.contains(w))
                    .map(str::to_owned)
                    .collect();
                let named: Vec<String> = name_words(field)
                    .into_iter()
                    .filter(|w| !filler.contains(&w.as_str()))
                    .collect();
                if said == named {
                    problems.push(format!("{path}: {text:?} only repeats the field's name"));
                }
                if said.iter().any(|w| w == "seed") {
                    problems.push(format!(
                        "{path}: {text:?} speaks of the seed (the library this operator re-imagines)"
                    ));
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
