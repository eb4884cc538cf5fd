//! `JobMigration` documents: a migration started once, aborted on
//! `spec.abort`.

use std::collections::BTreeSet;

use super::{Applier, MigrationApplied, Refusal, namespaced_name};
use crate::automanager::{CommandError, QueryError};
use crate::cli::standalone::follow::Files;
use crate::crd::{self, JobMigration};
use crate::decide::migration::{ABORT_REASON, ABORT_TOO_LATE, abort_refusal, job_of, migration_refused, options_of};

impl Applier {
    pub(super) async fn apply_migrations(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut keys = BTreeSet::new();
        for (wanted, migration) in files.each::<crd::JobMigration>() {
            let key = namespaced_name(wanted);
            keys.insert(key.clone());
            let record = self
                .migrations
                .entry(key.clone())
                .or_insert_with(|| not_applied(migration));
            let subject = wanted.resource.key().to_string();
            match record.id.clone() {
                Some(id) if migration.spec.abort && !record.abort_sent && record.abort_refused.is_none() => {
                    let asked = id.clone();
                    let state = self
                        .core
                        .read(move |core| {
                            core.migration(&asked)
                                .map(|s| (s.phase.is_ended(), s.past_point_of_no_return))
                        })
                        .await?;
                    match state {
                        Some((false, true)) => {
                            record.abort_refused = Some(ABORT_TOO_LATE.to_owned());
                        }
                        Some((false, false)) => match self.core.abort_migration(id, ABORT_REASON.to_owned()).await {
                            Ok(()) => record.abort_sent = true,
                            Err(CommandError::Closed) => return Err(QueryError::Closed),
                            // Any other error is transient: the next pass
                            // asks again, as the operator does.
                            Err(e) => record.abort_refused = abort_refusal(&e),
                        },
                        _ => {}
                    }
                }
                Some(_) => {}
                None if record.aborted_unstarted => {}
                None if migration.spec.abort => record.aborted_unstarted = true,
                None if record.refused.as_ref().is_some_and(|r| r.spec == migration.spec) => {}
                None => {
                    let result = self
                        .core
                        .migrate_job(record.job_id.clone(), options_of(&migration.spec))
                        .await;
                    let record = self.migrations.entry(key).or_insert_with(|| not_applied(migration));
                    let message = match result {
                        Ok(id) => {
                            record.id = Some(id);
                            record.refused = None;
                            None
                        }
                        Err(CommandError::Closed) => return Err(QueryError::Closed),
                        Err(e) if migration_refused(&e) => {
                            record.refused = Some(Refusal {
                                spec: migration.spec.clone(),
                                reason: "Refused",
                                message: e.to_string(),
                            });
                            Some(format!(
                                "{}: refused: {e}; it waits for its document to change",
                                wanted.origin()
                            ))
                        }
                        Err(e) => Some(format!("{}: not started yet: {e}", wanted.origin())),
                    };
                    self.report(&subject, message, "started");
                }
            }
        }
        // Documents gone: forgotten; a migration in flight runs on.
        self.migrations.retain(|key, _| keys.contains(key));
        Ok(())
    }
}

/// The record of `migration` before anything was done for it.
fn not_applied(migration: &JobMigration) -> MigrationApplied {
    MigrationApplied {
        job_id: job_of(migration),
        id: None,
        refused: None,
        aborted_unstarted: false,
        abort_refused: None,
        abort_sent: false,
    }
}
