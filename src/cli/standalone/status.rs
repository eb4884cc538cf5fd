//! The status file: what the operator would write to each resource's
//! `status`, for every resource of the followed files, plus the fleet's
//! nodes and each file's standing — one JSON document, rewritten whole
//! (a temporary file renamed over it, so a reader never sees half of it)
//! whenever anything in it changed. The statuses are the builders the
//! operator uses too (`crate::decide::*_status`, `observe_pool`,
//! `observe_policy`), read from the core in one consistent step.
//!
//! Shape (every map keyed like `kubectl get`: `name`, or `namespace/name`
//! for namespaced kinds; node entries by node resource name):
//!
//! ```json
//! {"manager": "ready",
//!  "files": [{"file": "...", "resources": 2, "error": {"reason": "invalid", "documents": [...]}}],
//!  "placementPools": {"production": {...}}, "hotSparePolicies": {...},
//!  "bundles": {"default/ch1": {...}}, "nodeDrains": {...},
//!  "jobMigrations": {"default/move-ch1": {...}},
//!  "nodes": {"n1": {"nodeId": "n1", "cordoned": true, ...}},
//!  "headroom": {"fleet": [{"kind": "node", "survives": false, "worst": {...}}],
//!               "notAbsorbed": [{"kind": "node", "name": "n1", "why": "..."}]}}
//! ```
//!
//! `headroom` is there once resilience headroom was computed
//! (`experimental.headroom`): the fleet's verdict per kind of failure
//! domain and every loss it would not absorb; each pool's is in its status.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::automanager::{AutoManagerHandle, MigrationId, QueryError, ReadModel};
use crate::cli::documents::Kind;
use crate::crd::{
    self, BundleStatus, HotSparePolicyStatus, JobMigrationStatus, NodeDrainStatus, NorskNodeStatus, PlacementPoolStatus,
};
use crate::decide::bundle_status::{self, AdmissionCheck, observe};
use crate::decide::conditions::{self, Observed};
use crate::decide::drain_status;
use crate::decide::hot_spare::observe_policy;
use crate::decide::migration_status::{self, Unfollowed, ended_without_core, is_recorded};
use crate::decide::node_status::{DEFAULT_FLEET, mirrored_nodes};
use crate::decide::notes::{JobNotes, Notes};
use crate::decide::pool::{observe_pool, pool_conditions};
use crate::manager::stream::ConnectionState;
use crate::model::{BundleId, BundleSpec, HotSpareSpec, JobId, MigrationPhase, NodeId, UnixMillis};
use crate::placement::headroom::{DomainKind, HeadroomReport, KindSummary};

use super::apply::{Applier, Refusal, namespaced_name};
use super::follow::{FileStatus, Files};

/// What makes a migration lose the core that ran it in `standalone`.
const CORE_REPLACED: &str = "the core that ran it was replaced (Manager's stream broke)";

/// One node's entry.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeEntry {
    /// Manager's node id.
    pub node_id: String,
    /// Whether placement may use it.
    pub cordoned: bool,
    /// What a `NorskNode`'s status says.
    #[serde(flatten)]
    pub status: NorskNodeStatus,
}

/// The status document.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct StatusDocument {
    /// Manager's stream: `connecting`, `ready`, `transientFailure`, ...
    pub manager: Option<ConnectionState>,
    /// Each followed file.
    pub files: Vec<FileStatus>,
    /// Per `PlacementPool`.
    pub placement_pools: BTreeMap<String, PlacementPoolStatus>,
    /// Per `HotSparePolicy`.
    pub hot_spare_policies: BTreeMap<String, HotSparePolicyStatus>,
    /// Per `Bundle` (`namespace/name`), while it is wanted or Manager still
    /// deletes it.
    pub bundles: BTreeMap<String, BundleStatus>,
    /// Per `NodeDrain`.
    pub node_drains: BTreeMap<String, NodeDrainStatus>,
    /// Per `JobMigration` (`namespace/name`).
    pub job_migrations: BTreeMap<String, JobMigrationStatus>,
    /// Every node of the fleet, and every node a `NorskNode` document names.
    pub nodes: BTreeMap<String, NodeEntry>,
    /// The fleet's resilience headroom, once computed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub headroom: Option<FleetHeadroom>,
}

/// The fleet's resilience headroom in the status file.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct FleetHeadroom {
    /// Per kind of failure domain: whether the loss of any single one is
    /// absorbed, and the worst.
    pub fleet: Vec<KindSummary>,
    /// Every loss not absorbed.
    pub not_absorbed: Vec<NotAbsorbed>,
}

/// One loss the fleet would not absorb.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NotAbsorbed {
    /// `node`, `zone` or `provider`.
    pub kind: DomainKind,
    /// The node id, zone or provider kind.
    pub name: String,
    /// Why, in words.
    pub why: String,
}

/// The status file's view of a headroom report.
fn fleet_headroom(report: &HeadroomReport) -> FleetHeadroom {
    FleetHeadroom {
        fleet: report.fleet.clone(),
        not_absorbed: report
            .domains
            .iter()
            .filter(|d| !d.absorbed)
            .map(|d| NotAbsorbed {
                kind: d.domain.kind,
                name: d.domain.name.clone(),
                why: d.why().unwrap_or_default(),
            })
            .collect(),
    }
}

/// What the status reads of one pool.
struct PoolInput {
    pool: crate::model::PlacementPool,
    tiers: Vec<String>,
    left_out: Option<String>,
}

/// What the status reads of one bundle.
struct BundleInput {
    id: BundleId,
    spec: BundleSpec,
    refused: Option<Refusal<BundleSpec>>,
    check: AdmissionCheck,
    notes: BTreeMap<JobId, JobNotes>,
    previous: BundleStatus,
}

/// What the status reads of one drain.
struct DrainInput {
    name: String,
    node_id: NodeId,
    started: Option<UnixMillis>,
    why_not: Option<String>,
    previous: NodeDrainStatus,
}

/// What the status reads of one migration.
struct MigrationInput {
    key: String,
    job_id: JobId,
    id: Option<MigrationId>,
    refused: Option<String>,
    aborted_unstarted: bool,
    abort_refused: Option<String>,
    previous: JobMigrationStatus,
}

/// Everything the status reads besides the core, owned so it can be read
/// on the core's task.
struct Inputs {
    pools: Vec<PoolInput>,
    pools_refused: Option<String>,
    policies: Vec<(String, HotSpareSpec)>,
    spares_refused: Option<String>,
    bundles: Vec<BundleInput>,
    drains: Vec<DrainInput>,
    migrations: Vec<MigrationInput>,
    /// `NorskNode` documents' conditions, by node id.
    node_conditions: BTreeMap<NodeId, Vec<Observed>>,
    previous: StatusDocument,
}

/// What an earlier run's status file recorded: what standalone carries on
/// from after a restart, as the operator carries on from the resources'
/// status. Read leniently — the file is written by standalone, not by
/// people.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Recorded {
    /// The bundles wanted then: one no document wants now is deleted; the
    /// others' last placements stand until the next.
    #[serde(default)]
    pub bundles: BTreeMap<String, BundleStatus>,
    /// The drains: one that ended is not started again.
    #[serde(default)]
    pub node_drains: BTreeMap<String, NodeDrainStatus>,
    /// The migrations: one started is not started again; one in flight
    /// ends from where its job runs now.
    #[serde(default)]
    pub job_migrations: BTreeMap<String, JobMigrationStatus>,
}

/// Keeps the status current and the file written.
pub struct Status {
    path: Option<PathBuf>,
    /// The document last computed.
    document: StatusDocument,
    /// The JSON last written.
    written: Option<String>,
    /// What notifications said about each job (the last placement in
    /// words, resilience degradations), as the operator keeps them.
    pub notes: Notes,
    /// Why the last write failed (printed once).
    write_error: Option<String>,
}

impl Status {
    /// A status written to `path` (kept in memory only without one).
    pub fn new(path: Option<PathBuf>) -> Self {
        Self {
            path,
            document: StatusDocument::default(),
            written: None,
            notes: Notes::default(),
            write_error: None,
        }
    }

    /// What the status file holds from an earlier run (nothing without a
    /// file, or when it cannot be read: said once).
    pub fn recorded(&self) -> Recorded {
        let Some(path) = &self.path else {
            return Recorded::default();
        };
        let text = match std::fs::read_to_string(path) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Recorded::default(),
            Err(e) => {
                eprintln!(
                    "warning: {}: not read, nothing carried over from it: {e}",
                    path.display()
                );
                return Recorded::default();
            }
        };
        serde_json::from_str(&text).unwrap_or_else(|e| {
            eprintln!(
                "warning: {}: not a status file, nothing carried over from it: {e}",
                path.display()
            );
            Recorded::default()
        })
    }

    /// Starts from the statuses `recorded` holds for the drains and
    /// migrations the files want.
    pub fn resume(&mut self, recorded: &Recorded, applier: &Applier) {
        self.document.bundles = recorded.bundles.clone();
        self.document.node_drains = still_wanted(&recorded.node_drains, &applier.drains);
        self.document.job_migrations = still_wanted(&recorded.job_migrations, &applier.migrations);
    }

    /// Recomputes the document and rewrites the file if it changed.
    /// Migrations the core lost before their point of no return are handed
    /// back to `applier` to be started again (their request still stands).
    pub async fn refresh(
        &mut self,
        core: &AutoManagerHandle,
        files: &Files,
        applier: &mut Applier,
    ) -> Result<(), QueryError> {
        let inputs = self.inputs(files, applier);
        let manager = *core.connection().borrow();
        let (mut document, restart) = core.read(move |core| read(core, inputs)).await?;
        document.manager = Some(manager);
        document.files = files.status();
        for key in restart {
            applier.restart_migration(&key);
        }
        for record in applier.bundles.values_mut() {
            record.changed = false;
        }
        self.document = document;
        self.write();
        Ok(())
    }

    fn inputs(&self, files: &Files, applier: &Applier) -> Inputs {
        let previous = self.document.clone();
        let pools = files
            .each::<crd::PlacementPool>()
            .map(|(_, pool)| {
                let pool_model = pool.to_model();
                PoolInput {
                    tiers: pool.spec.tiers.iter().map(|t| t.name.clone()).collect(),
                    left_out: applier.pools.left_out.get(&pool_model.name).cloned(),
                    pool: pool_model,
                }
            })
            .collect();
        let policies = files
            .each::<crd::HotSparePolicy>()
            .map(|(w, policy)| (w.resource.key().name, policy.spec.0.clone()))
            .collect();
        let bundles = applier
            .bundles
            .iter()
            // A bundle an earlier run held, no document wants and this run
            // never saw the spec of: deleted, not reported.
            .filter(|(_, record)| record.wanted || record.spec != BundleSpec::default())
            .map(|(id, record)| {
                let previous = previous.bundles.get(id.as_str()).cloned().unwrap_or_default();
                let notes = bundle_status::job_notes(&self.notes, id, &record.spec, Some(&previous));
                BundleInput {
                    id: id.clone(),
                    spec: record.spec.clone(),
                    refused: record.refused.clone(),
                    check: bundle_status::admission_check(Some(&previous), !record.changed),
                    notes,
                    previous,
                }
            })
            .collect();
        let drains = applier
            .drains
            .iter()
            .map(|(name, record)| DrainInput {
                name: name.clone(),
                node_id: record.node_id.clone(),
                started: record.started,
                why_not: record
                    .refused
                    .as_ref()
                    .map(|r| r.message.clone())
                    .or_else(|| record.waiting.clone()),
                previous: previous.node_drains.get(name).cloned().unwrap_or_default(),
            })
            .collect();
        let migrations = files
            .of_kind(Kind::JobMigration)
            .filter_map(|wanted| {
                let key = namespaced_name(wanted);
                let record = applier.migrations.get(&key)?;
                Some(MigrationInput {
                    previous: previous.job_migrations.get(&key).cloned().unwrap_or_default(),
                    key,
                    job_id: record.job_id.clone(),
                    id: record.id.clone(),
                    refused: record.refused.as_ref().map(|r| r.message.clone()),
                    aborted_unstarted: record.aborted_unstarted,
                    abort_refused: record.abort_refused.clone(),
                })
            })
            .collect();
        let node_conditions = applier
            .nodes
            .values()
            .map(|n| {
                (
                    n.node_id.clone(),
                    n.cordon.iter().chain(n.spare.iter()).cloned().collect(),
                )
            })
            .collect();
        Inputs {
            pools,
            pools_refused: applier.pools.refused.clone(),
            policies,
            spares_refused: applier.spares_refused.clone(),
            bundles,
            drains,
            migrations,
            node_conditions,
            previous,
        }
    }

    fn write(&mut self) {
        let Some(path) = self.path.clone() else {
            return;
        };
        let json = match serde_json::to_string_pretty(&self.document) {
            Ok(json) => json + "\n",
            Err(e) => return self.write_failed(&path, format!("cannot render the status: {e}")),
        };
        if self.written.as_ref() == Some(&json) {
            return;
        }
        match replace(&path, &json) {
            Ok(()) => {
                self.written = Some(json);
                if self.write_error.take().is_some() {
                    eprintln!("standalone: {}: written again", path.display());
                }
            }
            Err(e) => self.write_failed(&path, e.to_string()),
        }
    }

    fn write_failed(&mut self, path: &Path, message: String) {
        if self.write_error.as_ref() != Some(&message) {
            eprintln!("error: {}: the status is not written: {message}", path.display());
            self.write_error = Some(message);
        }
    }
}

/// The statuses `recorded` holds for the names `wanted` still has.
fn still_wanted<S: Clone, W>(recorded: &BTreeMap<String, S>, wanted: &BTreeMap<String, W>) -> BTreeMap<String, S> {
    recorded
        .iter()
        .filter(|(name, _)| wanted.contains_key(*name))
        .map(|(name, status)| (name.clone(), status.clone()))
        .collect()
}

/// Writes `text` to a temporary file beside `path`, then renames it over
/// `path`: a reader sees the old document or the new one, never a part.
fn replace(path: &Path, text: &str) -> std::io::Result<()> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let temporary = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&temporary, text)?;
    std::fs::rename(&temporary, path)
}

/// The document from the core at `now`, and the migrations to start again.
fn read(core: ReadModel<'_>, inputs: Inputs) -> (StatusDocument, Vec<String>) {
    let previous = &inputs.previous;
    let mut document = StatusDocument {
        headroom: core.headroom().map(fleet_headroom),
        ..StatusDocument::default()
    };
    for PoolInput { pool, tiers, left_out } in &inputs.pools {
        let name = &pool.name;
        let in_force = core.settings().placement_pools.contains(pool);
        let observed = pool_conditions(left_out.as_ref().or(inputs.pools_refused.as_ref()), in_force);
        let before = previous.placement_pools.get(name).cloned().unwrap_or_default();
        let status = PlacementPoolStatus {
            conditions: conditions::merge(&before.conditions, conditions::with_reconciling(observed, &[]), None),
            ..observe_pool(core, name, tiers)
        };
        document.placement_pools.insert(name.clone(), status);
    }
    for (name, spec) in &inputs.policies {
        let (status, observed) = observe_policy(core, spec, inputs.spares_refused.clone());
        let before = previous.hot_spare_policies.get(name).cloned().unwrap_or_default();
        let status = HotSparePolicyStatus {
            conditions: conditions::merge(&before.conditions, conditions::with_reconciling(observed, &[]), None),
            ..status
        };
        document.hot_spare_policies.insert(name.clone(), status);
    }
    for bundle in inputs.bundles {
        let observed = match &bundle.refused {
            Some(refusal) => bundle_status::refused(refusal.reason, refusal.message.clone()),
            None => {
                let mut observed = observe(core, &bundle.id, &bundle.spec, &bundle.notes, bundle.check);
                if bundle.check == AdmissionCheck::Skip {
                    bundle_status::keep_admitted(&mut observed, Some(&bundle.previous));
                }
                observed
            }
        };
        let status = bundle_status::status_of(&bundle.previous, observed, None);
        document.bundles.insert(bundle.id.to_string(), status);
    }
    for drain in inputs.drains {
        let held = drain
            .started
            .and_then(|started| core.drain(&drain.node_id).filter(|s| s.started == started));
        let mut next = match (held, &drain.why_not) {
            (Some(state), _) => {
                drain_status::status_of(state, |id| core.migration(id).map(|m| m.target_node_id.clone()))
            }
            (None, Some(why)) if drain.started.is_none() => NodeDrainStatus {
                reason: Some(why.clone()),
                ..NodeDrainStatus::default()
            },
            // Not started yet, or lost with a replaced core (started again
            // next round): what was last seen.
            (None, _) => NodeDrainStatus {
                conditions: Vec::new(),
                ..drain.previous.clone()
            },
        };
        next.conditions = conditions::merge(&drain.previous.conditions, drain_status::conditions_of(&next), None);
        document.node_drains.insert(drain.name, next);
    }
    let mut restart = Vec::new();
    for migration in inputs.migrations {
        let mut next = migration_of(core, &migration, &mut restart);
        if let Some(why) = &migration.abort_refused {
            next.reason = Some(why.clone());
        }
        next.conditions = conditions::merge(
            &migration.previous.conditions,
            migration_status::conditions_of(&next),
            None,
        );
        document.job_migrations.insert(migration.key, next);
    }
    let mut cordons = inputs.node_conditions;
    for (name, mirrored) in mirrored_nodes(core, DEFAULT_FLEET) {
        let mut observed = mirrored.conditions;
        observed.extend(cordons.remove(&mirrored.node_id).unwrap_or_default());
        let cordoned = core.is_cordoned(&mirrored.node_id);
        let entry = node_entry(previous, &name, &mirrored.node_id, cordoned, observed, mirrored.status);
        document.nodes.insert(name, entry);
    }
    // Nodes a document names that the fleet does not hold (yet).
    for (node_id, observed) in cordons {
        let name = crate::decide::node_status::node_resource_name(DEFAULT_FLEET, node_id.as_str());
        let entry = node_entry(previous, &name, &node_id, false, observed, NorskNodeStatus::default());
        document.nodes.insert(name, entry);
    }
    (document, restart)
}

/// The entry of the node named `name`: `status` with `observed` merged
/// into the conditions the node's entry in `previous` had.
fn node_entry(
    previous: &StatusDocument,
    name: &str,
    node_id: &NodeId,
    cordoned: bool,
    observed: Vec<Observed>,
    status: NorskNodeStatus,
) -> NodeEntry {
    let before = previous
        .nodes
        .get(name)
        .map(|n| n.status.conditions.clone())
        .unwrap_or_default();
    NodeEntry {
        node_id: node_id.to_string(),
        cordoned,
        status: NorskNodeStatus {
            conditions: conditions::merge(&before, observed, None),
            ..status
        },
    }
}

/// A migration's status (conditions apart).
fn migration_of(core: ReadModel<'_>, migration: &MigrationInput, restart: &mut Vec<String>) -> JobMigrationStatus {
    let now = core.now();
    let previous = &migration.previous;
    let Some(id) = &migration.id else {
        return if migration.aborted_unstarted {
            match previous.phase {
                Some(MigrationPhase::Aborted) => previous.clone(),
                _ => ended_without_core(
                    &JobMigrationStatus::default(),
                    MigrationPhase::Aborted,
                    now,
                    "aborted before it started: nothing was moved".to_owned(),
                ),
            }
        } else {
            JobMigrationStatus {
                reason: migration.refused.clone(),
                ..JobMigrationStatus::default()
            }
        };
    };
    // Ids restart with every core: the recorded start tells this core's
    // migration from an earlier one's of the same id.
    let recorded = Some(previous)
        .filter(|p| p.migration_id.as_deref() == Some(id.as_str()))
        .cloned()
        .unwrap_or_default();
    match core
        .migration(id)
        .filter(|s| is_recorded(s, migration.job_id.as_str(), &recorded))
    {
        Some(state) => migration_status::status_of(state),
        None => {
            let node = core.node_of(&migration.job_id).map(ToString::to_string);
            match migration_status::unfollowed(&recorded, node, now, CORE_REPLACED) {
                Unfollowed::Ended(status) => status,
                Unfollowed::RolledBack { status, .. } => {
                    restart.push(migration.key.clone());
                    status
                }
            }
        }
    }
}
