//! `Bundle` documents: created, updated, and deleted through Manager's
//! stop-then-delete saga. What each change means, and what the core's
//! answer means, is [`crate::decide::bundle`]'s, as it is the operator's.

use std::collections::{BTreeMap, BTreeSet};

use super::{Applier, Refusal};
use crate::automanager::{CommandError, QueryError};
use crate::cli::documents::FieldPath;
use crate::cli::standalone::follow::{Files, Wanted};
use crate::crd;
use crate::decide::bundle::{Applied, BundleCommand, BundleRefusal, Deleted, apply_bundle, delete_bundle};
use crate::model::{self, BundleId, BundleSpec, BundleState};

/// What the core holds, per bundle: its spec as applied and its state.
type Stored = BTreeMap<BundleId, (BundleSpec, BundleState)>;

impl Applier {
    pub(super) async fn apply_bundles(&mut self, files: &Files) -> Result<(), QueryError> {
        let stored: Stored = self
            .core
            .read(|core| {
                // As applied: Manager's spec with the manual jobs started as
                // the core runs them, so a start or stop is seen as a change
                // (and an unchanged file is not sent again).
                core.bundles()
                    .into_iter()
                    .map(|(id, b)| (id, (b.applied, b.state)))
                    .collect()
            })
            .await?;
        let mut wanted_ids = BTreeSet::new();
        for (wanted, bundle) in files.each::<crd::Bundle>() {
            wanted_ids.insert(bundle.bundle_id());
            self.apply_bundle(wanted, bundle, &stored).await?;
        }
        self.delete_unwanted_bundles(&wanted_ids, &stored).await
    }

    /// Brings Manager in line with one `Bundle` document, unless the core
    /// refused its spec as it stands; reports a refusal once.
    async fn apply_bundle(&mut self, wanted: &Wanted, bundle: &crd::Bundle, stored: &Stored) -> Result<(), QueryError> {
        let id = bundle.bundle_id();
        let spec = bundle.spec.0.clone();
        let record = self.bundles.entry(id.clone()).or_default();
        record.wanted = true;
        if record.spec != spec {
            record.changed = true;
            record.spec = spec.clone();
        }
        if record.refused.as_ref().is_some_and(|r| r.spec == spec) {
            // Refused: waits for its spec to change.
            return Ok(());
        }
        let request = model::Bundle {
            bundle_id: id.clone(),
            spec: spec.clone(),
            ..model::Bundle::default()
        };
        let held = stored.get(&id).map(|(live, state)| (live, *state));
        let (core, request) = (&self.core, &request);
        let applied = apply_bundle(held, &spec, |command| async move {
            match command {
                BundleCommand::Create => core.create_bundle(request.clone()).await,
                BundleCommand::Update => core.update_bundle(request.clone()).await,
            }
        })
        .await;
        let subject = wanted.resource.key().to_string();
        let refusal = match applied {
            Applied::InForce => None,
            // Deleted and wanted again while Manager still runs the old
            // one's saga: created once that has finished.
            Applied::AwaitingDeletion => return Ok(()),
            Applied::Refused(refusal) => Some((refusal.reason(), refusal_words(wanted, refusal))),
            Applied::Failed {
                error: CommandError::Closed,
                ..
            } => return Err(QueryError::Closed),
            Applied::Failed { error, .. } => {
                // Manager unreachable, ...: tried again next round.
                let message = format!("{}: not applied yet: {error}", wanted.origin());
                self.report(&subject, Some(message), "applied");
                return Ok(());
            }
        };
        let record = self.bundles.entry(id.clone()).or_default();
        record.refused = refusal.map(|(reason, message)| Refusal {
            spec: spec.clone(),
            reason,
            message,
        });
        let message = record.refused.as_ref().map(|r| {
            let kept = if stored.contains_key(&id) {
                "what Manager runs of it stays as it was"
            } else {
                "nothing of it runs"
            };
            format!("{}: refused ({}): {}; {kept}", wanted.origin(), r.reason, r.message)
        });
        self.report(&subject, message, "applied");
        Ok(())
    }

    /// Documents gone: Manager's stop-then-delete saga, then forgotten.
    async fn delete_unwanted_bundles(
        &mut self,
        wanted_ids: &BTreeSet<BundleId>,
        stored: &Stored,
    ) -> Result<(), QueryError> {
        let gone: Vec<BundleId> = self
            .bundles
            .keys()
            .filter(|id| !wanted_ids.contains(*id))
            .cloned()
            .collect();
        for id in gone {
            if let Some(record) = self.bundles.get_mut(&id) {
                record.wanted = false;
            }
            let subject = format!("Bundle {id}");
            let held = stored.get(&id).map(|(_, state)| *state);
            match delete_bundle(held, self.core.delete_bundle(id.clone())).await {
                Deleted::Deleting => {}
                Deleted::Gone => {
                    self.bundles.remove(&id);
                    if held.is_none() {
                        self.report(&subject, None, "deleted");
                    }
                }
                Deleted::Failed(CommandError::Closed) => return Err(QueryError::Closed),
                Deleted::Failed(e) => {
                    self.report(&subject, Some(format!("{subject}: not deleted yet: {e}")), "deleted")
                }
            }
        }
        Ok(())
    }
}

/// A refusal in words, each validation issue located in the document.
fn refusal_words(wanted: &Wanted, refusal: BundleRefusal) -> String {
    match refusal {
        BundleRefusal::Invalid(errors) => {
            let problems: Vec<String> = errors
                .iter()
                .map(|issue| {
                    let path = FieldPath::parse(&issue.path).under(&FieldPath::of(&["spec"]));
                    wanted.problem(path, &issue.message).to_string()
                })
                .collect();
            problems.join("; ")
        }
        BundleRefusal::Rejected(message) => message,
    }
}
