//! `plan` and `explain`: the placement engine on the cluster's `PlacementPool`s,
//! `HotSparePolicy`s and `Bundle`s and a fleet — what placement would decide now, printed as
//! `norsk-auto-manager plan` prints it — and the last placement the operator recorded in a
//! bundle's status. Nothing is written.
//!
//! The fleet is the live one by default: the `NorskNode`s the operator mirrors for its fleet
//! (`--fleet-name`), each converted back into the node its placement reads
//! ([`crate::crd::fleet_snapshot`]). A node that does not convert is left out with a warning;
//! the plan still runs. The bundles planned are placed as if placed now: their own jobs'
//! reservations on the live fleet are set aside first (they would otherwise count twice).
//! `--fleet FILE` plans on a snapshot file instead, exactly as `norsk-auto-manager plan` does.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::PathBuf;

use kube::api::{ApiResource, DynamicObject, ListParams};
use kube::{Api, Client, ResourceExt};

use crate::cli::plan::render::columns;
use crate::cli::plan::{InputError, Output, PlanCommandError, Sources, input, plan_rows, render_rows};
use crate::crd::{Bundle, HotSparePolicy, NodeStatusError, NorskNode, PlacementPool, SkippedNode, fleet_snapshot};
use crate::decide::OPERATOR_NAME;
use crate::decide::node::{FLEET, MANAGED_BY};
use crate::model::{BundleId, BundleSpec, FleetSnapshot, wire_name};

/// Why no plan could be computed.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// The resources could not be listed.
    #[error("list {what}: {source}")]
    List {
        /// What was listed.
        what: &'static str,
        /// The API server's answer.
        source: kube::Error,
    },
    /// The fleet snapshot could not be read.
    #[error(transparent)]
    Fleet(#[from] InputError),
    /// Planning failed.
    #[error(transparent)]
    Plan(#[from] PlanCommandError),
    /// A named bundle does not exist.
    #[error("no Bundle {0} in namespace {1}")]
    UnknownBundle(String, String),
    /// The headroom analysis could not be made.
    #[error(transparent)]
    Headroom(#[from] crate::cli::headroom::HeadroomCommandError),
}

/// The fleet a plan places on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetSource {
    /// The `NorskNode`s the operator mirrors for the fleet of this name.
    Live(String),
    /// A fleet snapshot file (`norsk-auto-manager simctl snapshot`'s `fleet`).
    File(PathBuf),
}

impl fmt::Display for FleetSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FleetSource::Live(name) => write!(f, "the live fleet {name:?} (its NorskNodes)"),
            FleetSource::File(file) => write!(f, "the fleet snapshot {}", file.display()),
        }
    }
}

/// Something the plan left out or could not see, printed on stderr.
#[derive(Clone, Debug, PartialEq)]
pub enum PlanWarning {
    /// A `NorskNode` that does not convert was left out of the fleet.
    Skipped(SkippedNode),
    /// The live fleet has no `NorskNode` at all.
    NoNodes {
        /// The fleet name asked for.
        fleet: String,
    },
}

impl fmt::Display for PlanWarning {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlanWarning::Skipped(node) => write!(f, "{node}; left out of the plan"),
            PlanWarning::NoNodes { fleet } => write!(
                f,
                "no NorskNode of fleet {fleet:?} ({FLEET}={fleet}): planned on an empty fleet; \
                 is the operator's fleet named otherwise (--fleet-name)?"
            ),
        }
    }
}

/// A rendered plan (or explanation) and what it left out.
#[derive(Clone, Debug, PartialEq)]
pub struct Planned {
    /// What is printed on stdout.
    pub text: String,
    /// What is printed on stderr, one line each.
    pub warnings: Vec<PlanWarning>,
}

async fn list<K>(api: Api<K>, params: &ListParams, what: &'static str) -> Result<Vec<K>, PlanError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.list(params)
        .await
        .map(|l| l.items)
        .map_err(|source| PlanError::List { what, source })
}

/// The namespace's bundles (those named in `only`, when any) in creation order: the order
/// the operator first placed them in.
async fn bundles(
    client: Client,
    namespace: Option<&str>,
    only: &[String],
) -> Result<Vec<(BundleId, BundleSpec)>, PlanError> {
    let api = match namespace {
        Some(namespace) => Api::<Bundle>::namespaced(client, namespace),
        None => Api::<Bundle>::all(client),
    };
    let mut found = list(api, &ListParams::default(), "bundles").await?;
    found.sort_by(|a, b| {
        (a.metadata.creation_timestamp.as_ref().map(|t| t.0), a.name_any())
            .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), b.name_any()))
    });
    if let Some(missing) = only.iter().find(|n| !found.iter().any(|b| &b.name_any() == *n)) {
        return Err(PlanError::UnknownBundle(
            missing.clone(),
            namespace.unwrap_or("any namespace").to_owned(),
        ));
    }
    Ok(found
        .into_iter()
        .filter(|b| only.is_empty() || only.contains(&b.name_any()))
        .map(|b| (b.bundle_id(), b.spec.0))
        .collect())
}

/// The mirrored nodes of fleet `name`, read one by one so a node whose status this version
/// cannot read is left out rather than failing the whole list.
async fn live_fleet(client: Client, name: &str) -> Result<(FleetSnapshot, Vec<PlanWarning>), PlanError> {
    let api: Api<DynamicObject> = Api::all_with(client, &ApiResource::erase::<NorskNode>(&()));
    let mirrored = ListParams::default().labels(&format!("{MANAGED_BY}={OPERATOR_NAME},{FLEET}={name}"));
    let objects = list(api, &mirrored, "norsknodes").await?;
    let (nodes, undecodable) = decode(objects);
    let (snapshot, skipped) = fleet_snapshot(&nodes);
    let mut warnings: Vec<PlanWarning> = undecodable
        .into_iter()
        .chain(skipped)
        .map(PlanWarning::Skipped)
        .collect();
    if nodes.is_empty() && warnings.is_empty() {
        warnings.push(PlanWarning::NoNodes { fleet: name.to_owned() });
    }
    Ok((snapshot, warnings))
}

/// Each object as a `NorskNode`; those that do not read as one, with why.
fn decode(objects: Vec<DynamicObject>) -> (Vec<NorskNode>, Vec<SkippedNode>) {
    let mut nodes = Vec::new();
    let mut skipped = Vec::new();
    for object in objects {
        let name = object.name_any();
        let node_id = object.data["spec"]["nodeId"].as_str().map(str::to_owned);
        match object.try_parse::<NorskNode>() {
            Ok(node) => nodes.push(node),
            Err(e) => skipped.push(SkippedNode {
                name,
                node_id,
                reason: NodeStatusError::Undecodable(e.to_string()),
            }),
        }
    }
    (nodes, skipped)
}

/// Takes the reservations of `bundles`' own jobs off the fleet: a plan places them as if
/// placed now.
fn set_aside(snapshot: &mut FleetSnapshot, bundles: &[(BundleId, BundleSpec)]) {
    let planned: BTreeSet<&BundleId> = bundles.iter().map(|(id, _)| id).collect();
    for node in &mut snapshot.nodes {
        node.jobs
            .retain(|job| job.bundle.as_ref().is_none_or(|b| !planned.contains(b)));
    }
}

/// The fleet as it is (the live one's jobs where they run now), what was left
/// out of it, and how errors name it.
async fn fleet_of(
    client: Client,
    fleet: &FleetSource,
) -> Result<(FleetSnapshot, Vec<PlanWarning>, PathBuf), PlanError> {
    Ok(match fleet {
        FleetSource::File(file) => (input::read_fleet(file)?, Vec::new(), file.clone()),
        FleetSource::Live(name) => {
            let (as_is, warnings) = live_fleet(client, name).await?;
            (as_is, warnings, PathBuf::from(format!("NorskNodes of fleet {name}")))
        }
    })
}

/// What `kubectl norsk headroom` found, and whether every loss analysed
/// would be absorbed.
#[derive(Debug)]
pub struct Headroom {
    /// The report and the warnings, as `plan`'s.
    pub planned: Planned,
    /// Every loss analysed would be absorbed.
    pub absorbed: bool,
}

/// Whether the fleet (the live one, or `fleet`'s file) would absorb the loss
/// of each domain `selection` names, with the cluster's pools, hot spares and
/// every namespace's bundles: `norsk-auto-manager headroom` on what the
/// cluster holds.
pub async fn headroom(
    client: Client,
    fleet: &FleetSource,
    selection: &crate::placement::headroom::Selection,
    output: Output,
    explain: bool,
) -> Result<Headroom, PlanError> {
    let all = ListParams::default();
    let pools = list(Api::<PlacementPool>::all(client.clone()), &all, "placementpools").await?;
    let spares = list(Api::<HotSparePolicy>::all(client.clone()), &all, "hotsparepolicies").await?;
    let bundles: BTreeMap<BundleId, BundleSpec> = bundles(client.clone(), None, &[]).await?.into_iter().collect();
    let (snapshot, warnings, label) = fleet_of(client, fleet).await?;
    let report = crate::cli::headroom::analyse(
        pools.iter().map(PlacementPool::to_model).collect(),
        &spares.into_iter().map(|p| p.spec.0).collect::<Vec<_>>(),
        &snapshot,
        &bundles,
        selection,
        explain,
        ("the cluster's PlacementPools and HotSparePolicies", &label),
    )?;
    let text = crate::cli::headroom::render::render(&report, output, explain)
        .map_err(crate::cli::headroom::HeadroomCommandError::from)?;
    Ok(Headroom {
        absorbed: report.domains.iter().all(|d| d.absorbed),
        planned: Planned { text, warnings },
    })
}

/// The plan's rows, what it left out, and the fleet as it is (before the planned bundles'
/// own reservations were set aside: where their jobs run now).
async fn rows(
    client: Client,
    namespace: Option<&str>,
    fleet: &FleetSource,
    only: &[String],
    explain: bool,
) -> Result<(Vec<crate::placement::PlanRow>, Vec<PlanWarning>, FleetSnapshot), PlanError> {
    let all = ListParams::default();
    let pools = list(Api::<PlacementPool>::all(client.clone()), &all, "placementpools").await?;
    let spares = list(Api::<HotSparePolicy>::all(client.clone()), &all, "hotsparepolicies").await?;
    let bundles = bundles(client.clone(), namespace, only).await?;
    let (as_is, warnings, label) = fleet_of(client, fleet).await?;
    let mut snapshot = as_is.clone();
    if matches!(fleet, FleetSource::Live(_)) {
        set_aside(&mut snapshot, &bundles);
    }
    let sources = Sources {
        settings: "the cluster's PlacementPools and HotSparePolicies".to_owned(),
        fleet: label,
    };
    let rows = plan_rows(
        pools.iter().map(PlacementPool::to_model).collect(),
        &spares.into_iter().map(|p| p.spec.0).collect::<Vec<_>>(),
        &snapshot,
        &bundles,
        explain,
        &sources,
    )?;
    Ok((rows, warnings, as_is))
}

/// The plan of the namespace's bundles (every namespace's when `namespace` is `None`; or
/// `only` those) on `fleet`, rendered as `output`.
pub async fn plan(
    client: Client,
    namespace: Option<&str>,
    fleet: &FleetSource,
    only: &[String],
    output: Output,
) -> Result<Planned, PlanError> {
    let (rows, warnings, as_is) = rows(client, namespace, fleet, only, false).await?;
    Ok(Planned {
        text: render_rows(&rows, output, &as_is)?,
        warnings,
    })
}

/// Why `bundle`'s jobs (or only `job`) are where they are: the last placement the operator
/// recorded in the bundle's status, job by job, then the placement engine's trace against
/// `fleet`, node by node.
pub async fn explain(
    client: Client,
    namespace: &str,
    fleet: &FleetSource,
    bundle: &str,
    job: Option<&str>,
) -> Result<Planned, PlanError> {
    let api: Api<Bundle> = Api::namespaced(client.clone(), namespace);
    let found = api
        .get_opt(bundle)
        .await
        .map_err(|source| PlanError::List {
            what: "bundles",
            source,
        })?
        .ok_or_else(|| PlanError::UnknownBundle(bundle.to_owned(), namespace.to_owned()))?;
    let mut text = last_placements(&found, job);
    let (rows, warnings, as_is) = rows(client, Some(namespace), fleet, &[bundle.to_owned()], true).await?;
    let rows: Vec<_> = rows
        .into_iter()
        .filter(|r| job.is_none_or(|j| r.job_name == j))
        .collect();
    text.push_str(&format!("\nPlaced again now, on {fleet}:\n"));
    text.push_str(&render_rows(&rows, Output::Wide, &as_is)?);
    Ok(Planned { text, warnings })
}

/// The status's record of each job's last placement, as a table.
pub fn last_placements(bundle: &Bundle, job: Option<&str>) -> String {
    let dash = || "-".to_owned();
    let body: Vec<Vec<String>> = bundle
        .status
        .iter()
        .flat_map(|s| &s.replicas)
        .flat_map(|r| r.jobs.iter().map(move |j| (r.index, j)))
        .filter(|(_, j)| job.is_none_or(|name| j.job_name == name))
        .map(|(index, j)| {
            vec![
                index.to_string(),
                j.job_name.clone(),
                j.node.clone().unwrap_or_else(dash),
                wire_name(&j.state),
                j.last_placement.clone().unwrap_or_else(dash),
                j.resilience_degraded.clone().unwrap_or_else(dash),
            ]
        })
        .collect();
    if body.is_empty() {
        return format!("{}: no placement recorded yet\n", bundle.bundle_id());
    }
    columns(
        &["REPLICA", "JOB", "NODE", "STATE", "LAST PLACEMENT", "RESILIENCE"],
        &body,
    )
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::model::{FleetNode, NodeId, PlacedJob};

    fn object(name: &str, status: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "automanager.norsk.video/v1alpha1",
            "kind": "NorskNode",
            "metadata": {"name": name},
            "spec": {"nodeId": format!("{name}-id")},
            "status": status,
        }))
        .unwrap()
    }

    #[test]
    fn a_norsk_node_this_version_cannot_read_is_skipped_by_name_and_node_id() {
        let readable = object("a", json!({"phase": "running"}));
        let unreadable = object("b", json!({"placement": {"jobs": "not a list"}}));
        let (nodes, skipped) = decode(vec![readable, unreadable]);
        assert_eq!(nodes.len(), 1);
        assert_eq!(skipped.len(), 1);
        assert!(matches!(skipped[0].reason, NodeStatusError::Undecodable(_)));
        let said = PlanWarning::Skipped(skipped[0].clone()).to_string();
        assert!(
            said.starts_with("norsknode/b (node b-id): not a NorskNode as this version reads it")
                && said.ends_with("left out of the plan"),
            "{said}"
        );
    }

    #[test]
    fn the_planned_bundles_own_reservations_are_set_aside_and_no_other() {
        let job = |bundle: Option<&str>| PlacedJob {
            job_id: format!("{}/0/encode", bundle.unwrap_or("loose")).as_str().into(),
            bundle: bundle.map(BundleId::from),
            required_capacity: 2.0,
            ..PlacedJob::default()
        };
        let mut snapshot = FleetSnapshot {
            nodes: vec![FleetNode {
                id: NodeId::from("node-a"),
                pool: None,
                tier: None,
                phase: crate::model::NodePhase::Running,
                cordoned: false,
                unhealthy: false,
                spare: false,
                spare_spec: Default::default(),
                tags: Default::default(),
                inventory: None,
                jobs: vec![job(Some("studio/news")), job(Some("studio/sport")), job(None)],
            }],
            ..FleetSnapshot::default()
        };
        set_aside(&mut snapshot, &[(BundleId::from("studio/news"), BundleSpec::default())]);
        let left: Vec<Option<&str>> = snapshot.nodes[0]
            .jobs
            .iter()
            .map(|j| j.bundle.as_ref().map(|b| b.0.as_str()))
            .collect();
        assert_eq!(left, vec![Some("studio/sport"), None]);
    }
}
