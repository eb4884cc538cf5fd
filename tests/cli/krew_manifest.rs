//! The krew manifest: the template in `deploy/krew/norsk.yaml` renders, for a release, into
//! a manifest whose every platform points at that release's archive with its sha256, and a
//! release missing an archive renders nothing.

use std::path::Path;
use std::process::Command;

const TARGETS: [&str; 3] = [
    "x86_64-unknown-linux-musl",
    "aarch64-unknown-linux-musl",
    "aarch64-apple-darwin",
];

/// Runs the release script; returns (success, stdout, stderr).
fn render(version: &str, base: &str, dir: &Path) -> (bool, String, String) {
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/krew/release.sh"))
        .args([version, base])
        .arg(dir)
        .output()
        .expect("bash runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The sha256 of `bytes` as `sha256sum` prints it (a second, independent digest).
fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().expect("sha256sum runs");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .expect("a digest")
        .to_owned()
}

#[test]
fn a_release_manifest_points_every_platform_at_its_archive_with_its_sha256() {
    let dir = tempfile::tempdir().unwrap();
    for target in TARGETS {
        // Distinct contents, so a digest put on the wrong platform shows.
        std::fs::write(
            dir.path().join(format!("kubectl-norsk-v1.2.3-{target}.tar.gz")),
            format!("archive for {target}"),
        )
        .unwrap();
    }
    let (ok, manifest, stderr) = render("v1.2.3", "https://dl.example.com/norsk/", dir.path());
    assert!(ok, "{stderr}");
    assert!(
        !manifest.contains("RELEASE_URL") && !manifest.contains("0.1.0"),
        "{manifest}"
    );
    let doc: yaml_serde::Value = yaml_serde::from_str(&manifest).expect("the manifest is YAML");
    assert_eq!(doc["kind"].as_str(), Some("Plugin"));
    assert_eq!(doc["metadata"]["name"].as_str(), Some("norsk"));
    assert_eq!(doc["spec"]["version"].as_str(), Some("v1.2.3"));
    let platforms = doc["spec"]["platforms"].as_sequence().expect("platforms");
    assert_eq!(platforms.len(), TARGETS.len());
    for (platform, target) in platforms.iter().zip(TARGETS) {
        let file = format!("kubectl-norsk-v1.2.3-{target}.tar.gz");
        assert_eq!(
            platform["uri"].as_str(),
            Some(format!("https://dl.example.com/norsk/v1.2.3/{file}").as_str())
        );
        assert_eq!(
            platform["sha256"].as_str(),
            Some(sha256(&dir.path().join(&file)).as_str()),
            "{target}"
        );
        assert_eq!(platform["bin"].as_str(), Some("kubectl-norsk"));
    }
}

#[test]
fn a_release_missing_an_archive_renders_no_manifest() {
    let dir = tempfile::tempdir().unwrap();
    for target in &TARGETS[..2] {
        std::fs::write(dir.path().join(format!("kubectl-norsk-v1.2.3-{target}.tar.gz")), target).unwrap();
    }
    let (ok, manifest, stderr) = render("v1.2.3", "https://dl.example.com/norsk", dir.path());
    assert!(!ok, "rendered without the darwin archive:\n{manifest}");
    assert!(
        stderr.contains("kubectl-norsk-v1.2.3-aarch64-apple-darwin.tar.gz"),
        "{stderr}"
    );
    let (ok, _, stderr) = render("1.2", "https://dl.example.com/norsk", dir.path());
    assert!(!ok);
    assert!(stderr.contains("semantic version"), "{stderr}");
}
