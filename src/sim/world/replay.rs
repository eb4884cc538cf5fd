//! The snapshot an event stream begins with: every node (starting or
//! started as its phase says, with its inventory and, when stopping, its
//! stopping reason), every bundle, every job with its history, prepared
//! instances and pending interruption notices — then
//! `initial_data_complete`. A client that hydrates from it knows what a
//! client that watched from the start knows.

use super::{InstancePhase, World, node_ref};
use crate::manager::proto::manager::{self as pb, event_stream_event::Event, provider_health};
use crate::model::NodePhase;

impl World {
    /// The snapshot, ending with `initial_data_complete`.
    pub fn snapshot_events(&self) -> Vec<pb::EventStreamEvent> {
        let mut events = Vec::new();
        for (node_id, node) in &self.nodes {
            let metadata = Some(node.metadata.clone());
            // A stopping node is replayed as what it was before it began
            // to stop (started, or still starting), then its stopping.
            events.push(match &node.running {
                Some(running) => Event::NodeStarted(pb::NodeStarted {
                    node_metadata: metadata,
                    running_node_metadata: Some(running.clone()),
                }),
                None => Event::NodeStarting(pb::NodeStarting {
                    node_metadata: metadata,
                }),
            });
            if let Some(inventory) = &node.inventory {
                events.push(Event::NodeInventory(pb::NodeInventoryUpdated {
                    inventory: Some(inventory.clone()),
                }));
            }
            if node.phase == NodePhase::Stopping {
                events.push(Event::NodeStopping(pb::NodeStopping {
                    node_id: node_ref(node_id),
                    reason: node.stopping_reason.map_or(0, |r| r as i32),
                }));
            }
        }
        for bundle in self.bundles.values() {
            events.push(Event::BundleUpdated(pb::BundleUpdated {
                bundle: Some(bundle.clone()),
            }));
        }
        for job in self.jobs.values() {
            events.push(super::jobs::job_event(job));
        }
        for ((job_id, role), instance) in &self.instances {
            if instance.phase == InstancePhase::Prepared {
                events.push(Event::JobPrepared(pb::JobPrepared {
                    job_key: Some(super::instances::active_key(job_id, role)),
                    node_id: node_ref(&instance.node_id),
                }));
            }
        }
        for node in self.nodes.values() {
            if let (Some(notice), NodePhase::Starting | NodePhase::Running) = (&node.interruption, node.phase) {
                events.push(Event::NodeInterruptionNotice(notice.clone()));
            }
        }
        events.push(Event::InitialDataComplete(pb::InitialDataComplete {
            health: self.provider_health(),
        }));
        events
            .into_iter()
            .map(|event| pb::EventStreamEvent { event: Some(event) })
            .collect()
    }

    /// Every catalogue region (OCI: availability domain) is healthy.
    fn provider_health(&self) -> Vec<pb::ProviderHealth> {
        let aws = pb::AwsHealth {
            region_health: self
                .catalog
                .aws
                .regions
                .iter()
                .map(|r| pb::AwsRegionHealth {
                    region: r.name.clone(),
                    health: pb::Health::Healthy as i32,
                })
                .collect(),
        };
        let oci = pb::OciHealth {
            region_health: self
                .catalog
                .oci
                .regions
                .iter()
                .flat_map(|r| r.zones.iter())
                .map(|z| pb::OciRegionHealth {
                    availability_domain: z.clone(),
                    health: pb::Health::Healthy as i32,
                })
                .collect(),
        };
        vec![
            pb::ProviderHealth {
                health: Some(provider_health::Health::Aws(aws)),
            },
            pb::ProviderHealth {
                health: Some(provider_health::Health::Oci(oci)),
            },
        ]
    }
}
