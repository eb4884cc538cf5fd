//! What the Manager status ConfigMap says, as data: which Manager the
//! leader drives, whether its stream is up, and for each capability beyond
//! the published Manager API ([`crate::model::manager`]) whether Manager
//! serves it or the operator takes the published way — then with what the
//! operator does instead and what a user loses. Plain strings, for
//! `kubectl get configmap -o yaml` and for `kubectl norsk manager`, which
//! reads them back with [`ManagerStatus::read`]: the keys are said here
//! only. The operator's `controller::manager_status` writes the ConfigMap.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::manager::stream::ConnectionState;
use crate::model::manager::{Capabilities, Capability, Mode};

use super::OPERATOR_NAME;
use super::node_status::resource_name;

/// Label on the status ConfigMap saying what it tells: with
/// [`MANAGER_STATUS`], the plugin finds every fleet's in any namespace.
pub const STATUS: &str = "automanager.norsk.video/status";
/// The value of [`STATUS`] on the Manager status ConfigMap.
pub const MANAGER_STATUS: &str = "manager";
/// The data keys. A capability's mode is under `capability.<name>`; what the
/// operator does instead and what a user loses, under that key followed by
/// [`INSTEAD`](key::INSTEAD) and [`LOST`](key::LOST), only while it takes the
/// published way.
pub mod key {
    /// The fleet (the operator's `--fleet`).
    pub const FLEET: &str = "fleet";
    /// The leading operator's identity (its pod name).
    pub const LEADER: &str = "leader";
    /// Manager's URL.
    pub const MANAGER: &str = "manager";
    /// Manager's stream: `idle`, `connecting`, `ready`, `transientFailure`
    /// or `shutdown`.
    pub const CONNECTION: &str = "connection";
    /// When the leader wrote the status (RFC 3339).
    pub const WRITTEN: &str = "written";
    /// What starts the key of a capability.
    pub const CAPABILITY: &str = "capability.";
    /// What ends the key of what the operator does without a capability.
    pub const INSTEAD: &str = ".instead";
    /// What ends the key of what a user loses without a capability.
    pub const LOST: &str = ".lost";
}

/// The name of `fleet`'s status ConfigMap (the chart's RBAC names the same).
pub fn config_map_name(fleet: &str) -> String {
    resource_name(&format!("{OPERATOR_NAME}-status-{fleet}"))
}

/// What the status says: the ConfigMap's data, as the plugin prints it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ManagerStatus {
    /// The fleet.
    pub fleet: String,
    /// The leader's identity.
    pub leader: String,
    /// Manager's URL.
    pub manager: String,
    /// Manager's stream (see [`key::CONNECTION`]).
    pub connection: String,
    /// When it was written (RFC 3339).
    pub written: String,
    /// Every capability, in the order they are reported.
    pub capabilities: Vec<CapabilityStatus>,
}

/// How one capability is carried out.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CapabilityStatus {
    /// Its name ([`Capability::as_str`]).
    pub capability: String,
    /// `served` or `published` ([`Mode::as_str`]).
    pub mode: String,
    /// What the operator does instead (published only).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub instead: String,
    /// What a user loses (published only; empty: nothing).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub lost: String,
}

/// Who publishes the status, of which Manager: fixed for a term.
#[derive(Clone, Debug)]
pub struct Publisher {
    /// The operator's namespace (the Lease's).
    pub namespace: String,
    /// The fleet.
    pub fleet: String,
    /// The leader's identity.
    pub leader: String,
    /// Manager's URL.
    pub manager: String,
}

impl ManagerStatus {
    /// The status `publisher` writes at `written` while Manager's stream is
    /// `connection` and its capabilities are carried out as `capabilities`.
    pub fn of(
        publisher: &Publisher,
        connection: ConnectionState,
        capabilities: &Capabilities,
        written: Timestamp,
    ) -> Self {
        // The same word as the `connectionStateChange` notification's.
        let connection = serde_json::to_value(connection)
            .ok()
            .and_then(|v| v.as_str().map(str::to_owned))
            .unwrap_or_default();
        let capabilities = Capability::ALL
            .iter()
            .map(|c| {
                let mode = capabilities.mode(*c);
                let (instead, lost) = match mode {
                    Mode::Served => ("", ""),
                    Mode::Published => c.without(),
                };
                CapabilityStatus {
                    capability: c.as_str().to_owned(),
                    mode: mode.as_str().to_owned(),
                    instead: instead.to_owned(),
                    lost: lost.to_owned(),
                }
            })
            .collect();
        Self {
            fleet: publisher.fleet.clone(),
            leader: publisher.leader.clone(),
            manager: publisher.manager.clone(),
            connection,
            written: format!("{written:.0}"),
            capabilities,
        }
    }

    /// The ConfigMap's data.
    pub fn data(&self) -> BTreeMap<String, String> {
        let mut data = BTreeMap::from([
            (key::FLEET.to_owned(), self.fleet.clone()),
            (key::LEADER.to_owned(), self.leader.clone()),
            (key::MANAGER.to_owned(), self.manager.clone()),
            (key::CONNECTION.to_owned(), self.connection.clone()),
            (key::WRITTEN.to_owned(), self.written.clone()),
        ]);
        for c in &self.capabilities {
            let name = format!("{}{}", key::CAPABILITY, c.capability);
            for (suffix, text) in [(key::INSTEAD, &c.instead), (key::LOST, &c.lost)] {
                if !text.is_empty() {
                    data.insert(format!("{name}{suffix}"), text.clone());
                }
            }
            data.insert(name, c.mode.clone());
        }
        data
    }

    /// The status a ConfigMap's `data` says. Lenient: a key missing reads
    /// as empty, and a capability this version does not know (an operator
    /// newer than the plugin) is kept, after the known ones.
    pub fn read(data: &BTreeMap<String, String>) -> Self {
        let text = |key: &str| data.get(key).cloned().unwrap_or_default();
        let mut capabilities: Vec<CapabilityStatus> = data
            .iter()
            .filter_map(|(k, mode)| {
                let name = k.strip_prefix(key::CAPABILITY)?;
                (!name.contains('.')).then(|| CapabilityStatus {
                    capability: name.to_owned(),
                    mode: mode.clone(),
                    instead: text(&format!("{k}{}", key::INSTEAD)),
                    lost: text(&format!("{k}{}", key::LOST)),
                })
            })
            .collect();
        capabilities.sort_by_key(|c| {
            let known = Capability::ALL.iter().position(|k| k.as_str() == c.capability);
            (known.unwrap_or(Capability::ALL.len()), c.capability.clone())
        });
        Self {
            fleet: text(key::FLEET),
            leader: text(key::LEADER),
            manager: text(key::MANAGER),
            connection: text(key::CONNECTION),
            written: text(key::WRITTEN),
            capabilities,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn publisher() -> Publisher {
        Publisher {
            namespace: "norsk-system".to_owned(),
            fleet: "eu".to_owned(),
            leader: "nam-0".to_owned(),
            manager: "http://manager:6789".to_owned(),
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("a timestamp")
    }

    #[test]
    fn a_capability_taken_the_published_way_says_what_the_operator_does_and_what_is_lost() {
        let mut caps = Capabilities::all_served();
        caps.set(Capability::BundleStore, Mode::Published);
        let status = ManagerStatus::of(
            &publisher(),
            ConnectionState::TransientFailure,
            &caps,
            at("2026-03-01T10:00:00.123456Z"),
        );
        let data = status.data();
        assert_eq!(data["fleet"], "eu");
        assert_eq!(data["leader"], "nam-0");
        assert_eq!(data["manager"], "http://manager:6789");
        assert_eq!(data["connection"], "transientFailure");
        assert_eq!(data["written"], "2026-03-01T10:00:00Z", "to the second");
        assert_eq!(data["capability.bundleStore"], "published");
        let (instead, lost) = Capability::BundleStore.without();
        assert_eq!(data["capability.bundleStore.instead"], instead);
        assert_eq!(data["capability.bundleStore.lost"], lost);
        assert_eq!(data["capability.nodeTags"], "served");
        assert!(
            !data.contains_key("capability.nodeTags.instead") && !data.contains_key("capability.nodeTags.lost"),
            "a served capability costs nothing: {data:?}"
        );
        assert_eq!(data.len(), 5 + Capability::ALL.len() + 2);
    }

    #[test]
    fn the_plugin_reads_back_what_the_leader_wrote_in_the_order_capabilities_are_reported() {
        let status = ManagerStatus::of(
            &publisher(),
            ConnectionState::Ready,
            &Capabilities::default(),
            at("2026-03-01T10:00:00Z"),
        );
        let read = ManagerStatus::read(&status.data());
        assert_eq!(read, status);
        let names: Vec<&str> = read.capabilities.iter().map(|c| c.capability.as_str()).collect();
        let reported: Vec<&str> = Capability::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(names, reported);
    }

    #[test]
    fn a_capability_a_newer_operator_reports_is_kept_after_the_known_ones() {
        let mut data = ManagerStatus::of(
            &publisher(),
            ConnectionState::Ready,
            &Capabilities::all_served(),
            at("2026-03-01T10:00:00Z"),
        )
        .data();
        data.insert("capability.aNewThing".to_owned(), "published".to_owned());
        data.insert("capability.aNewThing.lost".to_owned(), "something".to_owned());
        data.remove("leader");
        let read = ManagerStatus::read(&data);
        assert_eq!(read.leader, "", "a key missing reads as empty");
        let last = read.capabilities.last().expect("capabilities");
        assert_eq!(
            (last.capability.as_str(), last.mode.as_str(), last.lost.as_str()),
            ("aNewThing", "published", "something")
        );
        assert_eq!(read.capabilities.len(), Capability::ALL.len() + 1);
    }

    #[test]
    fn each_fleet_has_a_status_of_its_own_named_after_it() {
        assert_eq!(config_map_name("default"), "norsk-auto-manager-status-default");
        assert_eq!(config_map_name("eu"), "norsk-auto-manager-status-eu");
        assert_ne!(config_map_name("EU"), config_map_name("eu"));
    }
}
