//! Carrying out the core's RPCs through the Manager port, and mapping the
//! client's errors back to the failures the core judges.

use crate::automanager::migration::state::MigrationStep;
use crate::automanager::protocol::{Rpc, RpcFailure, RpcFailureKind};
use crate::manager::client::{CreateNode, RpcError, RpcErrorKind, StartJob};
use crate::manager::port::Port;
use crate::manager::proto::manager as pb;
use crate::manager::wire;
use crate::model::{JobId, MigrationId, ProviderKind, UnixMillis};

pub(super) fn failure(e: RpcError) -> RpcFailure {
    let kind = match e.kind() {
        RpcErrorKind::Transient => RpcFailureKind::Transient,
        RpcErrorKind::InsufficientCapacity => RpcFailureKind::InsufficientCapacity,
        RpcErrorKind::NotFound => RpcFailureKind::NotFound,
        RpcErrorKind::AlreadyExists => RpcFailureKind::AlreadyExists,
        RpcErrorKind::Rejected => RpcFailureKind::Rejected,
    };
    RpcFailure {
        kind,
        message: e.to_string(),
    }
}

/// Carries out `rpc` through the port, which decides how on this Manager.
pub(super) async fn execute(port: &Port, rpc: Rpc, now: UnixMillis) -> Result<(), RpcError> {
    match rpc {
        Rpc::StartJob {
            job_id,
            instance_key,
            node_id,
            gpu_index,
            runtime_role,
        } => {
            port.start_job(&StartJob {
                job_id,
                instance_key,
                node_id,
                gpu_index,
                defer_start: false,
                runtime_role,
                migration_id: None,
            })
            .await
        }
        Rpc::CreateNode {
            provider,
            node_id,
            tags,
            region,
            availability_domain,
            instance_type,
            launch_mode,
            root_volume,
        } => {
            let node = CreateNode {
                node_id,
                tags,
                region,
                availability_domain: availability_domain.unwrap_or_default(),
                instance_type,
                launch_mode: launch_mode.map(|m| m.as_str().to_owned()).unwrap_or_default(),
                root_volume,
            };
            // Placement provisions only from elastic tiers; a
            // `local-servers` elastic tier is provisioned like AWS and
            // Manager refuses it if it has no such provider.
            port.create_node(provider == ProviderKind::Oci, &node).await
        }
        Rpc::TerminateNode { node_id } => port.client().terminate_node(&node_id).await,
        Rpc::SetTerminalVerdict {
            bundle_id,
            job_id,
            verdict,
            generation,
        } => {
            port.set_terminal_verdict(&bundle_id, job_id.as_ref(), &verdict, generation)
                .await
        }
        Rpc::CreateBundle(bundle) => port.create_bundle(&bundle, now).await,
        Rpc::UpdateBundle(bundle) => port.update_bundle(&bundle, now).await,
        Rpc::DeleteBundle(bundle_id) => port.delete_bundle(&bundle_id).await,
        Rpc::StartBundleJob(job) => port.toggle_bundle_job(&job, true).await,
        Rpc::StopBundleJob(job) => port.toggle_bundle_job(&job, false).await,
        Rpc::CompleteJob { job_id } => port.client().complete_job(&job_id).await,
        Rpc::UpdateNodeTags { node_id, set, remove } => port.update_node_tags(&node_id, &set, &remove).await,
        Rpc::PrefetchImages { node_id, images } => port.prefetch_images(&node_id, &images).await,
        Rpc::CreateJob { job_id, template, tags } => port.client().create_job(&job_id, &template, &tags).await,
        Rpc::StartMigrationTarget {
            job_id,
            instance_key,
            node_id,
            gpu_index,
            runtime_role,
            defer_start,
            migration_id,
        } => {
            port.start_job(&StartJob {
                job_id,
                instance_key,
                node_id,
                gpu_index,
                defer_start,
                runtime_role,
                migration_id: Some(migration_id.0),
            })
            .await
        }
        Rpc::StartPreparedJob {
            job_id,
            instance_key,
            node_id,
        } => port.start_prepared_job(&job_id, &instance_key, &node_id).await,
        Rpc::StopJob {
            job_id,
            instance_key,
            node_id,
        } => port.stop_job(&job_id, &instance_key, &node_id).await,
        Rpc::SendMigrationSignal {
            migration_id,
            job_id,
            source_key,
            target_key,
            signal,
        } => {
            port.send_migration_signal(migration_signal(migration_id, &job_id, source_key, target_key, signal))
                .await
        }
    }
}

/// A migration step as Manager's `MigrationSignalRequest`.
fn migration_signal(
    migration_id: MigrationId,
    job_id: &JobId,
    source_key: crate::model::InstanceKey,
    target_key: crate::model::InstanceKey,
    step: MigrationStep,
) -> pb::MigrationSignalRequest {
    use pb::migration_signal_request::Signal;
    let signal = match step {
        MigrationStep::Propose(strategy) => Signal::Propose(wire::strategy_to_pb(strategy) as i32),
        MigrationStep::StopOutputAt(payload) => Signal::StopOutputAt(payload),
        MigrationStep::ApplyFrom(position) => Signal::ApplyFrom(position),
        MigrationStep::Abort(reason) => Signal::AbortReason(reason),
    };
    pb::MigrationSignalRequest {
        migration_id: migration_id.0,
        job_id: Some(wire::job_id_to_pb(job_id)),
        source_key: source_key.0,
        target_key: target_key.0,
        signal: Some(signal),
    }
}
