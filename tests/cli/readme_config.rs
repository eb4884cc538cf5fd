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

/// The commands of the README's `sh` block after `heading` (parts `first` to
/// `last`), through the extractor the end-to-end run uses.
fn readme_commands(heading: &str, parts: Option<(u32, u32)>) -> Vec<String> {
    let root = env!("CARGO_MANIFEST_DIR");
    let mut command = std::process::Command::new("python3");
    command
        .arg(format!("{root}/e2e/lib/readme.py"))
        .arg(format!("{root}/README.md"))
        .arg(heading);
    if let Some((first, last)) = parts {
        command.arg(first.to_string()).arg(last.to_string());
    }
    let out = command.output().expect("python3 runs e2e/lib/readme.py");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(str::to_owned)
        .collect()
}

const QUICK_START: &str = "Quick start: the chart with a simulated Manager";

#[test]
fn the_readme_quick_start_runs_in_the_end_to_end_as_written() {
    // Parts 2 to 4 and the Uninstall block are run verbatim by e2e/node/run.sh.
    let install = readme_commands(QUICK_START, Some((2, 4)));
    assert!(
        install
            .iter()
            .any(|c| c.starts_with("helm install nam charts/norsk-auto-manager")),
        "{install:#?}"
    );
    assert!(
        install
            .iter()
            .any(|c| c.starts_with("kubectl wait ") && c.contains("--timeout")),
        "{install:#?}"
    );
    let uninstall = readme_commands("Uninstall", None);
    assert_eq!(uninstall.len(), 3, "{uninstall:#?}");
    // Part 5's commands are the verbs of e2e/day-two.txt, each with the same arguments.
    let day_two = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/e2e/day-two.txt")).expect("day-two");
    let steps: Vec<&str> = day_two
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .collect();
    let bundle_of = |c: &str| {
        c.split("get bundle ")
            .nth(1)
            .and_then(|rest| rest.split_whitespace().next())
            .map(str::to_owned)
            .unwrap_or_else(|| panic!("no bundle named in {c}"))
    };
    let part_five = readme_commands(QUICK_START, Some((5, 5)));
    assert_eq!(part_five.len(), 4, "{part_five:#?}");
    for command in &part_five {
        let words: Vec<&str> = command.split_whitespace().collect();
        let verb = match words.as_slice() {
            ["kubectl", "norsk", "drain", ..] => format!("drain-primary bundle {}", bundle_of(command)),
            ["kubectl", "norsk", "interrupt", ..] => format!("interrupt-primary bundle {}", bundle_of(command)),
            ["kubectl", "norsk", "migrate", bundle, job, ..] => format!("migrate {bundle} {job}"),
            ["helm", "upgrade", .., "--set", setting] => format!("helm-upgrade {setting}"),
            _ => panic!("no day-two verb runs the README's {command:?}"),
        };
        assert!(
            steps.iter().any(|s| s.starts_with(&verb)),
            "the README says {command:?} but e2e/day-two.txt has no {verb:?}"
        );
    }
}
