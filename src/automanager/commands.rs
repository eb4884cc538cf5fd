//! Commands: each [`Command`] validated, carried out on the core's state or
//! sent to Manager, and answered once (a reply, or an answer with a value);
//! an update or delete of a bundle revives it.

use crate::model::{Bundle, BundleId, PlacementPool, UnixMillis};

use super::core::AutoManagerCore;
use super::notification::Notification;
use super::outbox::Pending;
use super::protocol::{Action, Answer, Command, CommandError, CommandId, Rpc};
use super::settings::{AutoSettings, ValidSettings, validate_auto_settings};

impl AutoManagerCore {
    pub(super) fn command(&mut self, id: CommandId, command: Command, now: UnixMillis) {
        let (rpc, revives, started) = match command {
            Command::CreateBundle(bundle) => match self.refuse_invalid(&bundle) {
                Some(error) => return self.reply(id, Err(error)),
                None => {
                    let started = Some((bundle.bundle_id.clone(), bundle.spec.started()));
                    (Rpc::CreateBundle(bundle), None, started)
                }
            },
            Command::UpdateBundle(bundle) => match self.refuse_invalid(&bundle) {
                Some(error) => return self.reply(id, Err(error)),
                // Only which manual jobs run changed: not a revision.
                None if self.start_stop_only(&bundle.bundle_id, &bundle.spec) => return self.reply(id, Ok(())),
                None => {
                    let bundle_id = bundle.bundle_id.clone();
                    let started = Some((bundle_id.clone(), bundle.spec.started()));
                    (Rpc::UpdateBundle(bundle), Some(bundle_id), started)
                }
            },
            Command::DeleteBundle(bundle_id) => (Rpc::DeleteBundle(bundle_id.clone()), Some(bundle_id), None),
            Command::StartBundleJob(job) => return self.toggle_command(id, job, true),
            Command::StopBundleJob(job) => return self.toggle_command(id, job, false),
            Command::SetTemplateImages(images) => {
                self.facts.placed_with.set_template_images(images);
                return self.reply(id, Ok(()));
            }
            Command::CordonNode(node_id) => return self.reply_with(id, |core| core.cordon_node(&node_id)),
            Command::UncordonNode(node_id) => return self.reply_with(id, |core| core.uncordon_node(&node_id)),
            Command::TerminateNode(node_id) => return self.reply_with(id, |core| core.terminate_node(&node_id)),
            Command::EvictNode(node_id) => return self.reply_with(id, |core| core.evict_node(&node_id)),
            Command::DrainNode { node_id, options } => {
                return self.reply_with(id, |core| core.drain_node(&node_id, options, now));
            }
            Command::HandleNodeInterruption { node_id, notice } => {
                return self.reply_with(id, |core| core.handle_node_interruption(&node_id, notice, now, now));
            }
            Command::MigrateJob { job_id, options } => {
                let started = self.migrate_job(&job_id, &options, now);
                return self.answer(id, started.map(Answer::Migration).map_err(CommandError::Migration));
            }
            Command::AbortMigration { migration_id, reason } => {
                let aborted = self.saga().abort_migration(&migration_id, &reason, now);
                return self.reply(id, aborted.map_err(CommandError::Migration));
            }
            Command::SetPlacementPools(pools) => return self.set_placement_pools(id, pools),
            Command::UpdateHotSpareSpecs(specs) => {
                let changed = self
                    .subsystems
                    .spares
                    .update_specs(&mut self.facts, &mut self.outbox, specs);
                return self.answer(id, changed.map(Answer::HotSpares));
            }
            Command::DeclareInventory { node_id, inventory } => {
                self.facts.fleet.declare(&node_id, inventory);
                return self.reply(id, Ok(()));
            }
            Command::UpdateHotSpareNode { node_id, spec } => {
                return self.reply_with(id, |core| {
                    core.subsystems
                        .spares
                        .update_node(&mut core.facts, &mut core.outbox, &node_id, &spec)
                });
            }
        };
        let deletes = matches!(rpc, Rpc::DeleteBundle(_));
        self.call(
            rpc,
            Pending::Command {
                id,
                revives,
                started,
                deletes,
            },
        );
    }

    /// New pools take effect at once: the kept view is rebuilt on the next
    /// round and jobs waiting for capacity are retried against them.
    fn set_placement_pools(&mut self, id: CommandId, pools: Vec<PlacementPool>) {
        let settings = AutoSettings {
            placement_pools: pools,
            ..self.facts.settings().clone()
        };
        match validate_auto_settings(settings) {
            Ok(valid) => {
                self.facts.placed_with.set(valid);
                self.reply(id, Ok(()));
            }
            Err(e) => self.reply(id, Err(CommandError::InvalidSettings { errors: e.errors })),
        }
    }

    /// The settings and pools in force, as a successor core is built with
    /// (what was changed live survives a reconnect).
    pub(super) fn valid_settings(&self) -> ValidSettings {
        self.facts.placed_with.valid_settings()
    }

    fn refuse_invalid(&mut self, bundle: &Bundle) -> Option<CommandError> {
        match self.validate_bundle(&bundle.spec) {
            Ok(found) if found.errors.is_empty() => None,
            Ok(found) => Some(CommandError::InvalidBundle { errors: found.errors }),
            Err(e) => {
                // The view is built from this core's own fleet, which never
                // holds two nodes of one id; still, say so rather than guess.
                self.notify(Notification::Error {
                    message: format!("could not build the fleet view: {e}"),
                });
                None
            }
        }
    }

    pub(super) fn reply(&mut self, command: CommandId, result: Result<(), CommandError>) {
        self.outbox.reply(Action::Reply { command, result });
    }

    /// Runs a command answered at once, and replies with its outcome.
    fn reply_with(&mut self, command: CommandId, run: impl FnOnce(&mut Self) -> Result<(), CommandError>) {
        let result = run(self);
        self.reply(command, result);
    }

    pub(super) fn answer(&mut self, command: CommandId, result: Result<Answer, CommandError>) {
        self.outbox.reply(Action::Answer { command, result });
    }

    /// A bundle was updated or deleted: its broken mark, its jobs' drops
    /// and their restart histories clear ("the broken mark clears when the
    /// bundle is updated or deleted").
    pub(super) fn revive(&mut self, bundle_id: &BundleId) {
        self.facts.broken.remove(bundle_id);
        for mut record in self.facts.jobs.values_mut() {
            if &record.bundle_ref.bundle_id == bundle_id {
                record.dropped = false;
                // A new generation carries no verdict: one Manager recorded
                // on the job (read back at hydration) went with the update.
                record.job.terminal_verdict = None;
                record.window_over = false;
                record.restarts.clear();
                // A loss no leader judged, before the update: the update
                // supersedes it, as it would a judged one's count and drop.
                record.unjudged_loss = None;
                record.recovery = None;
                record.awaiting_capacity_since = None;
            }
        }
    }
}
