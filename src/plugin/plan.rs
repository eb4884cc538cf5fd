//! `plan` and `explain`: the placement engine on the cluster's `PlacementPool`s,
//! `HotSparePolicy`s and `Bundle`s and a fleet snapshot — what placement would decide now,
//! printed as `norsk-auto-manager plan` prints it — and the last placement the operator
//! recorded in a bundle's status. Nothing is written.

use std::path::Path;

use kube::api::ListParams;
use kube::{Api, Client, ResourceExt};

use crate::cli::plan::render::columns;
use crate::cli::plan::{InputError, Output, PlanCommandError, Sources, input, plan_rows, render_rows};
use crate::crd::{Bundle, HotSparePolicy, PlacementPool};
use crate::model::{BundleId, BundleSpec};

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
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Vec<K>, PlanError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| PlanError::List { what, source })
}

/// The namespace's bundles (those named in `only`, when any) in creation order: the order
/// the operator first placed them in.
async fn bundles(client: Client, namespace: &str, only: &[String]) -> Result<Vec<(BundleId, BundleSpec)>, PlanError> {
    let mut found = list(Api::<Bundle>::namespaced(client, namespace), "bundles").await?;
    found.sort_by(|a, b| {
        (a.metadata.creation_timestamp.as_ref().map(|t| t.0), a.name_any())
            .cmp(&(b.metadata.creation_timestamp.as_ref().map(|t| t.0), b.name_any()))
    });
    if let Some(missing) = only.iter().find(|n| !found.iter().any(|b| &b.name_any() == *n)) {
        return Err(PlanError::UnknownBundle(missing.clone(), namespace.to_owned()));
    }
    Ok(found
        .into_iter()
        .filter(|b| only.is_empty() || only.contains(&b.name_any()))
        .map(|b| (b.bundle_id(), b.spec.0))
        .collect())
}

async fn rows(
    client: Client,
    namespace: &str,
    fleet: &Path,
    only: &[String],
    explain: bool,
) -> Result<Vec<crate::placement::PlanRow>, PlanError> {
    let pools = list(Api::<PlacementPool>::all(client.clone()), "placementpools").await?;
    let spares = list(Api::<HotSparePolicy>::all(client.clone()), "hotsparepolicies").await?;
    let bundles = bundles(client, namespace, only).await?;
    let snapshot = input::read_fleet(fleet)?;
    let sources = Sources {
        settings: "the cluster's PlacementPools and HotSparePolicies".to_owned(),
        fleet: fleet.to_owned(),
    };
    Ok(plan_rows(
        pools.iter().map(PlacementPool::to_model).collect(),
        &spares.into_iter().map(|p| p.spec.0).collect::<Vec<_>>(),
        &snapshot,
        &bundles,
        explain,
        &sources,
    )?)
}

/// The plan of the namespace's bundles (or `only` those), rendered as `output`.
pub async fn plan(
    client: Client,
    namespace: &str,
    fleet: &Path,
    only: &[String],
    output: Output,
) -> Result<String, PlanError> {
    let rows = rows(client, namespace, fleet, only, false).await?;
    Ok(render_rows(&rows, output)?)
}

/// Why `bundle`'s jobs (or only `job`) are where they are: the last placement the operator
/// recorded in the bundle's status, job by job; with a fleet snapshot, also the placement
/// engine's trace against it, node by node.
pub async fn explain(
    client: Client,
    namespace: &str,
    fleet: Option<&Path>,
    bundle: &str,
    job: Option<&str>,
) -> Result<String, PlanError> {
    let api: Api<Bundle> = Api::namespaced(client.clone(), namespace);
    let found = api
        .get_opt(bundle)
        .await
        .map_err(|source| PlanError::List {
            what: "bundles",
            source,
        })?
        .ok_or_else(|| PlanError::UnknownBundle(bundle.to_owned(), namespace.to_owned()))?;
    let mut out = last_placements(&found, job);
    if let Some(fleet) = fleet {
        let rows = rows(client, namespace, fleet, &[bundle.to_owned()], true).await?;
        let rows: Vec<_> = rows
            .into_iter()
            .filter(|r| job.is_none_or(|j| r.job_name == j))
            .collect();
        out.push_str("\nPlaced again now, on the fleet snapshot:\n");
        out.push_str(&render_rows(&rows, Output::Table)?);
    }
    Ok(out)
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
                j.state.clone(),
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
