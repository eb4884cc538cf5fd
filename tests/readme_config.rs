//! The README's configuration reference is the operator's settings file as the types define it:
//! every key of `AutoSettings` (flattened) and of the operator's own sections, with its
//! default. A key added, renamed or given another default fails this test until the README
//! says so.

use norsk_auto_manager::automanager::AutoSettings;
use norsk_auto_manager::cli::operator::OperatorFile;
use serde_json::{Value, json};

/// `(key, default)` for every leaf of `value`, keys joined with dots.
fn leaves(prefix: &str, value: &Value, out: &mut Vec<(String, String)>) {
    match value {
        Value::Object(map) if !map.is_empty() => {
            for (key, inner) in map {
                leaves(&format!("{prefix}.{key}"), inner, out);
            }
        }
        other => out.push((prefix.to_owned(), other.to_string())),
    }
}

/// The rows the reference must hold.
fn expected() -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let settings = serde_json::to_value(AutoSettings::default()).expect("settings as JSON");
    leaves("settings", &settings, &mut rows);
    // The operator's own sections.
    let file = OperatorFile::default();
    let lease = json!({
        "namespace": file.lease.namespace,
        "name": file.lease.name,
        "durationSeconds": file.lease.duration_seconds,
        "graceSeconds": file.lease.grace_seconds,
    });
    leaves("lease", &lease, &mut rows);
    leaves("metricsAddr", &json!(file.metrics_addr), &mut rows);
    leaves("managerTlsDomain", &json!(file.manager_tls_domain), &mut rows);
    rows
}

#[test]
fn readme_configuration_reference_lists_every_setting_with_its_default() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/configuration.md"))
        .expect("docs/configuration.md");
    let section = readme
        .split("## Configuration reference")
        .nth(1)
        .and_then(|rest| rest.split("\n## ").next())
        .unwrap_or_default();
    let table: String = expected()
        .iter()
        .map(|(key, default)| format!("| `{key}` | `{default}` |"))
        .collect::<Vec<_>>()
        .join("\n");
    let missing: Vec<String> = expected()
        .iter()
        .map(|(key, default)| format!("| `{key}` | `{default}` |"))
        .filter(|row| !section.contains(row.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/configuration.md's configuration reference lacks {missing:#?}\nexpected rows (each followed by ` description |`):\n{table}"
    );
}
