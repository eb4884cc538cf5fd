//! The `Bundle` controller: a resource becomes `createBundle` /
//! `updateBundle` on the core; deleting it runs Manager's stop-then-delete
//! saga behind the finalizer `automanager.norsk.video/bundle`; the status
//! says where each job of each replica runs (see
//! [`crate::decide::bundle_status`]). What a change means — which command,
//! what a refusal is — is [`crate::decide::bundle`]'s, shared with
//! `standalone`. It is reconciled on every change of the resource and on every
//! notification about its bundle.

use std::sync::Arc;
use std::time::Duration;

use futures::{Stream, StreamExt};
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as FinalizerEvent, finalizer};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};

use crate::crd;
use crate::decide::bundle::{Applied, BundleCommand, BundleRefusal, Deleted, apply_bundle, delete_bundle};
use crate::decide::bundle_status::{self, AdmissionCheck, ObservedBundle, observe};
use crate::model::{self, BundleState};

use super::error::{ApplyError, DecideError, ReadError, WriteStatusError};
use super::status::StatusWriter;
use super::{Context, ReconcileError};

/// The controller's name (metrics label, field manager suffix).
pub const CONTROLLER: &str = "bundle";
/// Held while Manager may still hold the bundle's jobs.
pub const FINALIZER: &str = "automanager.norsk.video/bundle";
/// Re-read even without a change: "restarts in the trailing hour" decays.
const RESYNC: Duration = Duration::from_secs(300);

/// Runs the controller until `shutdown` resolves, over the bundles of
/// `namespace` (all when `None`). `notified` carries the bundles
/// notifications were about.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<&str>,
    notified: impl Stream<Item = ObjectRef<crd::Bundle>> + Send + 'static,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let api: Api<crd::Bundle> = match namespace {
        Some(namespace) => Api::namespaced(ctx.client.clone(), namespace),
        None => Api::all(ctx.client.clone()),
    };
    // A bundle refused for naming an unknown pool is tried again once the
    // pools change.
    let pool_changes = ctx.pool_changes();
    super::api_server::controller(api, watcher::Config::default(), Duration::from_millis(100))
        .reconcile_on(notified)
        .reconcile_all_on(pool_changes)
        .graceful_shutdown_on(shutdown)
        .run(reconcile, error_policy, ctx)
        .for_each(|_| async {})
        .await;
}

fn key(bundle: &crd::Bundle) -> String {
    bundle.bundle_id().to_string()
}

/// The bundle's status writer; `api` is scoped to its namespace.
fn writer<'a>(ctx: &'a Context, api: &Api<crd::Bundle>) -> StatusWriter<'a, crd::Bundle> {
    StatusWriter::new(ctx, api.clone(), CONTROLLER)
}

#[tracing::instrument(skip_all, fields(bundle = %key(&bundle)))]
async fn reconcile(bundle: Arc<crd::Bundle>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let key = key(&bundle);
    ctx.reconciling(CONTROLLER, &key, reconcile_once(bundle, ctx.clone()))
        .await
}

/// One reconcile of the object, counted by [`reconcile`].
async fn reconcile_once(bundle: Arc<crd::Bundle>, ctx: Arc<Context>) -> Result<Action, ReconcileError> {
    let namespace = bundle.namespace().unwrap_or_else(|| crd::DEFAULT_NAMESPACE.to_owned());
    let api: Api<crd::Bundle> = Api::namespaced(ctx.client.clone(), &namespace);
    let object = key(&bundle);
    finalizer(&api, FINALIZER, bundle, |event| async {
        match event {
            FinalizerEvent::Apply(bundle) => apply(&bundle, &api, &ctx).await,
            FinalizerEvent::Cleanup(bundle) => cleanup(&bundle, &api, &ctx).await,
        }
    })
    .await
    .map_err(|e| ReconcileError::of_finalizer(e, FINALIZER, &format!("Bundle {object}")))
}

fn error_policy(bundle: Arc<crd::Bundle>, error: &ReconcileError, ctx: Arc<Context>) -> Action {
    ctx.failed(CONTROLLER, &key(&bundle), error)
}

/// What the core holds of a bundle.
struct Stored {
    hydrated: bool,
    bundle: Option<(model::BundleSpec, BundleState)>,
}

async fn stored(ctx: &Context, bundle_id: &model::BundleId) -> Result<Stored, ReadError> {
    let id = bundle_id.clone();
    Ok(ctx
        .core
        .read(move |core| Stored {
            hydrated: core.is_hydrated(),
            // Compared as applied: which manual jobs run is the core's
            // wanted set, not part of Manager's stored spec.
            bundle: core.bundle(&id).map(|b| (b.applied, b.state)),
        })
        .await?)
}

/// Create or update on Manager, then write what the core reports.
async fn apply(bundle: &crd::Bundle, api: &Api<crd::Bundle>, ctx: &Context) -> Result<Action, ReconcileError> {
    let bundle_id = bundle.bundle_id();
    let found = stored(ctx, &bundle_id).await?;
    if !found.hydrated {
        return Err(DecideError::NotHydrated.into());
    }
    if !ctx.pools_synced() {
        return Err(DecideError::PoolsNotSynced.into());
    }
    let wanted = model::Bundle {
        bundle_id: bundle_id.clone(),
        spec: bundle.spec.0.clone(),
        terminal_verdict: recorded_verdict(bundle),
        ..model::Bundle::default()
    };
    let held = found.bundle.as_ref().map(|(spec, state)| (spec, *state));
    let request = &wanted;
    let applied = apply_bundle(held, &wanted.spec, |command| async move {
        match command {
            BundleCommand::Create => ctx.core.create_bundle(request.clone()).await,
            BundleCommand::Update => ctx.core.update_bundle(request.clone()).await,
        }
    })
    .await;
    let refused = match applied {
        Applied::InForce => None,
        // The resource was deleted and made again while Manager still
        // runs the old one's saga: create once that has finished.
        Applied::AwaitingDeletion => {
            return Err(DecideError::StillDeleting {
                bundle: bundle_id.to_string(),
            }
            .into());
        }
        Applied::Refused(refusal) => Some((refusal.reason(), refusal_message(refusal))),
        Applied::Failed { sent, error } => {
            return Err(ApplyError::Command {
                action: sent.as_str(),
                object: format!("bundle {bundle_id}"),
                source: error,
            }
            .into());
        }
    };
    let writer = writer(ctx, api);
    if let Some((reason, message)) = refused {
        write_status(bundle, &writer, bundle_status::refused(reason, message)).await?;
        // An invalid bundle waits for its spec to change.
        return Ok(Action::await_change());
    }
    let observed = observe_bundle(bundle, &writer, ctx).await?;
    write_status(bundle, &writer, observed).await?;
    Ok(Action::requeue(RESYNC))
}

/// The broken verdict the Bundle's status records for its spec as it
/// stands (none once the spec changed since: an update revives). Handed
/// with the bundle when a new term creates it, so a Manager that keeps no
/// verdicts of its own (the published API) does not revive a bundle that
/// broke under the previous leader; a Manager that keeps them ignores it.
fn recorded_verdict(bundle: &crd::Bundle) -> Option<model::TerminalVerdict> {
    let status = bundle.status.as_ref()?;
    let reason = status.broken.clone()?;
    (status.observed_generation == bundle.meta().generation).then_some(model::TerminalVerdict {
        kind: model::VerdictKind::Broken,
        reason,
        at: None,
    })
}

async fn observe_bundle(
    bundle: &crd::Bundle,
    writer: &StatusWriter<'_, crd::Bundle>,
    ctx: &Context,
) -> Result<ObservedBundle, ReadError> {
    let bundle_id = bundle.bundle_id();
    let known = writer.known(bundle);
    let previous = known.as_ref();
    let same_generation = previous.and_then(|s| s.observed_generation) == bundle.meta().generation;
    let check = bundle_status::admission_check(previous, same_generation);
    let spec = bundle.spec.0.clone();
    let notes = bundle_status::job_notes(&ctx.notes(), &bundle_id, &spec, previous);
    let id = bundle.bundle_id();
    let mut observed = ctx
        .core
        .read(move |core| observe(core, &id, &spec, &notes, check))
        .await?;
    if check == AdmissionCheck::Skip {
        bundle_status::keep_admitted(&mut observed, previous);
    }
    Ok(observed)
}

/// Writes the status `observed` implies when it differs from what the
/// resource holds.
async fn write_status(
    bundle: &crd::Bundle,
    writer: &StatusWriter<'_, crd::Bundle>,
    observed: ObservedBundle,
) -> Result<(), WriteStatusError> {
    let previous = writer.known(bundle).unwrap_or_default();
    let next = bundle_status::status_of(&previous, observed, bundle.meta().generation);
    writer.write(bundle, &previous, &next).await?;
    Ok(())
}

/// The finalizer: start Manager's stop-then-delete saga and hold the
/// resource until Manager no longer has the bundle.
async fn cleanup(bundle: &crd::Bundle, api: &Api<crd::Bundle>, ctx: &Context) -> Result<Action, ReconcileError> {
    let bundle_id = bundle.bundle_id();
    let found = stored(ctx, &bundle_id).await?;
    if !found.hydrated {
        return Err(DecideError::NotHydrated.into());
    }
    let still_deleting = || DecideError::StillDeleting {
        bundle: bundle_id.to_string(),
    };
    let held = found.bundle.map(|(_, state)| state);
    match delete_bundle(held, ctx.core.delete_bundle(bundle_id.clone())).await {
        Deleted::Gone => {
            writer(ctx, api).forget(&bundle.name_any());
            Ok(Action::await_change())
        }
        Deleted::Deleting => Err(still_deleting().into()),
        Deleted::Failed(source) => Err(ApplyError::Command {
            action: "delete",
            object: format!("bundle {bundle_id}"),
            source,
        }
        .into()),
    }
}

/// A refusal in words for the Bundle's status.
fn refusal_message(refusal: BundleRefusal) -> String {
    match refusal {
        BundleRefusal::Invalid(errors) => errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "),
        BundleRefusal::Rejected(message) => message,
    }
}
