//! What Manager's history of a job says of its instances: which are open,
//! which live and in what phase, and since when one has existed.

use crate::model::{InstanceKey, JobHistoryEntry, NodeId, UnixMillis};

use super::binding::BindingPhase;

/// When instance `key` of a job on `node` was created, by its history (the
/// start of time if it does not say).
pub(super) fn instance_since(history: &[JobHistoryEntry], key: &InstanceKey, node: &NodeId) -> UnixMillis {
    let mut since = None;
    for entry in history {
        match entry {
            JobHistoryEntry::Provisioned {
                at,
                role,
                node_id: Some(n),
            }
            | JobHistoryEntry::Running {
                at,
                role,
                node_id: Some(n),
            } if role == key && n == node => {
                since.get_or_insert(at.unwrap_or(UnixMillis::MIN));
            }
            JobHistoryEntry::Stopping { role, node_id, .. } | JobHistoryEntry::Stopped { role, node_id, .. }
                if role == key && node_id.as_ref().is_none_or(|n| n == node) =>
            {
                since = None;
            }
            _ => {}
        }
    }
    since.unwrap_or(UnixMillis::MIN)
}

/// The instances a job's history leaves open (created or running, not
/// stopping or stopped since), oldest first.
pub(super) fn open_instances(history: &[JobHistoryEntry]) -> Vec<(InstanceKey, NodeId)> {
    let mut open: Vec<(InstanceKey, NodeId)> = Vec::new();
    for entry in history {
        match entry {
            JobHistoryEntry::Provisioned {
                role,
                node_id: Some(node),
                ..
            }
            | JobHistoryEntry::Running {
                role,
                node_id: Some(node),
                ..
            } if !open.iter().any(|(r, n)| r == role && n == node) => open.push((role.clone(), node.clone())),
            JobHistoryEntry::Stopping { role, node_id, .. } | JobHistoryEntry::Stopped { role, node_id, .. } => {
                open.retain(|(r, n)| !(r == role && node_id.as_ref().is_none_or(|id| id == n)));
            }
            _ => {}
        }
    }
    open
}

/// The instances live at the end of `history` (provisioned or running, not
/// stopping or stopped since), each with its phase, oldest started first.
pub(super) fn live_instances(history: &[JobHistoryEntry]) -> Vec<(InstanceKey, NodeId, BindingPhase)> {
    let mut live: Vec<(InstanceKey, NodeId, BindingPhase)> = Vec::new();
    for entry in history {
        match entry {
            JobHistoryEntry::Provisioned {
                role, node_id: Some(n), ..
            }
            | JobHistoryEntry::Running {
                role, node_id: Some(n), ..
            } => {
                let phase = match entry {
                    JobHistoryEntry::Running { .. } => BindingPhase::Running,
                    _ => BindingPhase::Dispatched,
                };
                live.retain(|(k, at, _)| !(k == role && at == n));
                live.push((role.clone(), n.clone(), phase));
            }
            JobHistoryEntry::Stopping { role, node_id, .. } | JobHistoryEntry::Stopped { role, node_id, .. } => {
                live.retain(|(k, at, _)| !(k == role && node_id.as_ref().is_none_or(|n| n == at)));
            }
            _ => {}
        }
    }
    live
}
