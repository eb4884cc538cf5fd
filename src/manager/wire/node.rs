//! Nodes: metadata and inventories.

use std::collections::{BTreeMap, HashMap};

use super::{Notes, WireError, bounded, id, millis_from_pb, millis_to_pb, note, required};
use crate::manager::proto::{common as pbc, manager as pb};
use crate::model::{Gpu, Nic, NodeId, NodeInfo, NodeInventory, ProviderKind, ProviderMetadata};

const INVENTORY: &str = "NodeInventory";

/// A `NodeId` message, which must carry a usable id.
pub fn node_id_from_pb(
    message: &'static str,
    field: &'static str,
    value: Option<&pbc::NodeId>,
) -> Result<NodeId, WireError> {
    let value = required(message, field, value)?;
    Ok(NodeId(id(message, field, &value.node_id)?))
}

/// A node id as its wire message.
pub fn node_id_to_pb(node: &NodeId) -> pbc::NodeId {
    pbc::NodeId {
        node_id: node.0.clone(),
    }
}

/// Tags, bounded in count; keys and values are kept verbatim.
pub fn tags_from_pb(
    message: &'static str,
    tags: &HashMap<String, String>,
) -> Result<BTreeMap<String, String>, WireError> {
    bounded(message, "tags", tags.len())?;
    Ok(tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
}

/// Manager's node metadata.
pub fn node_info_from_pb(message: &'static str, meta: Option<&pbc::NodeMetadata>) -> Result<NodeInfo, WireError> {
    let meta = required(message, "nodeMetadata", meta)?;
    let node_id = node_id_from_pb("NodeMetadata", "node_id", meta.node_id.as_ref())?;
    let provider = match meta.provider_metadata.as_ref().and_then(|p| p.metadata.as_ref()) {
        Some(pbc::provider_metadata::Metadata::Aws(aws)) => ProviderMetadata::Aws {
            instance_type: aws.instance_type.clone(),
            region: aws.region.clone(),
        },
        Some(pbc::provider_metadata::Metadata::Test(t)) => ProviderMetadata::Test {
            instance_type: t.instance_type.clone(),
            region: t.region.clone(),
        },
        Some(pbc::provider_metadata::Metadata::Oci(_)) => ProviderMetadata::Oci,
        None => ProviderMetadata::Unknown,
    };
    Ok(NodeInfo {
        node_id,
        tags: tags_from_pb("NodeMetadata", &meta.tags)?,
        created_at: millis_from_pb(meta.created_at.as_ref()),
        provider,
    })
}

/// Node metadata for a node (the simulator's and tests' direction).
pub fn node_info_to_pb(info: &NodeInfo) -> pbc::NodeMetadata {
    let metadata = match &info.provider {
        ProviderMetadata::Aws { instance_type, region } => {
            Some(pbc::provider_metadata::Metadata::Aws(pbc::AwsMetadata {
                instance_type: instance_type.clone(),
                region: region.clone(),
                architecture: pbc::Architecture::X8664 as i32,
            }))
        }
        ProviderMetadata::Test { instance_type, region } => {
            Some(pbc::provider_metadata::Metadata::Test(pbc::AwsMetadata {
                instance_type: instance_type.clone(),
                region: region.clone(),
                architecture: pbc::Architecture::X8664 as i32,
            }))
        }
        ProviderMetadata::Oci => Some(pbc::provider_metadata::Metadata::Oci(pbc::OciMetadata {})),
        ProviderMetadata::Unknown => None,
    };
    pbc::NodeMetadata {
        node_id: Some(node_id_to_pb(&info.node_id)),
        tags: info.tags.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
        created_at: info.created_at.map(millis_to_pb),
        provider_metadata: metadata.map(|m| pbc::ProviderMetadata { metadata: Some(m) }),
    }
}

/// A capacity that must be a finite, non-negative number.
fn total(field: &'static str, value: f64) -> Result<f64, WireError> {
    if value.is_finite() && value >= 0.0 {
        Ok(value)
    } else {
        Err(WireError::Invalid {
            message: INVENTORY,
            field,
            reason: format!("{value} is not a capacity"),
        })
    }
}

/// A capacity that is read as 0 when negative or not a number.
fn lenient(notes: &mut Notes, field: &'static str, value: f64) -> f64 {
    if value.is_finite() && value >= 0.0 {
        value
    } else {
        note(notes, INVENTORY, field, format!("{value} read as 0"));
        0.0
    }
}

/// A worker's inventory. A total capacity that is negative or not a number
/// refuses the whole inventory (the node stays invisible to placement rather
/// than advertise garbage).
pub fn inventory_from_pb(inv: &pb::NodeInventory, notes: &mut Notes) -> Result<(NodeId, NodeInventory), WireError> {
    let node_id = node_id_from_pb(INVENTORY, "node_id", inv.node_id.as_ref())?;
    let kind = match pb::ProviderKind::try_from(inv.provider) {
        Ok(pb::ProviderKind::Aws) => ProviderKind::Aws,
        Ok(pb::ProviderKind::Oci) => ProviderKind::Oci,
        Ok(pb::ProviderKind::LocalServers) => ProviderKind::LocalServers,
        // A node that cannot say what it is gets treated as a cluster node:
        // never provisioned by us, never terminated as single-use.
        Ok(pb::ProviderKind::Unknown) | Err(_) => {
            note(
                notes,
                INVENTORY,
                "provider",
                format!("{} read as local-servers", inv.provider),
            );
            ProviderKind::LocalServers
        }
    };
    let utilization_cap = if inv.utilization_cap > 0.0 && inv.utilization_cap <= 1.0 {
        inv.utilization_cap
    } else {
        // The spec: an absolute, 0, negative or NaN cap is read as 1.
        note(
            notes,
            INVENTORY,
            "utilization_cap",
            format!("{} read as 1", inv.utilization_cap),
        );
        1.0
    };
    for (field, len) in [
        ("gpus", inv.gpus.len()),
        ("capabilities", inv.capabilities.len()),
        ("images", inv.images.len()),
        ("nics", inv.nics.len()),
    ] {
        bounded(INVENTORY, field, len)?;
    }
    let gpus = inv
        .gpus
        .iter()
        .map(|g| Gpu {
            model: g.model.clone(),
            total_capacity: lenient(notes, "gpus.total_capacity", g.total_capacity),
        })
        .collect();
    Ok((
        node_id,
        NodeInventory {
            kind,
            region: inv.region.clone(),
            az: inv.availability_zone.clone(),
            instance_type: inv.instance_type.clone(),
            total_capacity: total("total_capacity", inv.total_capacity)?,
            total_cores: inv.total_cores,
            utilization_cap,
            reserved_capacity: lenient(notes, "reserved_capacity", inv.reserved_capacity),
            capabilities: inv.capabilities.clone(),
            gpus,
            images: inv.images.clone(),
            nics: inv
                .nics
                .iter()
                .map(|n| Nic {
                    name: n.name.clone(),
                    speed_mbps: n.speed_mbps,
                })
                .collect(),
        },
    ))
}

/// An inventory as its wire message.
pub fn inventory_to_pb(node_id: &NodeId, inv: &NodeInventory) -> pb::NodeInventory {
    let provider = match inv.kind {
        ProviderKind::Aws => pb::ProviderKind::Aws,
        ProviderKind::Oci => pb::ProviderKind::Oci,
        ProviderKind::LocalServers => pb::ProviderKind::LocalServers,
    };
    pb::NodeInventory {
        node_id: Some(node_id_to_pb(node_id)),
        provider: provider as i32,
        region: inv.region.clone(),
        availability_zone: inv.az.clone(),
        instance_type: inv.instance_type.clone(),
        total_capacity: inv.total_capacity,
        total_cores: inv.total_cores,
        utilization_cap: inv.utilization_cap,
        reserved_capacity: inv.reserved_capacity,
        gpus: inv
            .gpus
            .iter()
            .map(|g| pb::GpuDevice {
                model: g.model.clone(),
                total_capacity: g.total_capacity,
            })
            .collect(),
        capabilities: inv.capabilities.clone(),
        images: inv.images.clone(),
        nics: inv
            .nics
            .iter()
            .map(|n| pb::Nic {
                name: n.name.clone(),
                speed_mbps: n.speed_mbps,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inventory(cap: f64, total: f64) -> pb::NodeInventory {
        pb::NodeInventory {
            node_id: Some(pbc::NodeId { node_id: "n1".into() }),
            provider: pb::ProviderKind::Aws as i32,
            total_capacity: total,
            utilization_cap: cap,
            ..Default::default()
        }
    }

    #[test]
    fn utilization_cap_outside_zero_to_one_is_read_as_one() {
        for cap in [0.0, -0.5, 4.0, f64::NAN, f64::INFINITY] {
            let mut notes = Notes::new();
            let (_, inv) = inventory_from_pb(&inventory(cap, 4.0), &mut notes).unwrap();
            assert_eq!(inv.utilization_cap, 1.0, "cap {cap}");
            assert_eq!(notes.len(), 1);
        }
        let mut notes = Notes::new();
        let (_, inv) = inventory_from_pb(&inventory(0.75, 4.0), &mut notes).unwrap();
        assert_eq!(inv.utilization_cap, 0.75);
        assert!(notes.is_empty());
    }

    #[test]
    fn a_worker_sending_its_vcpu_count_as_cap_cannot_advertise_cpu_squared() {
        let mut notes = Notes::new();
        let (_, inv) = inventory_from_pb(&inventory(4.0, 4.0), &mut notes).unwrap();
        assert_eq!(inv.usable_capacity(), 4.0);
    }

    #[test]
    fn nan_or_negative_total_capacity_refuses_the_inventory() {
        for total in [f64::NAN, -1.0, f64::NEG_INFINITY] {
            let err = inventory_from_pb(&inventory(1.0, total), &mut Notes::new()).unwrap_err();
            assert!(
                matches!(
                    err,
                    WireError::Invalid {
                        field: "total_capacity",
                        ..
                    }
                ),
                "{err}"
            );
        }
    }

    #[test]
    fn unknown_provider_is_kept_as_a_cluster_node() {
        let mut pb = inventory(1.0, 2.0);
        pb.provider = 77;
        let (_, inv) = inventory_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(inv.kind, ProviderKind::LocalServers);
    }

    #[test]
    fn inventory_round_trips() {
        let mut notes = Notes::new();
        let mut pb = inventory(0.5, 8.0);
        pb.gpus.push(pb::GpuDevice {
            model: "t4".into(),
            total_capacity: 1.0,
        });
        pb.images.push("registry/encoder:1".into());
        let (id, inv) = inventory_from_pb(&pb, &mut notes).unwrap();
        assert_eq!(inventory_to_pb(&id, &inv), pb);
    }
}
