//! The chart's CRD upgrade path on a control plane of its own: Helm installs the CRDs on
//! first install and never touches them again, so a new version's CRDs are applied with
//! `kubectl apply --server-side --force-conflicts` (as the README and the chart's NOTES say).

use std::path::Path;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;

use crate::control_plane;

const CHANGED: (&str, &str) = ("A drain of one node", "A drain of one Norsk node");

#[tokio::test]
async fn crds_installed_by_helm_upgrade_with_server_side_apply() {
    let cp = control_plane::ControlPlane::start().await.expect("control plane");
    let chart = Path::new(env!("CARGO_MANIFEST_DIR")).join("charts/norsk-auto-manager");
    let out = cp
        .helm()
        .args(["install", "nam"])
        .arg(&chart)
        .args([
            "-n",
            "norsk-system",
            "--create-namespace",
            "--set",
            "simulator.enabled=true",
        ])
        .output()
        .expect("helm runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let crds: Api<CustomResourceDefinition> = Api::all(cp.client());
    let description = |crd: &CustomResourceDefinition| {
        crd.spec.versions[0]
            .schema
            .as_ref()
            .and_then(|s| s.open_api_v3_schema.as_ref())
            .and_then(|s| s.description.clone())
            .unwrap_or_default()
    };
    let installed = crds
        .get("nodedrains.automanager.norsk.video")
        .await
        .expect("Helm installed the CRDs");
    assert!(description(&installed).starts_with(CHANGED.0));

    // The next version's CRDs: one description changed.
    let next = tempfile::tempdir().expect("temp dir");
    for entry in std::fs::read_dir(chart.join("crds")).expect("crds") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path)
            .expect("crd")
            .replace(CHANGED.0, CHANGED.1);
        std::fs::write(next.path().join(path.file_name().expect("file name")), text).expect("write");
    }
    let apply = |extra: &[&str]| {
        cp.kubectl()
            .args(["apply", "--server-side"])
            .args(extra)
            .arg("-f")
            .arg(next.path())
            .output()
            .expect("kubectl runs")
    };
    // Helm wrote them: a plain server-side apply conflicts on the fields that change.
    let plain = apply(&[]);
    assert!(!plain.status.success());
    assert!(String::from_utf8_lossy(&plain.stderr).contains("conflict"));
    let forced = apply(&["--force-conflicts"]);
    assert!(forced.status.success(), "{}", String::from_utf8_lossy(&forced.stderr));
    let upgraded = crds.get("nodedrains.automanager.norsk.video").await.expect("CRD");
    assert!(description(&upgraded).starts_with(CHANGED.1));
}
