//! `cordon` / `uncordon`: `NorskNode.spec.cordoned`, like a Node's `unschedulable`. A node is
//! named by its resource name or by its Manager node id (`spec.nodeId`), whichever is at hand.

use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::crd::NorskNode;

use super::PluginError;

/// The NorskNode `node` names: by resource name, else by `spec.nodeId`.
async fn find(client: Client, node: &str) -> Result<NorskNode, PluginError> {
    let api: Api<NorskNode> = Api::all(client);
    if let Some(found) = api
        .get_opt(node)
        .await
        .map_err(PluginError::request(format!("get norsknode {node}")))?
    {
        return Ok(found);
    }
    api.list(&ListParams::default())
        .await
        .map_err(PluginError::request("list norsknodes"))?
        .items
        .into_iter()
        .find(|n| n.spec.node_id == node)
        .ok_or_else(|| PluginError::UnknownNode(node.to_owned()))
}

/// The Manager node id of `node` (a resource name or already a node id).
pub async fn node_id(client: Client, node: &str) -> Result<String, PluginError> {
    Ok(find(client, node).await?.spec.node_id)
}

/// Sets `spec.cordoned` of `node`; returns the resource name.
pub async fn set_cordoned(client: Client, node: &str, cordoned: bool) -> Result<String, PluginError> {
    let name = find(client.clone(), node).await?.name_any();
    let api: Api<NorskNode> = Api::all(client);
    // A merge patch of the one field: the rest of the spec (the spare spec) is someone
    // else's, and the operator owns the status.
    api.patch(
        &name,
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": {"cordoned": cordoned}})),
    )
    .await
    .map_err(PluginError::request(format!("patch norsknode {name}")))?;
    Ok(name)
}
