//! Node lifecycle: cloud nodes launched against the catalogue and its
//! launch limits, booting into a started node with its inventory, cluster
//! nodes registered with an inventory, terminate, stopping and stopped.
//! Nodes that go away unasked are in `outages`.

use rand::Rng;
use rand::seq::IndexedRandom;

use super::{Launches, PROVISIONING_MS, SimNode, TERMINATE_MS, World, node_id_of, node_ref, required, timestamp};
use crate::manager::proto::manager::{self as pb, event_stream_event::Event, node_stopping};
use crate::manager::proto::{common, sim_admin};
use crate::model::{NodePhase, ProviderKind};
use crate::sim::RequestError;
use crate::sim::catalog::{Architecture, InstanceType};
use crate::sim::error::known;

/// A validated cloud launch.
struct Launch {
    node_id: String,
    tags: std::collections::HashMap<String, String>,
    provider: ProviderKind,
    region: String,
    zone: Option<String>,
    instance_type: InstanceType,
    launch_mode: String,
    /// The root volume asked for (size in GiB, type), when one was.
    root_volume: Option<(u32, String)>,
}

impl World {
    /// `CreateAwsNode`: validated against the catalogue; idempotent on the
    /// node id.
    pub fn create_aws_node(&mut self, req: pb::CreateAwsNodeRequest) -> Result<(), RequestError> {
        let node_id = required(node_id_of(&req.node_id), "node_id")?.to_owned();
        required(&req.region, "region")?;
        required(&req.instance_type, "instance_type")?;
        let provider = &self.catalog.aws;
        if provider.region(&req.region).is_none() {
            return Err(RequestError::UnknownRegion {
                provider: "aws",
                region: req.region,
                known: known(provider.regions.iter().map(|r| r.name.as_str())),
            });
        }
        let instance_type = lookup_type(provider, "aws", &req.instance_type)?;
        self.launch(Launch {
            node_id,
            tags: req.tags,
            provider: ProviderKind::Aws,
            region: req.region,
            zone: None,
            instance_type,
            launch_mode: req.launch_mode,
            root_volume: (req.root_volume_gib > 0 || !req.root_volume_type.is_empty())
                .then_some((req.root_volume_gib, req.root_volume_type)),
        })
    }

    /// `CreateOciNode`: a region, an availability domain, or both (the
    /// domain must then be one of the region's). With a region alone the
    /// domain is chosen like an AWS zone: a tier names a region, not a
    /// domain.
    pub fn create_oci_node(&mut self, req: pb::CreateOciNodeRequest) -> Result<(), RequestError> {
        let node_id = required(node_id_of(&req.node_id), "node_id")?.to_owned();
        let zone = (!req.availability_domain.is_empty()).then(|| req.availability_domain.clone());
        if zone.is_none() {
            required(&req.region, "availabilityDomain or region")?;
        }
        required(&req.shape, "shape")?;
        let provider = &self.catalog.oci;
        let region = match (&zone, req.region.is_empty()) {
            (Some(zone), true) => provider
                .region_of_zone(zone)
                .ok_or_else(|| RequestError::InvalidField {
                    field: "availabilityDomain",
                    why: format!(
                        "{zone:?} is in no OCI region (known domains: {})",
                        known(provider.regions.iter().flat_map(|r| r.zones.iter().map(String::as_str)))
                    ),
                })?,
            _ => provider
                .region(&req.region)
                .ok_or_else(|| RequestError::UnknownRegion {
                    provider: "oci",
                    region: req.region.clone(),
                    known: known(provider.regions.iter().map(|r| r.name.as_str())),
                })?,
        };
        if let Some(zone) = &zone
            && !region.zones.contains(zone)
        {
            return Err(RequestError::UnknownZone {
                zone: zone.clone(),
                region: region.name.clone(),
                known: known(region.zones.iter().map(String::as_str)),
            });
        }
        let region = region.name.clone();
        let instance_type = lookup_type(provider, "oci", &req.shape)?;
        self.launch(Launch {
            node_id,
            tags: req.tags,
            provider: ProviderKind::Oci,
            region,
            zone,
            instance_type,
            launch_mode: req.launch_mode,
            root_volume: None,
        })
    }

    fn launch(&mut self, launch: Launch) -> Result<(), RequestError> {
        if let Some(existing) = self.nodes.get(&launch.node_id) {
            // Idempotent on the node id: a repeated create (a new leader, a
            // retry after a lost answer) creates nothing.
            if existing.provider == launch.provider
                && existing.region == launch.region
                && existing.instance_type == launch.instance_type.name
            {
                return Ok(());
            }
            return Err(RequestError::AlreadyExists {
                what: format!("node {:?}", launch.node_id),
                why: format!(
                    "it is a {} {} in {}",
                    existing.provider.as_str(),
                    existing.instance_type,
                    existing.region
                ),
            });
        }
        let key = (launch.region.clone(), launch.instance_type.name.clone());
        let limit = launch.instance_type.launch_limit.map(i64::from);
        let launches = self.launches.entry(key).or_insert(Launches { limit, in_use: 0 });
        if launches.limit.is_some_and(|limit| launches.in_use >= limit) {
            return Err(RequestError::InsufficientInstanceCapacity {
                region: launch.region,
                instance_type: launch.instance_type.name,
            });
        }
        launches.in_use += 1;
        let zone = match launch.zone {
            Some(zone) => zone,
            None => self.pick_zone(launch.provider, &launch.region),
        };
        let arch = match launch.instance_type.architecture {
            Architecture::X86_64 => common::Architecture::X8664,
            Architecture::Aarch64 => common::Architecture::Aarch64,
        };
        let provider_metadata = match launch.provider {
            ProviderKind::Aws => common::provider_metadata::Metadata::Aws(common::AwsMetadata {
                instance_type: launch.instance_type.name.clone(),
                region: launch.region.clone(),
                architecture: arch as i32,
            }),
            _ => common::provider_metadata::Metadata::Oci(common::OciMetadata {}),
        };
        let metadata = common::NodeMetadata {
            node_id: node_ref(&launch.node_id),
            tags: launch.tags,
            created_at: Some(timestamp(self.now())),
            provider_metadata: Some(common::ProviderMetadata {
                metadata: Some(provider_metadata),
            }),
        };
        let node = SimNode::starting(
            metadata.clone(),
            launch.provider,
            launch.region.clone(),
            zone,
            launch.instance_type.name.clone(),
            launch.launch_mode,
        );
        let node = SimNode {
            root_volume: launch.root_volume,
            ..node
        };
        self.nodes.insert(launch.node_id.clone(), node);
        self.emit(Event::NodeStarting(pb::NodeStarting {
            node_metadata: Some(metadata),
        }));
        self.audit(
            "node.create",
            &launch.node_id,
            &[
                ("provider", launch.provider.as_str().to_owned()),
                ("region", launch.region),
                ("instanceType", launch.instance_type.name),
            ],
        );
        let boot = self.delay(PROVISIONING_MS);
        self.schedule(boot, super::Action::NodeBooted(launch.node_id));
        Ok(())
    }

    fn pick_zone(&mut self, kind: ProviderKind, region: &str) -> String {
        let zones = self
            .catalog
            .provider(kind)
            .and_then(|p| p.region(region))
            .map(|r| r.zones.clone())
            .unwrap_or_default();
        zones.choose(&mut self.rng).cloned().unwrap_or_default()
    }

    /// A cloud node finished booting: `node_started`, then its inventory.
    pub(super) fn node_booted(&mut self, node_id: &str) {
        let Some(node) = self.nodes.get(node_id) else { return };
        // A node killed while booting never reports in.
        if node.phase != NodePhase::Starting || node.silent {
            return;
        }
        let (kind, region, zone, type_name) = (
            node.provider,
            node.region.clone(),
            node.zone.clone(),
            node.instance_type.clone(),
        );
        let Some(instance_type) = self
            .catalog
            .provider(kind)
            .and_then(|p| p.instance_type(&type_name))
            .cloned()
        else {
            return;
        };
        let running = self.running_metadata(kind, &region);
        let inventory = pb::NodeInventory {
            node_id: node_ref(node_id),
            provider: provider_kind(kind) as i32,
            region,
            availability_zone: zone,
            instance_type: type_name,
            total_capacity: f64::from(instance_type.vcpus),
            total_cores: instance_type.cores,
            utilization_cap: 1.0,
            reserved_capacity: 0.0,
            gpus: instance_type
                .gpu
                .iter()
                .flat_map(|g| {
                    (0..g.count).map(|_| pb::GpuDevice {
                        model: g.model.clone(),
                        total_capacity: 1.0,
                    })
                })
                .collect(),
            capabilities: instance_type.capabilities.clone(),
            images: vec![],
            nics: vec![pb::Nic {
                name: "eth0".to_owned(),
                speed_mbps: instance_type.nic_mbps,
            }],
        };
        self.start_node(node_id, running, inventory);
    }

    fn start_node(&mut self, node_id: &str, running: common::RunningNodeMetadata, inventory: pb::NodeInventory) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        node.phase = NodePhase::Running;
        node.running = Some(running.clone());
        node.inventory = Some(inventory.clone());
        let metadata = node.metadata.clone();
        self.emit(Event::NodeStarted(pb::NodeStarted {
            node_metadata: Some(metadata),
            running_node_metadata: Some(running),
        }));
        self.emit(Event::NodeInventory(pb::NodeInventoryUpdated {
            inventory: Some(inventory),
        }));
    }

    /// Seeded addresses and an instance id for a node that just started.
    fn running_metadata(&mut self, kind: ProviderKind, region: &str) -> common::RunningNodeMetadata {
        let octets: [u8; 3] = [self.rng.random(), self.rng.random(), self.rng.random()];
        let private_ip = format!("10.{}.{}.{}", octets[0], octets[1], octets[2].max(1));
        let public_ip = format!("203.0.113.{}", octets[2].max(1));
        let dashed = private_ip.replace('.', "-");
        let instance = match kind {
            ProviderKind::Aws => {
                let id: u64 = self.rng.random();
                Some(common::running_node_provider_metadata::Instance::Aws(
                    common::RunningAwsMetadata {
                        instance_id: format!("i-0{id:016x}"),
                    },
                ))
            }
            ProviderKind::Oci => Some(common::running_node_provider_metadata::Instance::Oci(
                common::RunningOciMetadata {},
            )),
            ProviderKind::LocalServers => None,
        };
        common::RunningNodeMetadata {
            public_dns_name: match kind {
                ProviderKind::LocalServers => String::new(),
                _ => format!("ec2-{}.{region}.compute.example", public_ip.replace('.', "-")),
            },
            private_dns_name: format!("ip-{dashed}.{region}.internal"),
            private_ip_address: private_ip,
            provider_metadata: instance.map(|instance| common::RunningNodeProviderMetadata {
                instance: Some(instance),
            }),
            public_ip_address: match kind {
                ProviderKind::LocalServers => String::new(),
                _ => public_ip,
            },
        }
    }

    /// `register-node` / `--cluster`: a cluster (`local-servers`) node that
    /// connects and starts at once with the inventory it was given.
    pub fn register_node(&mut self, req: sim_admin::RegisterNodeRequest) -> Result<(), RequestError> {
        let node_id = required(&req.node_id, "node_id")?.to_owned();
        let mut inventory = req.inventory.ok_or(RequestError::MissingField("inventory"))?;
        inventory.node_id = node_ref(&node_id);
        if inventory.provider == pb::ProviderKind::Unknown as i32 {
            inventory.provider = pb::ProviderKind::LocalServers as i32;
        }
        if let Some(existing) = self.nodes.get(&node_id) {
            if existing.metadata.tags == req.tags && existing.inventory.as_ref() == Some(&inventory) {
                return Ok(());
            }
            return Err(RequestError::AlreadyExists {
                what: format!("node {node_id:?}"),
                why: "it is registered with other tags or another inventory".to_owned(),
            });
        }
        let metadata = common::NodeMetadata {
            node_id: node_ref(&node_id),
            tags: req.tags,
            created_at: Some(timestamp(self.now())),
            provider_metadata: None,
        };
        self.nodes.insert(
            node_id.clone(),
            SimNode::starting(
                metadata.clone(),
                ProviderKind::LocalServers,
                inventory.region.clone(),
                inventory.availability_zone.clone(),
                inventory.instance_type.clone(),
                String::new(),
            ),
        );
        self.emit(Event::NodeStarting(pb::NodeStarting {
            node_metadata: Some(metadata),
        }));
        let region = inventory.region.clone();
        let running = self.running_metadata(ProviderKind::LocalServers, &region);
        self.start_node(&node_id, running, inventory);
        Ok(())
    }

    /// `TerminateNode`: stopping (user requested) now, its instances
    /// stopping, stopped after the provider's shutdown. Idempotent.
    pub fn terminate_node(&mut self, node_id: &str) -> Result<(), RequestError> {
        let node = self.node(node_id)?;
        if node.phase == NodePhase::Stopping {
            return Ok(());
        }
        self.audit("node.terminate", node_id, &[]);
        self.begin_stopping(node_id, node_stopping::Reason::UserRequested, true);
        let after = self.delay(TERMINATE_MS);
        self.schedule(after, super::Action::NodeGone(node_id.to_owned()));
        Ok(())
    }

    /// `UpdatePhysicalNode`: the simulator runs no daemons to upgrade, so it
    /// only checks the node exists.
    pub fn update_physical_node(&mut self, node_id: &str) -> Result<(), RequestError> {
        self.node(node_id).map(|_| ())
    }

    /// `NodeStopping` now; with `instances`, every instance on the node
    /// starts stopping as the node is terminated.
    pub(super) fn begin_stopping(&mut self, node_id: &str, reason: node_stopping::Reason, instances: bool) {
        let Some(node) = self.nodes.get_mut(node_id) else {
            return;
        };
        node.phase = NodePhase::Stopping;
        node.stopping_reason = Some(reason);
        self.emit(Event::NodeStopping(pb::NodeStopping {
            node_id: node_ref(node_id),
            reason: reason as i32,
        }));
        if instances {
            self.stop_instances_on(node_id);
        }
    }

    /// Manager reports the node stopped: its instances are stopped with it,
    /// its launch capacity is released and Manager forgets it.
    pub(super) fn node_gone(&mut self, node_id: &str) {
        let Some(node) = self.nodes.remove(node_id) else { return };
        if node.provider != ProviderKind::LocalServers
            && let Some(launches) = self
                .launches
                .get_mut(&(node.region.clone(), node.instance_type.clone()))
        {
            launches.in_use = (launches.in_use - 1).max(0);
        }
        self.emit(Event::NodeStopped(pb::NodeStopped {
            node_id: node_ref(node_id),
        }));
        self.drop_instances_on(node_id);
    }

    /// `capacity`: how many more nodes of a type the region can launch
    /// (negative: unlimited).
    pub fn set_capacity(&mut self, req: sim_admin::SetCapacityRequest) -> Result<(), RequestError> {
        let region = required(&req.region, "region")?;
        let type_name = required(&req.instance_type, "instance_type")?;
        let (kind, provider) = self
            .catalog
            .provider_of_region(region)
            .ok_or_else(|| RequestError::UnknownRegion {
                provider: "aws or oci",
                region: region.to_owned(),
                known: known(
                    self.catalog
                        .providers()
                        .into_iter()
                        .flat_map(|(_, p)| p.regions.iter().map(|r| r.name.as_str())),
                ),
            })?;
        let instance_type = lookup_type(provider, kind.as_str(), type_name)?;
        let launches = self
            .launches
            .entry((region.to_owned(), type_name.to_owned()))
            .or_insert(Launches {
                limit: instance_type.launch_limit.map(i64::from),
                in_use: 0,
            });
        launches.limit = (req.available >= 0).then(|| launches.in_use.saturating_add(req.available));
        Ok(())
    }

    /// The node `node_id`, or NOT_FOUND.
    pub(super) fn node(&self, node_id: &str) -> Result<&SimNode, RequestError> {
        let node_id = required(node_id, "node_id")?;
        self.nodes
            .get(node_id)
            .ok_or_else(|| RequestError::UnknownNode(node_id.to_owned()))
    }

    /// The node `node_id` to change, or NOT_FOUND.
    pub(super) fn node_mut(&mut self, node_id: &str) -> Result<&mut SimNode, RequestError> {
        let node_id = required(node_id, "node_id")?;
        self.nodes
            .get_mut(node_id)
            .ok_or_else(|| RequestError::UnknownNode(node_id.to_owned()))
    }

    /// The node, which must be running (a job can only start on a running
    /// node).
    pub(super) fn running_node(&self, node_id: &str) -> Result<&SimNode, RequestError> {
        let node = self.node(node_id)?;
        if node.phase != NodePhase::Running {
            return Err(RequestError::NodeNotRunning {
                node: node_id.to_owned(),
                phase: crate::model::wire_name(&node.phase),
            });
        }
        Ok(node)
    }
}

fn lookup_type(
    provider: &crate::sim::catalog::ProviderCatalog,
    provider_name: &'static str,
    name: &str,
) -> Result<InstanceType, RequestError> {
    provider
        .instance_type(name)
        .cloned()
        .ok_or_else(|| RequestError::UnknownInstanceType {
            provider: provider_name,
            instance_type: name.to_owned(),
            known: known(provider.instance_types.iter().map(|t| t.name.as_str())),
        })
}

/// The wire's provider kind.
pub(crate) fn provider_kind(kind: ProviderKind) -> pb::ProviderKind {
    match kind {
        ProviderKind::Aws => pb::ProviderKind::Aws,
        ProviderKind::Oci => pb::ProviderKind::Oci,
        ProviderKind::LocalServers => pb::ProviderKind::LocalServers,
    }
}
