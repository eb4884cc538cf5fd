//! Bringing the core in line with the followed files, kind by kind, with
//! the operator's semantics for each: what a document change means is
//! decided by [`crate::decide`], which the operator's controllers call too,
//! and carried out through the same commands on the core's handle:
//!
//! - `PlacementPool`: every pool that validates alone is handed to the
//!   core as one set (`set_placement_pools`, live); one that does not is
//!   left out and reported. Removing a document removes its pool.
//! - `HotSparePolicy`: the policies naming a pool in force, as one list
//!   (`update_hot_spare_specs`, live); one naming an unknown pool waits
//!   for it. Removing a document removes the pool's spares.
//! - `Bundle`: created, updated when its spec differs from Manager's, and
//!   deleted (Manager's stop-then-delete saga) when its document goes. A
//!   bundle the core refuses waits for its spec to change; what Manager
//!   already runs of it stays as it was.
//! - `NorskNode`: `spec.cordoned` cordons and uncordons the node — only
//!   what the document cordoned is uncordoned, a drain's cordon stays —
//!   and `spec.spare` edits a live spare. Removing the document uncordons
//!   what it cordoned.
//! - `NodeDrain`: starts the drain (or the interruption's forced drain);
//!   a drain of a node not (yet) in the fleet waits for it; a drain the
//!   core lost (Manager's stream broke and a fresh core took over) is
//!   started again. Removing the document before the terminate cancels
//!   the drain (`uncordon_node`).
//! - `JobMigration`: starts the migration once; `spec.abort` aborts it
//!   (a clean rollback only before the point of no return). A refused
//!   migration waits for its document to change. Removing the document
//!   forgets it; the migration runs on.
//!
//! Each refusal is printed once, when it first happens or changes, with
//! the resource's file and document and, where the refusal names a field,
//! its path, line and column.

use std::collections::{BTreeMap, BTreeSet};

use crate::automanager::{AutoManagerHandle, MigrationId, QueryError};
use crate::crd::{self, JobMigrationSpec, NodeDrainSpec};
use crate::decide::conditions::Observed;
use crate::decide::drain_status::millis;
use crate::decide::migration::job_of;
use crate::model::{BundleId, BundleSpec, JobId, MigrationPhase, NodeId, UnixMillis, wire_name};

mod bundles;
mod fleet;
mod migrations;
mod settings;

pub use settings::wanted_settings;

use super::follow::{Files, Wanted};
use super::status::Recorded;

/// A command the core refused for a spec: it is not tried again until
/// the spec changes.
#[derive(Clone, Debug, PartialEq)]
pub struct Refusal<S> {
    /// The spec refused.
    pub spec: S,
    /// A CamelCase reason.
    pub reason: &'static str,
    /// Why, in words.
    pub message: String,
}

/// What was done for the pools.
#[derive(Clone, Debug, Default)]
pub struct PoolsApplied {
    /// Pools left out of the set, by name, and why.
    pub left_out: BTreeMap<String, String>,
    /// Why the core refused the whole set.
    pub refused: Option<String>,
}

/// What was done for one bundle.
#[derive(Clone, Debug, Default)]
pub struct BundleApplied {
    /// The spec last wanted (kept while Manager deletes it).
    pub spec: BundleSpec,
    /// Whether a document still wants it.
    pub wanted: bool,
    /// Why the core or Manager refused its spec.
    pub refused: Option<Refusal<BundleSpec>>,
    /// Whether its spec changed since the status last checked admission.
    pub changed: bool,
}

/// Takes the records no document wants any more (their keys not in
/// `wanted`) out of `records`, in key order.
fn take_gone<K: Ord + Clone, V>(records: &mut BTreeMap<K, V>, wanted: &BTreeSet<K>) -> Vec<(K, V)> {
    let gone: Vec<K> = records.keys().filter(|k| !wanted.contains(*k)).cloned().collect();
    gone.into_iter()
        .filter_map(|k| records.remove(&k).map(|v| (k, v)))
        .collect()
}

/// What was done for one drain.
#[derive(Clone, Debug)]
pub struct DrainApplied {
    pub node_id: NodeId,
    /// When the drain it started began (its identity in the core).
    pub started: Option<UnixMillis>,
    /// Why it could not start.
    pub refused: Option<Refusal<NodeDrainSpec>>,
    /// Why it has not started yet, when it waits (a node not yet known).
    pub waiting: Option<String>,
    /// Whether the drain started ended, as last seen.
    pub ended: bool,
}

/// What was done for one migration.
#[derive(Clone, Debug)]
pub struct MigrationApplied {
    /// The runtime job it moves.
    pub job_id: JobId,
    /// The migration started.
    pub id: Option<MigrationId>,
    /// Why `migrateJob` refused it.
    pub refused: Option<Refusal<JobMigrationSpec>>,
    /// Aborted before it started.
    pub aborted_unstarted: bool,
    /// The answer to `spec.abort` when it could not roll back.
    pub abort_refused: Option<String>,
    /// `abortMigration` was sent (once: the rollback takes its course).
    pub abort_sent: bool,
}

/// What was done for one `NorskNode` document.
#[derive(Clone, Debug)]
pub struct NodeApplied {
    pub node_id: NodeId,
    /// Whether the document cordoned the node.
    pub by_spec: bool,
    /// `Cordoned`.
    pub cordon: Option<Observed>,
    /// `SpareSpecApplied`.
    pub spare: Option<Observed>,
}

/// Applies the wanted state and remembers what came of it (the status
/// reads it).
pub struct Applier {
    core: AutoManagerHandle,
    /// What was last printed per subject: each refusal is printed once.
    reported: BTreeMap<String, String>,
    pub pools: PoolsApplied,
    /// Why the core refused the hot-spare list.
    pub spares_refused: Option<String>,
    /// Per bundle id.
    pub bundles: BTreeMap<BundleId, BundleApplied>,
    /// Per `NodeDrain` name.
    pub drains: BTreeMap<String, DrainApplied>,
    /// Per `JobMigration` `namespace/name`.
    pub migrations: BTreeMap<String, MigrationApplied>,
    /// Per `NorskNode` document name.
    pub nodes: BTreeMap<String, NodeApplied>,
}

/// The key of a namespaced resource: `namespace/name`.
pub fn namespaced_name(wanted: &Wanted) -> String {
    let key = wanted.resource.key();
    match key.namespace {
        Some(namespace) => format!("{namespace}/{}", key.name),
        None => key.name,
    }
}

impl Applier {
    /// An applier on `core`; `left_out` are the pools the core was started
    /// without.
    pub fn new(core: AutoManagerHandle, left_out: BTreeMap<String, String>) -> Self {
        let mut applier = Self {
            core,
            reported: BTreeMap::new(),
            pools: PoolsApplied::default(),
            spares_refused: None,
            bundles: BTreeMap::new(),
            drains: BTreeMap::new(),
            migrations: BTreeMap::new(),
            nodes: BTreeMap::new(),
        };
        applier.report_left_out(left_out);
        applier
    }

    /// Carries on from an earlier run's record: bundles it held that no
    /// document wants are deleted; drains that ended and migrations
    /// started are not started again (those in flight are followed to
    /// their end; a drain in flight is started again, idempotently).
    pub fn resume(&mut self, recorded: &Recorded, files: &Files) {
        for id in recorded.bundles.keys() {
            self.bundles.entry(BundleId(id.clone())).or_default();
        }
        for (wanted, drain) in files.each::<crd::NodeDrain>() {
            let name = wanted.resource.key().name;
            let Some(status) = recorded.node_drains.get(&name) else {
                continue;
            };
            match (status.phase, status.started.as_deref().and_then(millis)) {
                (Some(phase), Some(started)) if phase.is_final() => {
                    self.drains.insert(
                        name,
                        DrainApplied {
                            node_id: NodeId(drain.spec.node_id.clone()),
                            started: Some(started),
                            refused: None,
                            waiting: None,
                            ended: true,
                        },
                    );
                }
                (Some(phase), _) => eprintln!(
                    "standalone: {}: {} when standalone last stopped: started again",
                    wanted.origin(),
                    wire_name(&phase)
                ),
                (None, _) => {}
            }
        }
        for (wanted, migration) in files.each::<crd::JobMigration>() {
            let key = namespaced_name(wanted);
            let Some(status) = recorded.job_migrations.get(&key) else {
                continue;
            };
            let aborted_unstarted = status.migration_id.is_none() && status.phase == Some(MigrationPhase::Aborted);
            if status.migration_id.is_none() && !aborted_unstarted {
                // Refused or never started: asked again.
                continue;
            }
            self.migrations.insert(
                key,
                MigrationApplied {
                    job_id: job_of(migration),
                    id: status.migration_id.clone().map(MigrationId),
                    refused: None,
                    aborted_unstarted,
                    abort_refused: None,
                    abort_sent: false,
                },
            );
        }
    }

    /// Prints `message` about `subject` if it is new; `None` clears it
    /// (and says so, when something had been printed).
    fn report(&mut self, subject: &str, message: Option<String>, resolved: &str) {
        match message {
            Some(message) if self.reported.get(subject) != Some(&message) => {
                eprintln!("error: {message}");
                self.reported.insert(subject.to_owned(), message);
            }
            Some(_) => {}
            None => {
                if self.reported.remove(subject).is_some() {
                    eprintln!("standalone: {subject}: {resolved}");
                }
            }
        }
    }

    fn report_left_out(&mut self, left_out: BTreeMap<String, String>) {
        let gone: Vec<String> = self
            .pools
            .left_out
            .keys()
            .filter(|name| !left_out.contains_key(*name))
            .cloned()
            .collect();
        for name in gone {
            self.report(&format!("PlacementPool {name}"), None, "valid again");
        }
        for (name, why) in &left_out {
            self.report(
                &format!("PlacementPool {name}"),
                Some(format!("PlacementPool {name} is left out: {why}")),
                "",
            );
        }
        self.pools.left_out = left_out;
    }

    /// One round: everything the files want, in kind order. Fails only
    /// when the core is closed.
    pub async fn apply(&mut self, files: &Files) -> Result<(), QueryError> {
        self.apply_settings(files).await?;
        if !self.core.read(|core| core.is_hydrated()).await? {
            // Nothing is decided before Manager's snapshot is in.
            return Ok(());
        }
        self.apply_bundles(files).await?;
        self.apply_nodes(files).await?;
        self.apply_drains(files).await?;
        self.apply_migrations(files).await
    }

    /// Forgets the migration of `key` the core no longer holds, so the
    /// request is carried out again (it was rolled back before its point
    /// of no return).
    pub fn restart_migration(&mut self, key: &str) {
        if let Some(record) = self.migrations.get_mut(key) {
            record.id = None;
            record.refused = None;
        }
    }
}
