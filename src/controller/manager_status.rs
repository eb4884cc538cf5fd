//! Writing the Manager status ConfigMap, `norsk-auto-manager-status-<fleet>`
//! in the operator's own namespace (the Lease's), one per fleet, as
//! cluster-autoscaler keeps `cluster-autoscaler-status`. What it says, and
//! the keys it says it under, are [`crate::decide::manager_status`]'s.
//!
//! The leader writes it ([`run`]) at the start of its term and after every
//! change of the connection or of a capability's mode, a burst coalesced
//! into one write, and at no other time. This module owns that one object;
//! it reads nothing from the API server and decides nothing for the core.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{Patch, PatchParams};

use crate::decide::OPERATOR_NAME;
use crate::decide::manager_status::{MANAGER_STATUS, ManagerStatus, Publisher, STATUS, config_map_name};
use crate::decide::node::{FLEET, MANAGED_BY};
use crate::manager::stream::ConnectionState;
use crate::model::manager::Capabilities;
use crate::telemetry::ControllerLabels;

use super::Context;
use super::error::WriteStatusError;
use super::status::field_manager;

/// The writer's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "manager-status";
/// How long changes are gathered into one write: probing Manager on a new
/// connection sets the capabilities one at a time.
const COALESCE: Duration = Duration::from_secs(1);

/// What a write follows: the rest of the status is fixed for the term.
#[derive(Clone, Debug, PartialEq)]
struct Observed {
    connection: ConnectionState,
    capabilities: Capabilities,
}

/// Keeps the status of `publisher`'s fleet current until `shutdown`
/// resolves (the term's end): written at once, then after every change of
/// the core's connection or capabilities, coalesced over [`COALESCE`]. A
/// failed write is retried on the context's backoff (never sooner, however
/// often the connection flaps meanwhile), and a write in flight is dropped
/// when the term ends: the status never holds the term up.
pub async fn run(ctx: Arc<Context>, publisher: Publisher, shutdown: impl Future<Output = ()>) {
    let api: Api<ConfigMap> = Api::namespaced(ctx.client.clone(), &publisher.namespace);
    let name = config_map_name(&publisher.fleet);
    let mut connection = ctx.core.connection();
    let mut capabilities = ctx.core.capabilities();
    let mut shutdown = std::pin::pin!(shutdown);
    let mut written: Option<Observed> = None;
    loop {
        let now = Observed {
            connection: *connection.borrow_and_update(),
            capabilities: capabilities.borrow_and_update().clone(),
        };
        if written.as_ref() != Some(&now) {
            let status = ManagerStatus::of(&publisher, now.connection, &now.capabilities, Timestamp::now());
            let writing = async { Ok(write(&ctx, &api, &name, &publisher.fleet, &status).await?) };
            let outcome = tokio::select! {
                outcome = ctx.reconciling(CONTROLLER, &name, writing) => outcome,
                () = &mut shutdown => return,
            };
            match outcome {
                Ok(()) => written = Some(now),
                Err(e) => {
                    let delay = ctx.retry_after(CONTROLLER, &name, &e);
                    tokio::select! {
                        () = tokio::time::sleep(delay) => continue,
                        () = &mut shutdown => return,
                    }
                }
            }
        }
        // A watch whose sender is gone (the core closed: the term is
        // ending) is left out; the term's end is what returns.
        tokio::select! {
            biased;
            () = &mut shutdown => return,
            Ok(()) = connection.changed() => {}
            Ok(()) = capabilities.changed() => {}
        }
        tokio::select! {
            biased;
            () = &mut shutdown => return,
            () = tokio::time::sleep(COALESCE) => {}
        }
    }
}

/// Applies `status` as the whole ConfigMap `name` (created by the first
/// write), under this writer's field manager: a key no longer written (what
/// is lost without a capability now served) goes with it.
async fn write(
    ctx: &Context,
    api: &Api<ConfigMap>,
    name: &str,
    fleet: &str,
    status: &ManagerStatus,
) -> Result<(), WriteStatusError> {
    let labels = BTreeMap::from([
        (MANAGED_BY.to_owned(), OPERATOR_NAME.to_owned()),
        (FLEET.to_owned(), fleet.to_owned()),
        (STATUS.to_owned(), MANAGER_STATUS.to_owned()),
    ]);
    let config_map = ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        data: Some(status.data()),
        ..ConfigMap::default()
    };
    let params = PatchParams::apply(&field_manager(CONTROLLER)).force();
    api.patch(name, &params, &Patch::Apply(&config_map))
        .await
        .map_err(|source| WriteStatusError {
            kind: "ConfigMap".to_owned(),
            name: format!("{}/{name}", api.namespace().unwrap_or_default()),
            source,
        })?;
    ctx.metrics
        .status_writes
        .get_or_create(&ControllerLabels {
            controller: CONTROLLER.to_owned(),
        })
        .inc();
    Ok(())
}
