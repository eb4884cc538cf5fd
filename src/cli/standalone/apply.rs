//! Bringing the core in line with the followed files, kind by kind, with
//! the operator's semantics for each (`src/controller`), through the same
//! commands on the core's handle:
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

use crate::automanager::{AutoManagerHandle, CommandError, DrainPhase, MigrationId, QueryError, RpcFailureKind};
use crate::cli::documents::{FieldPath, Kind, Resource, Segment};
use crate::controller::conditions::Observed;
use crate::controller::drain::start_drain;
use crate::controller::migration::{job_of, options_of};
use crate::controller::node::{CordonStep, apply_spare_spec, cordon_done, cordon_step};
use crate::crd::{JobMigrationSpec, NodeDrainSpec};
use crate::model::{self, BundleId, BundleSpec, BundleState, HotSpareSpec, JobId, NodeId, UnixMillis};
use crate::placement::validate_pools;

use super::follow::{Files, Wanted};
use super::status::Recorded;
use crate::controller::drain_status::{is_final_name, millis};

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

/// What was done for one drain.
#[derive(Clone, Debug)]
pub struct DrainApplied {
    /// The node.
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
}

/// What was done for one `NorskNode` document.
#[derive(Clone, Debug)]
pub struct NodeApplied {
    /// The node.
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
    /// The pools.
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

/// The pools and policies wanted, as the core takes them: each pool that
/// validates alone (sorted by name), the others with why they are left
/// out; and the policies naming one of those pools (sorted by pool).
pub fn wanted_settings(files: &Files) -> (Vec<model::PlacementPool>, BTreeMap<String, String>, Vec<HotSpareSpec>) {
    let mut valid = Vec::new();
    let mut left_out = BTreeMap::new();
    for wanted in files.of_kind(Kind::PlacementPool) {
        let Resource::PlacementPool(pool) = &wanted.resource else {
            continue;
        };
        let pool = pool.to_model();
        match validate_pools(vec![pool.clone()]) {
            Ok(_) => valid.push(pool),
            Err(e) => {
                let problems: Vec<String> = e
                    .errors
                    .iter()
                    .map(|issue| wanted.problem(document_path(&issue.path), &issue.message).to_string())
                    .collect();
                left_out.insert(pool.name.clone(), problems.join("; "));
            }
        }
    }
    valid.sort_by(|a, b| a.name.cmp(&b.name));
    let known: BTreeSet<&str> = valid.iter().map(|p| p.name.as_str()).collect();
    let mut spares: Vec<HotSpareSpec> = files
        .of_kind(Kind::HotSparePolicy)
        .filter_map(|w| match &w.resource {
            Resource::HotSparePolicy(policy) if known.contains(policy.spec.0.pool.as_str()) => {
                Some(policy.spec.0.clone())
            }
            _ => None,
        })
        .collect();
    spares.sort_by(|a, b| a.pool.cmp(&b.pool));
    (valid, left_out, spares)
}

/// A settings issue's path (`placementPools[0].tiers[1].name`,
/// `hotSpares[0].spec`) in its document: the entry's fields are the
/// resource's `spec`, a pool's name its `metadata.name`.
fn document_path(issue_path: &str) -> FieldPath {
    let path = FieldPath::parse(issue_path);
    let rest = match path.0.as_slice() {
        [Segment::Key(_), Segment::Index(_), rest @ ..] => rest,
        other => other,
    };
    match rest {
        [Segment::Key(name)] if name == "name" => FieldPath::of(&["metadata", "name"]),
        rest => FieldPath(rest.to_vec()).under(&FieldPath::of(&["spec"])),
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
        for wanted in files.of_kind(Kind::NodeDrain) {
            let Resource::NodeDrain(drain) = &wanted.resource else {
                continue;
            };
            let name = wanted.resource.key().name;
            let Some(status) = recorded.node_drains.get(&name) else {
                continue;
            };
            match (status.phase.as_deref(), status.started.as_deref().and_then(millis)) {
                (Some(phase), Some(started)) if is_final_name(phase) => {
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
                    "standalone: {}: {phase} when standalone last stopped: started again",
                    wanted.origin()
                ),
                (None, _) => {}
            }
        }
        for wanted in files.of_kind(Kind::JobMigration) {
            let Resource::JobMigration(migration) = &wanted.resource else {
                continue;
            };
            let key = namespaced_name(wanted);
            let Some(status) = recorded.job_migrations.get(&key) else {
                continue;
            };
            let aborted_unstarted = status.migration_id.is_none() && status.phase.as_deref() == Some("aborted");
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
        if !self.core.inspect(|core, _| core.is_hydrated()).await? {
            // Nothing is decided before Manager's snapshot is in.
            return Ok(());
        }
        self.apply_bundles(files).await?;
        self.apply_nodes(files).await?;
        self.apply_drains(files).await?;
        self.apply_migrations(files).await
    }

    async fn apply_settings(&mut self, files: &Files) -> Result<(), QueryError> {
        let (pools, left_out, spares) = wanted_settings(files);
        self.report_left_out(left_out);
        let (in_force, mut live) = self
            .core
            .inspect(|core, _| {
                (
                    core.settings().placement_pools.clone(),
                    core.settings().hot_spares.clone(),
                )
            })
            .await?;
        if pools != in_force {
            self.pools.refused = match self.core.set_placement_pools(pools).await {
                Ok(()) => {
                    // A bundle refused for naming an unknown pool is tried
                    // again once the pools change.
                    for record in self.bundles.values_mut() {
                        record.refused.take_if(|r| r.reason == INVALID_BUNDLE);
                    }
                    None
                }
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(CommandError::InvalidSettings { errors }) => {
                    Some(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
                }
                Err(e) => Some(e.to_string()),
            };
            let message = self
                .pools
                .refused
                .as_ref()
                .map(|why| format!("the PlacementPools were refused as a set, the pools in force stay: {why}"));
            self.report("PlacementPools", message, "in force");
        }
        let known: BTreeSet<String> = self
            .core
            .inspect(|core, _| core.settings().placement_pools.iter().map(|p| p.name.clone()).collect())
            .await?;
        for wanted in files.of_kind(Kind::HotSparePolicy) {
            let Resource::HotSparePolicy(policy) = &wanted.resource else {
                continue;
            };
            let pool = &policy.spec.0.pool;
            let waiting = (!known.contains(pool)).then(|| {
                format!(
                    "{}: {}",
                    wanted.origin(),
                    wanted.problem(
                        FieldPath::of(&["spec", "pool"]),
                        format!("pool {pool:?} is not a PlacementPool in force; the policy waits for it")
                    )
                )
            });
            self.report(&wanted.resource.key().to_string(), waiting, "its pool is in force");
        }
        let spares: Vec<HotSpareSpec> = spares.into_iter().filter(|s| known.contains(&s.pool)).collect();
        live.sort_by(|a, b| a.pool.cmp(&b.pool));
        if spares != live {
            self.spares_refused = match self.core.update_hot_spare_specs(spares).await {
                Ok(_) => None,
                Err(crate::automanager::spares::SpareError::Closed) => return Err(QueryError::Closed),
                Err(e) => Some(e.to_string()),
            };
            let message = self
                .spares_refused
                .as_ref()
                .map(|why| format!("the HotSparePolicies were refused as a list, the specs in force stay: {why}"));
            self.report("HotSparePolicies", message, "in force");
        }
        Ok(())
    }

    async fn apply_bundles(&mut self, files: &Files) -> Result<(), QueryError> {
        let stored: BTreeMap<BundleId, (BundleSpec, BundleState)> = self
            .core
            .inspect(|core, _| {
                core.bundles()
                    .map(|b| (b.bundle_id.clone(), (b.spec.clone(), b.state)))
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
                Some((live, BundleState::Live)) if live != &spec => self.core.update_bundle(request).await,
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
                None => {
                    self.bundles.remove(&id);
                    self.report(&subject, None, "deleted");
                }
                Some((_, BundleState::Deleting)) => {}
                Some((_, BundleState::Live)) => match self.core.delete_bundle(id.clone()).await {
                    Ok(()) => {}
                    Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::NotFound => {
                        self.bundles.remove(&id);
                    }
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => self.report(&subject, Some(format!("{subject}: not deleted yet: {e}")), "deleted"),
                },
            }
        }
        Ok(())
    }

    async fn apply_nodes(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut names = BTreeSet::new();
        for wanted in files.of_kind(Kind::NorskNode) {
            let Resource::NorskNode(node) = &wanted.resource else {
                continue;
            };
            let name = wanted.resource.key().name;
            names.insert(name.clone());
            let node_id = NodeId(node.spec.node_id.clone());
            let asked = node_id.clone();
            let (known, cordoned) = self
                .core
                .inspect(move |core, _| (core.fleet().contains(&asked), core.is_cordoned(&asked)))
                .await?;
            let record = self.nodes.entry(name.clone()).or_insert_with(|| NodeApplied {
                node_id: node_id.clone(),
                by_spec: false,
                cordon: None,
                spare: None,
            });
            let subject = wanted.resource.key().to_string();
            if !known {
                record.cordon = Some(Observed::no(
                    crate::controller::node::CORDONED,
                    "UnknownNode",
                    format!("no node {node_id} in the fleet (yet)"),
                ));
                let message = format!(
                    "{}: no node {node_id} in the fleet (yet); applied once it is",
                    wanted.origin()
                );
                self.report(&subject, Some(message), "applied");
                continue;
            }
            let by_spec = record.by_spec;
            let outcome = match cordon_step(node.spec.cordoned, cordoned, by_spec) {
                CordonStep::Stay(observed) => Ok(observed),
                CordonStep::Cordon => self.core.cordon_node(node_id.clone()).await.map(|()| cordon_done(true)),
                CordonStep::Uncordon => self
                    .core
                    .uncordon_node(node_id.clone())
                    .await
                    .map(|()| cordon_done(false)),
            };
            let cordon = match outcome {
                Ok(observed) => observed,
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(e) => Observed::no(crate::controller::node::CORDONED, "CordonRefused", e.to_string()),
            };
            let spare = apply_spare_spec(&self.core, node_id.clone(), node.spec.spare.clone()).await?;
            let record = self.nodes.entry(name).or_insert_with(|| NodeApplied {
                node_id,
                by_spec: false,
                cordon: None,
                spare: None,
            });
            record.by_spec = cordon.status && cordon.reason == crate::controller::node::BY_SPEC;
            let refused: Vec<String> = [&cordon]
                .into_iter()
                .chain(spare.as_ref())
                .filter(|o| o.reason == "CordonRefused" || o.reason == "NotASpare")
                .map(|o| o.message.clone())
                .collect();
            record.cordon = Some(cordon);
            record.spare = spare;
            let message = (!refused.is_empty()).then(|| format!("{}: {}", wanted.origin(), refused.join("; ")));
            self.report(&subject, message, "applied");
        }
        // Documents gone: what they cordoned is uncordoned.
        let gone: Vec<String> = self.nodes.keys().filter(|n| !names.contains(*n)).cloned().collect();
        for name in gone {
            let Some(record) = self.nodes.remove(&name) else {
                continue;
            };
            self.report(&format!("NorskNode {name}"), None, "removed");
            if record.by_spec {
                match self.core.uncordon_node(record.node_id.clone()).await {
                    Ok(()) | Err(CommandError::UnknownNode(_) | CommandError::NodeGone(_)) => {}
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => eprintln!("error: NorskNode {name}: {} not uncordoned: {e}", record.node_id),
                }
            }
        }
        Ok(())
    }

    async fn apply_drains(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut names = BTreeSet::new();
        for wanted in files.of_kind(Kind::NodeDrain) {
            let Resource::NodeDrain(drain) = &wanted.resource else {
                continue;
            };
            let name = wanted.resource.key().name;
            names.insert(name.clone());
            let node_id = NodeId(drain.spec.node_id.clone());
            let record = self.drains.entry(name.clone()).or_insert_with(|| DrainApplied {
                node_id: node_id.clone(),
                started: None,
                refused: None,
                waiting: None,
                ended: false,
            });
            if let Some(started) = record.started {
                // Ours while the core holds a drain of the node started then;
                // a fresh core (Manager's stream broke) holds none: a drain
                // still in flight is started again (the core's drain is
                // idempotent per node), one that ended stays as it ended.
                let asked = node_id.clone();
                let held = self
                    .core
                    .inspect(move |core, _| core.drain_status(&asked).map(|s| (s.started, s.phase.is_final())))
                    .await?;
                match held {
                    Some((at, ended)) if at == started => {
                        record.ended = ended;
                        continue;
                    }
                    _ if record.ended => continue,
                    _ => {
                        record.started = None;
                        eprintln!(
                            "standalone: {}: the core lost the drain in flight; started again",
                            wanted.origin()
                        );
                    }
                }
            }
            if record.refused.as_ref().is_some_and(|r| r.spec == drain.spec) {
                continue;
            }
            let asked = node_id.clone();
            if !self.core.inspect(move |core, _| core.fleet().contains(&asked)).await? {
                let why = format!("no node {node_id} in the fleet (yet); the drain starts once it is");
                record.waiting = Some(why.clone());
                let message = format!("{}: {why}", wanted.origin());
                self.report(&wanted.resource.key().to_string(), Some(message), "started");
                continue;
            }
            let result = start_drain(&self.core, &drain.spec).await;
            let record = self.drains.entry(name).or_insert_with(|| DrainApplied {
                node_id: node_id.clone(),
                started: None,
                refused: None,
                waiting: None,
                ended: false,
            });
            record.waiting = None;
            let message = match result {
                Ok(state) => {
                    record.started = Some(state.started);
                    record.refused = None;
                    None
                }
                Err(CommandError::Closed) => return Err(QueryError::Closed),
                Err(e @ (CommandError::UnknownNode(_) | CommandError::NodeGone(_))) => {
                    record.refused = Some(Refusal {
                        spec: drain.spec.clone(),
                        reason: "Refused",
                        message: e.to_string(),
                    });
                    Some(format!("{}: refused: {e}", wanted.origin()))
                }
                Err(e) => Some(format!("{}: not started yet: {e}", wanted.origin())),
            };
            self.report(&wanted.resource.key().to_string(), message, "started");
        }
        // Documents gone: a drain deleted before its terminate is cancelled.
        let gone: Vec<String> = self.drains.keys().filter(|n| !names.contains(*n)).cloned().collect();
        for name in gone {
            let Some(record) = self.drains.remove(&name) else {
                continue;
            };
            self.report(&format!("NodeDrain {name}"), None, "removed");
            let Some(started) = record.started else {
                continue;
            };
            let asked = record.node_id.clone();
            let before_terminate = self
                .core
                .inspect(move |core, _| {
                    core.drain_status(&asked).is_some_and(|s| {
                        s.started == started && !s.phase.is_final() && s.phase != DrainPhase::Terminating
                    })
                })
                .await?;
            if before_terminate {
                match self.core.uncordon_node(record.node_id.clone()).await {
                    Ok(()) | Err(CommandError::UnknownNode(_) | CommandError::NodeGone(_)) => {
                        eprintln!(
                            "standalone: NodeDrain {name}: removed before its terminate: the drain is cancelled, {} uncordoned",
                            record.node_id
                        );
                    }
                    Err(CommandError::Closed) => return Err(QueryError::Closed),
                    Err(e) => eprintln!("error: NodeDrain {name}: the drain could not be cancelled: {e}"),
                }
            }
        }
        Ok(())
    }

    async fn apply_migrations(&mut self, files: &Files) -> Result<(), QueryError> {
        let mut keys = BTreeSet::new();
        for wanted in files.of_kind(Kind::JobMigration) {
            let Resource::JobMigration(migration) = &wanted.resource else {
                continue;
            };
            let key = namespaced_name(wanted);
            keys.insert(key.clone());
            let record = self.migrations.entry(key.clone()).or_insert_with(|| MigrationApplied {
                job_id: job_of(migration),
                id: None,
                refused: None,
                aborted_unstarted: false,
                abort_refused: None,
            });
            let subject = wanted.resource.key().to_string();
            match record.id.clone() {
                Some(id) if migration.spec.abort && record.abort_refused.is_none() => {
                    let asked = id.clone();
                    let state = self
                        .core
                        .inspect(move |core, _| {
                            core.migration_by_id(&asked)
                                .map(|s| (s.phase.is_ended(), s.past_point_of_no_return))
                        })
                        .await?;
                    match state {
                        Some((false, true)) => {
                            record.abort_refused = Some(
                                "abort asked after the point of no return: the migration fails forward".to_owned(),
                            );
                        }
                        Some((false, false)) => match self.core.abort_migration(id, ABORT_REASON.to_owned()).await {
                            Ok(()) => {}
                            Err(CommandError::Closed) => return Err(QueryError::Closed),
                            Err(e) => record.abort_refused = Some(e.to_string()),
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
                    let record = self.migrations.entry(key).or_insert_with(|| MigrationApplied {
                        job_id: job_of(migration),
                        id: None,
                        refused: None,
                        aborted_unstarted: false,
                        abort_refused: None,
                    });
                    let message = match result {
                        Ok(id) => {
                            record.id = Some(id);
                            record.refused = None;
                            None
                        }
                        Err(CommandError::Closed) => return Err(QueryError::Closed),
                        Err(
                            e @ (CommandError::Migration(_) | CommandError::UnknownNode(_) | CommandError::NodeGone(_)),
                        ) => {
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

/// The reason of a bundle the core's validation refused.
const INVALID_BUNDLE: &str = "InvalidBundle";

/// The reason given to `abortMigration`.
const ABORT_REASON: &str = "spec.abort set on the JobMigration";
