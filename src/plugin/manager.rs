//! `manager`: which Manager each fleet's leading operator drives, whether its stream is up, and
//! how each capability beyond the published Manager API is carried out — served by Manager, or
//! the published way with what a user loses then. Read from the status ConfigMaps the leaders
//! publish (see [`crate::decide::manager_status`], which says what the keys are), found by
//! label in every namespace or in the operator's. The plugin only reads; it never asks Manager.

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::jiff::Timestamp;
use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};
use serde::Serialize;

use crate::cli::plan::Output;
use crate::cli::plan::render::columns;
use crate::decide::manager_status::{MANAGER_STATUS, ManagerStatus, STATUS};
use crate::decide::node::FLEET;

use super::PluginError;

/// One leader's status, with the ConfigMap it was read from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Published {
    /// The ConfigMap's namespace (the operator's).
    pub namespace: String,
    /// The ConfigMap's name.
    pub name: String,
    /// What it says.
    #[serde(flatten)]
    pub status: ManagerStatus,
}

/// The document `-o json` and `-o yaml` print.
#[derive(Serialize)]
struct Document<'a> {
    managers: &'a [Published],
}

/// The status of `fleet` (every fleet when absent) published in `namespace` (every namespace
/// when absent), by fleet then namespace. An error when there is none, or when listing the
/// ConfigMaps is forbidden.
pub async fn find(client: Client, fleet: Option<&str>, namespace: Option<&str>) -> Result<Vec<Published>, PluginError> {
    let api: Api<ConfigMap> = match namespace {
        Some(namespace) => Api::namespaced(client, namespace),
        None => Api::all(client),
    };
    let mut selector = format!("{STATUS}={MANAGER_STATUS}");
    if let Some(fleet) = fleet {
        selector.push_str(&format!(",{FLEET}={fleet}"));
    }
    let listed = match api.list(&ListParams::default().labels(&selector)).await {
        Ok(listed) => listed,
        Err(kube::Error::Api(status)) if status.code == 403 => {
            return Err(PluginError::ManagerStatusForbidden {
                namespace: namespace.map(str::to_owned),
            });
        }
        Err(source) => {
            return Err(PluginError::Request {
                action: format!("list configmaps labelled {selector}"),
                source,
            });
        }
    };
    let mut found: Vec<Published> = listed
        .items
        .into_iter()
        .map(|config_map| Published {
            namespace: config_map.namespace().unwrap_or_default(),
            name: config_map.name_any(),
            status: ManagerStatus::read(&config_map.data.unwrap_or_default()),
        })
        .collect();
    if found.is_empty() {
        return Err(PluginError::NoManagerStatus {
            fleet: fleet.map(str::to_owned),
            namespace: namespace.map(str::to_owned),
        });
    }
    found.sort_by(|a, b| (&a.status.fleet, &a.namespace).cmp(&(&b.status.fleet, &b.namespace)));
    Ok(found)
}

/// `found` as `output` asks, its age reckoned from `now`: for each leader, what it drives
/// and a table of the capabilities with what a user loses (`wide`: and what the operator does
/// instead); or the [`Published`] list as JSON or YAML.
pub fn render(found: &[Published], output: Output, now: Timestamp) -> Result<String, serde_json::Error> {
    Ok(match output {
        Output::Table | Output::Wide => found
            .iter()
            .map(|p| describe(p, output == Output::Wide, now))
            .collect::<Vec<_>>()
            .join("\n"),
        Output::Json => {
            let mut text = serde_json::to_string_pretty(&Document { managers: found })?;
            text.push('\n');
            text
        }
        Output::Yaml => {
            let value = serde_json::to_value(Document { managers: found })?;
            yaml_serde::to_string(&value).map_err(serde::ser::Error::custom)?
        }
    })
}

/// One leader's status for people.
fn describe(published: &Published, wide: bool, now: Timestamp) -> String {
    let status = &published.status;
    let or_dash = |text: &str| {
        if text.is_empty() {
            "-".to_owned()
        } else {
            text.to_owned()
        }
    };
    let head = [
        ("Fleet:", or_dash(&status.fleet)),
        ("Manager:", or_dash(&status.manager)),
        ("Connection:", or_dash(&status.connection)),
        ("Leader:", or_dash(&status.leader)),
        ("Written:", written(&status.written, now)),
        (
            "Status:",
            format!("configmap {}/{}", published.namespace, published.name),
        ),
    ];
    let mut out: String = head
        .iter()
        .map(|(label, value)| format!("{label:<12}{value}\n"))
        .collect();
    out.push('\n');
    let body: Vec<Vec<String>> = status
        .capabilities
        .iter()
        .map(|c| {
            let mut row = vec![c.capability.clone(), c.mode.clone(), or_dash(&c.lost)];
            if wide {
                row.push(or_dash(&c.instead));
            }
            row
        })
        .collect();
    let mut header = vec!["CAPABILITY", "MODE", "WITHOUT IT"];
    if wide {
        header.push("INSTEAD");
    }
    out.push_str(&columns(&header, &body));
    out
}

/// When the status was written and how long ago: a status long unchanged is right while the
/// leader that wrote it runs, but nothing rewrites a stopped operator's.
fn written(text: &str, now: Timestamp) -> String {
    let Ok(at) = text.parse::<Timestamp>() else {
        return if text.is_empty() {
            "-".to_owned()
        } else {
            text.to_owned()
        };
    };
    let seconds = now.duration_since(at).as_secs().max(0);
    let age = match seconds {
        s if s < 120 => format!("{s}s"),
        s if s < 2 * 3600 => format!("{}m", s / 60),
        s if s < 2 * 86_400 => format!("{}h", s / 3600),
        s => format!("{}d", s / 86_400),
    };
    format!("{text} ({age} ago)")
}

#[cfg(test)]
mod tests {
    use crate::decide::manager_status::Publisher;
    use crate::manager::stream::ConnectionState;
    use crate::model::manager::{Capabilities, Capability, Mode};

    use super::*;

    fn published(fleet: &str, bundle_store: Mode) -> Published {
        let mut caps = Capabilities::all_served();
        caps.set(Capability::BundleStore, bundle_store);
        let publisher = Publisher {
            namespace: "norsk-system".to_owned(),
            fleet: fleet.to_owned(),
            leader: "nam-0".to_owned(),
            manager: "http://manager:6789".to_owned(),
        };
        let written = "2026-03-01T10:00:00Z".parse().expect("a timestamp");
        Published {
            namespace: "norsk-system".to_owned(),
            name: format!("norsk-auto-manager-status-{fleet}"),
            status: ManagerStatus::of(&publisher, ConnectionState::Ready, &caps, written),
        }
    }

    fn now() -> Timestamp {
        "2026-03-01T10:05:30Z".parse().expect("a timestamp")
    }

    #[test]
    fn the_table_says_what_a_user_loses_for_each_capability_taken_the_published_way() {
        let text = render(&[published("default", Mode::Published)], Output::Table, now()).expect("renders");
        let (_, lost) = Capability::BundleStore.without();
        assert!(text.contains("Fleet:      default\n"), "{text}");
        assert!(text.contains("Manager:    http://manager:6789\n"), "{text}");
        assert!(text.contains("Connection: ready\n"), "{text}");
        assert!(text.contains("Leader:     nam-0\n"), "{text}");
        assert!(text.contains("Written:    2026-03-01T10:00:00Z (5m ago)\n"), "{text}");
        assert!(
            text.contains("Status:     configmap norsk-system/norsk-auto-manager-status-default\n"),
            "{text}"
        );
        let header = text.lines().find(|l| l.starts_with("CAPABILITY")).expect("a header");
        assert_eq!(
            header
                .split("  ")
                .filter(|c| !c.is_empty())
                .map(str::trim)
                .collect::<Vec<_>>(),
            ["CAPABILITY", "MODE", "WITHOUT IT"]
        );
        let bundle_store = text.lines().find(|l| l.starts_with("bundleStore")).expect("a row");
        assert!(
            bundle_store.contains("published") && bundle_store.ends_with(lost),
            "{bundle_store}"
        );
        let node_tags = text.lines().find(|l| l.starts_with("nodeTags")).expect("a row");
        assert_eq!(
            node_tags.split_whitespace().collect::<Vec<_>>(),
            ["nodeTags", "served", "-"]
        );
        assert!(
            !text.contains("INSTEAD"),
            "only the wide table says what the operator does"
        );
        let wide = render(&[published("default", Mode::Published)], Output::Wide, now()).expect("renders");
        let (instead, _) = Capability::BundleStore.without();
        assert!(wide.contains("INSTEAD") && wide.contains(instead), "{wide}");
    }

    #[test]
    fn json_lists_every_fleet_with_the_keys_the_leader_wrote() {
        let found = [published("default", Mode::Served), published("eu", Mode::Published)];
        let text = render(&found, Output::Json, now()).expect("renders");
        let value: serde_json::Value = serde_json::from_str(&text).expect("JSON");
        let managers = value["managers"].as_array().expect("a list");
        assert_eq!(managers.len(), 2);
        assert_eq!(managers[1]["fleet"], "eu");
        assert_eq!(managers[1]["namespace"], "norsk-system");
        assert_eq!(managers[1]["connection"], "ready");
        assert_eq!(managers[1]["capabilities"][0]["capability"], "bundleStore");
        assert_eq!(managers[1]["capabilities"][0]["mode"], "published");
        assert!(managers[1]["capabilities"][0]["lost"].is_string());
        assert!(
            managers[0]["capabilities"][0].get("lost").is_none(),
            "a served capability loses nothing"
        );
        let yaml = render(&found, Output::Yaml, now()).expect("renders");
        assert!(yaml.contains("mode: published"), "{yaml}");
    }

    #[test]
    fn the_age_of_a_status_is_shown_in_the_largest_whole_unit() {
        let now = now();
        assert_eq!(written("2026-03-01T10:05:00Z", now), "2026-03-01T10:05:00Z (30s ago)");
        assert_eq!(written("2026-03-01T07:00:00Z", now), "2026-03-01T07:00:00Z (3h ago)");
        assert_eq!(written("2026-02-20T10:00:00Z", now), "2026-02-20T10:00:00Z (9d ago)");
        assert_eq!(written("", now), "-");
        assert_eq!(
            written("yesterday", now),
            "yesterday",
            "what cannot be read is shown as it is"
        );
    }
}
