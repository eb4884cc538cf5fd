//! Manager's event stream messages.

use super::{
    Notes, WireError, bounded, bundle_from_pb, id, inventory_from_pb, job_id_from_pb, millis_from_pb, node_id_from_pb,
    node_info_from_pb, required, role_from_pb, running_instance_from_pb, runtime_job_from_pb, tags_from_pb, text,
};
use crate::manager::proto::{common as pbc, manager as pb};
use crate::model::{
    AuditEntry, BundleId, ImagePrefetchResult, InterruptionKind, ManagerEvent, MigrationSignal, NodeId, NodeStopReason,
    RejectionCode, RunningInstance,
};

/// The largest handover payload accepted (the payload is opaque and
/// relayed, so it is bounded rather than interpreted).
pub const MAX_PAYLOAD_BYTES: usize = 1024 * 1024;

/// A rejection code from the wire; unspecified and unknown values are kept
/// as `Unknown` (a retryable rejection, never mistaken for an invalid spec).
pub fn rejection_code_from_pb(value: i32) -> RejectionCode {
    match pb::JobRejectionCode::try_from(value) {
        Ok(pb::JobRejectionCode::JobRejectedInvalidSpec) => RejectionCode::InvalidSpec,
        Ok(pb::JobRejectionCode::JobRejectedInsufficientCapacity) => RejectionCode::InsufficientCapacity,
        Ok(pb::JobRejectionCode::JobRejectedPortInUse) => RejectionCode::PortInUse,
        Ok(pb::JobRejectionCode::JobRejectedGpuUnavailable) => RejectionCode::GpuUnavailable,
        Ok(pb::JobRejectionCode::JobRejectedImageUnavailable) => RejectionCode::ImageUnavailable,
        Ok(pb::JobRejectionCode::JobRejectedNodeShuttingDown) => RejectionCode::NodeShuttingDown,
        Ok(pb::JobRejectionCode::JobRejectedUnspecified) | Err(_) => RejectionCode::Unknown(value),
    }
}

/// An interruption kind from the wire.
pub fn interruption_kind_from_pb(value: i32) -> InterruptionKind {
    match pb::InterruptionKind::try_from(value) {
        Ok(pb::InterruptionKind::SpotInterruption) => InterruptionKind::SpotInterruption,
        Ok(pb::InterruptionKind::Rebalance) => InterruptionKind::Rebalance,
        Ok(pb::InterruptionKind::Unknown) | Err(_) => InterruptionKind::Unknown(value),
    }
}

fn node_stop_reason(value: i32) -> NodeStopReason {
    use pb::node_stopping::Reason as R;
    match R::try_from(value) {
        Ok(R::CreateFailed) => NodeStopReason::CreateFailed,
        Ok(R::PendingTimeExceeded) => NodeStopReason::PendingTimeExceeded,
        Ok(R::StartupTimeExceeded) => NodeStopReason::StartupTimeExceeded,
        Ok(R::InitialisationHealthPingTimeExceeded) => NodeStopReason::InitialisationHealthPingTimeExceeded,
        Ok(R::HealthPingTimeExceeded) => NodeStopReason::HealthPingTimeExceeded,
        Ok(R::DuplicateJob) => NodeStopReason::DuplicateJob,
        Ok(R::ProviderStop) => NodeStopReason::ProviderStop,
        Ok(R::ProviderTerminate) => NodeStopReason::ProviderTerminate,
        Ok(R::UserRequested) => NodeStopReason::UserRequested,
        Ok(R::UnknownNode) => NodeStopReason::UnknownNode,
        Err(_) => NodeStopReason::Unknown(value),
    }
}

fn job_key(
    message: &'static str,
    key: Option<&pbc::ActiveJobKey>,
) -> Result<(crate::model::JobId, crate::model::InstanceKey), WireError> {
    let key = required(message, "job_key", key)?;
    Ok((
        job_id_from_pb("ActiveJobKey", "jobId", key.job_id.as_ref())?,
        role_from_pb("ActiveJobKey", &key.role)?,
    ))
}

/// One event from Manager's stream in domain form. An event whose oneof
/// case this build does not know is `ManagerEvent::Unknown`; one that cannot
/// be read is a [`WireError`] for the caller to report before going on.
pub fn event_from_pb(event: &pb::EventStreamEvent, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    use pb::event_stream_event::Event as E;
    let Some(event) = &event.event else {
        return Ok(ManagerEvent::Unknown);
    };
    Ok(match event {
        E::NodeRunning(n) => node_running(n)?,
        E::JobActive(j) => ManagerEvent::JobActive(runtime_job_from_pb(j.job_with_history.as_ref(), notes)?),
        E::JobPending(j) => ManagerEvent::JobPending(runtime_job_from_pb(j.job_with_history.as_ref(), notes)?),
        E::JobUpdated(j) => ManagerEvent::JobUpdated(runtime_job_from_pb(j.job_with_history.as_ref(), notes)?),
        E::JobOutOfWindow(j) => ManagerEvent::JobOutOfWindow(runtime_job_from_pb(j.job_with_history.as_ref(), notes)?),
        E::JobDeleted(d) => ManagerEvent::JobDeleted(job_id_from_pb("JobDeleted", "jobId", d.job_id.as_ref())?),
        E::InitialDataComplete(_) => ManagerEvent::InitialDataComplete,
        E::NodeStarting(n) => ManagerEvent::NodeStarting(node_info_from_pb("NodeStarting", n.node_metadata.as_ref())?),
        E::NodeStarted(n) => ManagerEvent::NodeStarted(node_info_from_pb("NodeStarted", n.node_metadata.as_ref())?),
        E::NodeStopping(n) => ManagerEvent::NodeStopping {
            node_id: node_id_from_pb("NodeStopping", "node_id", n.node_id.as_ref())?,
            reason: node_stop_reason(n.reason),
        },
        E::NodeStopped(n) => ManagerEvent::NodeStopped(node_id_from_pb("NodeStopped", "node_id", n.node_id.as_ref())?),
        E::PhysicalNodeConnected(p) => physical_node_connected(p)?,
        E::ProviderHealthChange(_) => ManagerEvent::ProviderHealthChange,
        E::JobInfo(info) => job_info(info, notes)?,
        E::BundleUpdated(b) => {
            let bundle = required("BundleUpdated", "bundle", b.bundle.as_ref())?;
            ManagerEvent::BundleUpdated(bundle_from_pb(bundle, notes)?)
        }
        E::BundleDeleted(b) => ManagerEvent::BundleDeleted(BundleId(id("BundleDeleted", "bundle_id", &b.bundle_id)?)),
        E::NodeInventory(n) => {
            let inv = required("NodeInventoryUpdated", "inventory", n.inventory.as_ref())?;
            let (node_id, inventory) = inventory_from_pb(inv, notes)?;
            ManagerEvent::NodeInventory { node_id, inventory }
        }
        E::JobRejected(r) => job_rejected(r, notes)?,
        E::JobPrepared(p) => {
            let (job_id, role) = job_key("JobPrepared", p.job_key.as_ref())?;
            ManagerEvent::JobPrepared {
                job_id,
                role,
                node_id: node_id_from_pb("JobPrepared", "node_id", p.node_id.as_ref())?,
            }
        }
        E::MigrationSignal(m) => migration_signal(m, notes)?,
        E::NodeInterruptionNotice(n) => ManagerEvent::NodeInterruptionNotice {
            node_id: node_id_from_pb("NodeInterruptionNotice", "node_id", n.node_id.as_ref())?,
            kind: interruption_kind_from_pb(n.kind),
            deadline: millis_from_pb(n.deadline.as_ref()),
            noticed_at: millis_from_pb(n.noticed_at.as_ref()),
        },
        E::ImagesPrefetched(p) => images_prefetched(p, notes)?,
        E::AuditAppended(a) => audit_appended(a, notes)?,
        E::NodeTagsUpdated(t) => ManagerEvent::NodeTagsUpdated {
            node_id: node_id_from_pb("NodeTagsUpdated", "node_id", t.node_id.as_ref())?,
            tags: tags_from_pb("NodeTagsUpdated", &t.tags)?,
        },
    })
}

/// The job instances a node runs, each read on its own; the caller
/// bounds their number first.
fn running_instances(instances: &[pb::RunningJob]) -> Result<Vec<RunningInstance>, WireError> {
    instances.iter().map(running_instance_from_pb).collect()
}

/// A cloud node running, with the job instances it runs.
fn node_running(n: &pb::NodeRunning) -> Result<ManagerEvent, WireError> {
    bounded("NodeRunning", "instances", n.instances.len())?;
    Ok(ManagerEvent::NodeRunning {
        node: node_info_from_pb("NodeRunning", n.node_metadata.as_ref())?,
        instances: running_instances(&n.instances)?,
    })
}

/// A cluster (local-servers) node connected, with its tags and the job
/// instances it runs.
fn physical_node_connected(p: &pb::PhysicalNodeConnected) -> Result<ManagerEvent, WireError> {
    let node = required("PhysicalNodeConnected", "node", p.node.as_ref())?;
    bounded("PhysicalNodeConnected", "instances", p.instances.len())?;
    Ok(ManagerEvent::PhysicalNodeConnected {
        node_id: NodeId(id("PhysicalNode", "id", &node.id)?),
        tags: tags_from_pb("PhysicalNode", &node.tags)?,
        instances: running_instances(&p.instances)?,
    })
}

/// A job's informational message, summed up in one line of text.
fn job_info(info: &pbc::JobInfoMessage, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    use pbc::job_info_message::Message as M;
    let (job_id, role) = job_key("JobInfoMessage", info.job_key.as_ref())?;
    let summary = match &info.message {
        Some(M::ServiceStarted(s)) => format!("service {} started", s.service_name),
        Some(M::ServiceRestarting(s)) => format!("service {} restarting", s.service_name),
        Some(M::ContainerEvent(c)) => format!("{}: {}", c.service_name, c.text),
        Some(M::ComposeMessage(c)) => c.text.clone(),
        None => String::new(),
    };
    Ok(ManagerEvent::JobInfo {
        job_id,
        role,
        text: text(notes, "JobInfoMessage", "message", &summary),
    })
}

/// A worker's refusal of a job start, with the node's inventory when it
/// can be read.
fn job_rejected(r: &pb::JobRejected, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    let (job_id, role) = job_key("JobRejected", r.job_key.as_ref())?;
    // The inventory is informational here; an unreadable one is dropped
    // with a note rather than losing the rejection itself.
    let inventory = match r.inventory.as_ref().map(|i| inventory_from_pb(i, notes)).transpose() {
        Ok(inv) => inv.map(|(_, inv)| inv),
        Err(e) => {
            super::note(notes, "JobRejected", "inventory", format!("dropped: {e}"));
            None
        }
    };
    Ok(ManagerEvent::JobRejected {
        job_id,
        role,
        node_id: node_id_from_pb("JobRejected", "node_id", r.node_id.as_ref())?,
        code: rejection_code_from_pb(r.code),
        detail: text(notes, "JobRejected", "detail", &r.detail),
        inventory,
    })
}

/// A step of a migration's handover; a payload over
/// [`MAX_PAYLOAD_BYTES`] is refused rather than relayed.
fn migration_signal(m: &pb::MigrationSignalEvent, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    use pb::migration_signal_event::Signal as S;
    const MSG: &str = "MigrationSignalEvent";
    if matches!(&m.signal, Some(S::TargetReady(p)) if p.len() > MAX_PAYLOAD_BYTES) {
        return Err(WireError::Invalid {
            message: MSG,
            field: "target_ready",
            reason: "payload over 1 MiB".into(),
        });
    }
    Ok(ManagerEvent::MigrationSignal {
        migration_id: id(MSG, "migration_id", &m.migration_id)?,
        job_id: job_id_from_pb(MSG, "job_id", m.job_id.as_ref())?,
        from_key: role_from_pb(MSG, &m.from_key)?,
        signal: match &m.signal {
            Some(S::TargetReady(payload)) => MigrationSignal::TargetReady(payload.clone()),
            Some(S::SourceStoppedAt(position)) => {
                MigrationSignal::SourceStoppedAt(text(notes, MSG, "source_stopped_at", position))
            }
            Some(S::TargetApplied(_)) => MigrationSignal::TargetApplied,
            Some(S::Refused(why)) => MigrationSignal::Refused(text(notes, MSG, "refused", why)),
            None => MigrationSignal::Unknown,
        },
    })
}

/// How a node's image prefetch went, image by image.
fn images_prefetched(p: &pb::ImagesPrefetched, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    bounded("ImagesPrefetched", "results", p.results.len())?;
    Ok(ManagerEvent::ImagesPrefetched {
        node_id: node_id_from_pb("ImagesPrefetched", "node_id", p.node_id.as_ref())?,
        results: p
            .results
            .iter()
            .map(|r| ImagePrefetchResult {
                image: r.image.clone(),
                ok: r.ok,
                error: (!r.error.is_empty()).then(|| text(notes, "ImagePrefetchResult", "error", &r.error)),
            })
            .collect(),
    })
}

/// An entry appended to Manager's audit log.
fn audit_appended(a: &pb::AuditAppended, notes: &mut Notes) -> Result<ManagerEvent, WireError> {
    let entry = required("AuditAppended", "entry", a.entry.as_ref())?;
    bounded("AuditEntry", "details", entry.details.len())?;
    Ok(ManagerEvent::AuditAppended(AuditEntry {
        at: millis_from_pb(entry.timestamp.as_ref()),
        actor: text(notes, "AuditEntry", "actor", &entry.actor),
        action: text(notes, "AuditEntry", "action", &entry.action),
        subject: text(notes, "AuditEntry", "subject", &entry.subject),
        details: entry.details.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
    }))
}

#[cfg(test)]
mod tests {
    use prost::Message;

    use super::*;

    #[test]
    fn an_event_with_an_unknown_oneof_case_is_kept_as_unknown() {
        // Field 999 is not an event case this build knows.
        let mut bytes = Vec::new();
        prost::encoding::string::encode(999, &"future".to_owned(), &mut bytes);
        let pb = pb::EventStreamEvent::decode(bytes.as_slice()).unwrap();
        assert_eq!(event_from_pb(&pb, &mut Notes::new()).unwrap(), ManagerEvent::Unknown);
    }

    #[test]
    fn unknown_enum_values_are_kept_typed() {
        let pb = pb::EventStreamEvent {
            event: Some(pb::event_stream_event::Event::NodeStopping(pb::NodeStopping {
                node_id: Some(pbc::NodeId { node_id: "n".into() }),
                reason: 1234,
            })),
        };
        let ev = event_from_pb(&pb, &mut Notes::new()).unwrap();
        assert_eq!(
            ev,
            ManagerEvent::NodeStopping {
                node_id: NodeId("n".into()),
                reason: NodeStopReason::Unknown(1234)
            }
        );
        assert_eq!(rejection_code_from_pb(0), RejectionCode::Unknown(0));
        assert_eq!(rejection_code_from_pb(1), RejectionCode::InvalidSpec);
    }

    #[test]
    fn an_empty_node_id_is_reported_not_accepted() {
        let pb = pb::EventStreamEvent {
            event: Some(pb::event_stream_event::Event::NodeStopped(pb::NodeStopped {
                node_id: Some(pbc::NodeId::default()),
            })),
        };
        let err = event_from_pb(&pb, &mut Notes::new()).unwrap_err();
        assert_eq!(err.to_string(), "NodeStopped.node_id is invalid: empty id");
    }
}
