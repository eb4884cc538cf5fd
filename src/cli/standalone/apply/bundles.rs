//! `Bundle` documents: created, updated, and deleted through Manager's
//! stop-then-delete saga.

use std::collections::{BTreeMap, BTreeSet};

use super::{Applier, INVALID_BUNDLE, Refusal};
use crate::automanager::{CommandError, QueryError, RpcFailureKind};
use crate::cli::documents::{FieldPath, Kind, Resource};
use crate::cli::standalone::follow::Files;
use crate::model::{self, BundleId, BundleSpec, BundleState};

impl Applier {
    pub(super) async fn apply_bundles(&mut self, files: &Files) -> Result<(), QueryError> {
        let stored: BTreeMap<BundleId, (BundleSpec, BundleState)> = self
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
        for wanted in files.of_kind(Kind::Bundle) {
            let Resource::Bundle(bundle) = &wanted.resource else {
                continue;
            };
            let id = bundle.bundle_id();
            wanted_ids.insert(id.clone());
            let spec = bundle.spec.0.clone();
            let record = self.bundles.entry(id.clone()).or_default();
            record.wanted = true;
            if record.spec != spec {
                record.changed = true;
                record.spec = spec.clone();
            }
            if record.refused.as_ref().is_some_and(|r| r.spec == spec) {
                // Refused: waits for its spec to change.
                continue;
            }
            let request = model::Bundle {
                bundle_id: id.clone(),
                spec: spec.clone(),
                ..model::Bundle::default()
            };
            let result = match stored.get(&id) {
                None => match self.core.create_bundle(request.clone()).await {
                    // Manager has it from an earlier run: bring it up to date.
                    Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::AlreadyExists => {
                        self.core.update_bundle(request).await
                    }
                    other => other,
                },
                // Deleted and wanted again while Manager still runs the old
                // one's saga: created once that has finished.
                Some((_, BundleState::Deleting)) => continue,
                Some((live, BundleState::Live)) if !live.same_applied(&spec) => self.core.update_bundle(request).await,
                Some(_) => Ok(()),
            };
            let subject = wanted.resource.key().to_string();
            let refusal = match result {
                Ok(()) => None,
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(CommandError::InvalidBundle { errors }) => {
                    let problems: Vec<String> = errors
                        .iter()
                        .map(|issue| {
                            let path = FieldPath::parse(&issue.path).under(&FieldPath::of(&["spec"]));
                            wanted.problem(path, &issue.message).to_string()
                        })
                        .collect();
                    Some((INVALID_BUNDLE, problems.join("; ")))
                }
                Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::Rejected => {
                    Some(("RejectedByManager", f.message))
                }
                Err(e) => {
                    // Manager unreachable, ...: tried again next round.
                    self.report(
                        &subject,
                        Some(format!("{}: not applied yet: {e}", wanted.origin())),
                        "applied",
                    );
                    continue;
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
        }
        // Documents gone: Manager's stop-then-delete saga, then forgotten.
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
            match stored.get(&id) {
                Some((_, BundleState::Deleting)) => {}
                // Not held by the core: Manager may still run its jobs (a
                // published Manager, the document removed while standalone
                // was stopped), which the delete stops; Manager answers
                // `NOT_FOUND` when nothing is left of it.
                None | Some((_, BundleState::Live)) => match self.core.delete_bundle(id.clone()).await {
                    Ok(()) if !stored.contains_key(&id) => {
                        self.bundles.remove(&id);
                        self.report(&subject, None, "deleted");
                    }
                    Ok(()) => {}
                    Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::NotFound => {
                        self.bundles.remove(&id);
                        if !stored.contains_key(&id) {
                            self.report(&subject, None, "deleted");
                        }
                    }
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => self.report(&subject, Some(format!("{subject}: not deleted yet: {e}")), "deleted"),
                },
            }
        }
        Ok(())
    }
}
