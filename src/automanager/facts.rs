//! The facts every subsystem reads and the few that change them: the fleet,
//! the job records, the bundles, the broken marks, what the fleet is placed
//! with, how new nodes are named and whether Manager's snapshot is in.
//!
//! A subsystem is handed `&Facts` to read or `&mut Facts` with the outbox
//! to act. Each part keeps its own revision through its own mutators
//! ([`Fleet::changes`], [`Jobs::released`], [`PlacedWith::revision`]), so the
//! capacity epoch cannot miss a change: nobody bumps it at a call site.

use std::collections::BTreeMap;

use crate::model::{Bundle, BundleId, NodeId};
use crate::placement::Pools;

use super::fleet::Fleet;
use super::jobs::Jobs;
use super::node_ids::NodeIds;
use super::notification::Notification;
use super::outbox::{Outbox, Pending};
use super::placed_with::PlacedWith;
use super::protocol::Rpc;
use super::settings::{AutoSettings, ValidSettings};
use super::view_cache::FactsRevision;

/// See the module docs.
#[derive(Clone, Debug)]
pub(super) struct Facts {
    pub(super) fleet: Fleet,
    pub(super) jobs: Jobs,
    pub(super) bundles: BTreeMap<BundleId, Bundle>,
    /// The broken bundles, each with its reason.
    pub(super) broken: BTreeMap<BundleId, String>,
    /// What the fleet is placed with: settings, pools, held-back capacity.
    pub(super) placed_with: PlacedWith,
    /// How the nodes this core provisions are named.
    pub(super) node_ids: NodeIds,
    /// Whether Manager's snapshot has been taken in.
    pub(super) hydrated: bool,
    /// Nodes a job left while the snapshot was replayed (node, whether a
    /// single-use job left it): whether each is empty is known only once
    /// every job has been read, so they are released then.
    pub(super) held_releases: Vec<(NodeId, bool)>,
}

impl Facts {
    /// The facts of a core that has heard nothing yet, placing with `valid`
    /// and naming its nodes with `process`.
    pub(super) fn new(valid: ValidSettings, process: u64) -> Self {
        Self {
            fleet: Fleet::default(),
            jobs: Jobs::default(),
            bundles: BTreeMap::new(),
            broken: BTreeMap::new(),
            placed_with: PlacedWith::new(valid),
            node_ids: NodeIds::new(process),
            hydrated: false,
            held_releases: Vec::new(),
        }
    }

    /// The settings in force.
    pub(super) fn settings(&self) -> &AutoSettings {
        self.placed_with.settings()
    }

    /// The pools in force.
    pub(super) fn pools(&self) -> &Pools {
        self.placed_with.pools()
    }

    /// Moves whenever capacity may have appeared or the fleet changed in a
    /// way the spare reconciler, node services and headroom must see: a job
    /// that found nowhere is retried once it moves. Each part is counted by
    /// what owns the change — the fleet ([`Fleet::changes`]), the job
    /// records (a hold ended or moved, [`Jobs::released`]) and what the
    /// fleet is placed with ([`PlacedWith::revision`]) — so no change can be
    /// made without it.
    pub(super) fn capacity_epoch(&self) -> u64 {
        self.fleet.changes() + self.jobs.released() + self.placed_with.revision()
    }

    /// Where the facts stand now (see [`FactsRevision`]).
    pub(super) fn revision(&self) -> FactsRevision {
        FactsRevision {
            fleet: self.fleet.revision(),
            jobs: self.jobs.revision(),
            placed_with: self.placed_with.revision(),
        }
    }

    /// `TerminateNode`, with `nodeTerminated` fired once per node at issue
    /// time.
    pub(super) fn terminate(&mut self, outbox: &mut Outbox, node_id: &NodeId) {
        if !self.fleet.terminate(node_id) {
            return;
        }
        outbox.call(
            Rpc::TerminateNode {
                node_id: node_id.clone(),
            },
            Pending::TerminateNode(node_id.clone()),
        );
        outbox.notify(Notification::NodeTerminated {
            node_id: node_id.clone(),
        });
    }
}
