//! The hot-spare reconciler: keeps each pool's `hotSpares[]` entry at its
//! `targetCount` of unconsumed spares, starts the `warmFor` image pulls,
//! and carries each spare's `SpareSpec` in its node tags (which is where
//! placement reads `reservedFor` / `exclusive` from). It also owns the
//! commands that change spares at run time: `updateHotSpareNode`,
//! `spareSpec` and `updateHotSpareSpecs`.
//!
//! A pass runs after hydration, whenever the fleet changed (node lifecycle
//! events, a spare taking a job), when the spare specs change, when a
//! provision backoff ends, and on the periodic tick
//! (`hotSpareReconcileIntervalMs`, default 60 s). A pass:
//! - turns a spare that took a job into an ordinary node (its spare tags
//!   are removed), so the underflow path replaces it. "Took" means Manager
//!   accepted the job's start there (the `StartJob` succeeded, or Manager
//!   reports the instance on it): a spare placement picked whose start is
//!   still awaited, refused or failed stays a spare with its tags and still
//!   counts, so a refused start never burns a spare nor provisions a
//!   replacement for one;
//! - reaps the unconsumed spares of a pool with no entry as orphans;
//! - under target: fires `spareUnderflow(pool, effective, target)` and
//!   provisions the shortfall from the pool's first elastic tier, tagged
//!   `spare=true` (a pool with no elastic tier only gets the callback);
//! - over target: terminates the excess coldest first (warmth against the
//!   entry's `warmFor`), `lastActivity` breaking ties;
//! - asks running spares to pull the images of their `warmFor` templates
//!   they do not advertise yet.
//!
//! It never places jobs (placement decides who takes a spare) and never
//! terminates a registered cluster node. `commands` holds the run-time
//! changes, `diff` what `updateHotSpareSpecs` returns, and `state` the
//! reconciler's own state.

pub(super) mod state;

pub use super::settings::DEFAULT_HOT_SPARE_RECONCILE_INTERVAL_MS;
pub use state::{HotSpareStatus, SPARE_PROVISION_RETRY_BACKOFF_MS};

pub(super) mod commands;
pub(super) mod diff;

use std::collections::{BTreeMap, BTreeSet, HashSet};

use crate::model::{HotSpareSpec, ManagerEvent, NodeId, PlacementTier, SpareSpec, UnixMillis, tags};

use super::facts::Facts;
use super::fleet::{NodeState, Provisioned, provisioned_tags};
use super::notification::Notification;
use super::outbox::{Outbox, Pending, SubsystemCall};
use super::protocol::{Rpc, RpcFailure};
use super::settings::AutoSettings;
use super::subsystem::{Pass, Subsystem};
use state::{SPARE_TAGS, SpareCount, SpareRequest, SpareState, is_spare_tagged};

pub use diff::{HotSpareChange, HotSpareField, HotSpareSpecsDiff, hot_spare_diff};

/// What the reconciler reads of the facts.
impl Facts {
    /// Spares of `pool`: tagged, not going, and on none of `excluded` (the
    /// nodes with an accepted job, to count them; every occupied node, to
    /// pick which to terminate or warm).
    fn unconsumed_spares<'b>(
        &'b self,
        pool: &'b str,
        excluded: &'b HashSet<NodeId>,
    ) -> impl Iterator<Item = &'b NodeState> + 'b {
        self.fleet.iter().filter(move |n| {
            is_spare_tagged(n)
                && !n.is_going()
                && !n.terminated
                && n.tags.get(tags::POOL).map(String::as_str) == Some(pool)
                && !excluded.contains(&n.id)
        })
    }

    /// `pool`'s unconsumed spares, live and provisioning: the one count the
    /// reconciler, the status and the metrics share.
    pub(super) fn spare_count(&self, pool: &str) -> SpareCount {
        let accepted = self.accepted_nodes();
        let mut count = SpareCount::default();
        for node in self.unconsumed_spares(pool, &accepted) {
            if node.is_launching() {
                count.provisioning += 1;
            } else {
                count.live += 1;
            }
        }
        count
    }

    /// Every node Manager accepted a job on.
    fn accepted_nodes(&self) -> HashSet<NodeId> {
        self.jobs.values().filter_map(|r| r.accepted_on().cloned()).collect()
    }

    /// Every node holding anything: a job bound there (its start accepted
    /// or not) or a migration's target. An occupied spare still counts
    /// until a start on it is accepted, but is never terminated or warmed.
    fn occupied_nodes(&self) -> HashSet<NodeId> {
        self.jobs
            .values()
            .flat_map(|r| r.binding.iter().chain(r.migration_target()))
            .map(|b| b.node_id.clone())
            .collect()
    }

    /// Spare-tagged nodes Manager accepted a job on.
    fn consumed_spares(&self) -> Vec<NodeId> {
        let spares: HashSet<&NodeId> = self
            .fleet
            .iter()
            .filter(|n| is_spare_tagged(n) && !n.is_going() && !n.terminated)
            .map(|n| &n.id)
            .collect();
        if spares.is_empty() {
            return Vec::new();
        }
        let consumed: BTreeSet<&NodeId> = self
            .jobs
            .values()
            .filter_map(|r| r.accepted_on())
            .filter(|n| spares.contains(n))
            .collect();
        consumed.into_iter().cloned().collect()
    }

    /// Whether this core may terminate the node: a cloud node, never a
    /// registered cluster node.
    fn is_terminable(&self, node: &NodeState) -> bool {
        if let Some(p) = &node.provisioned {
            return p.kind.is_cloud();
        }
        if let Some(inventory) = &node.inventory {
            return inventory.kind.is_cloud();
        }
        let tier = node
            .tags
            .get(tags::POOL)
            .zip(node.tags.get(tags::TIER))
            .and_then(|(pool, tier)| {
                self.pools()
                    .get(pool)
                    .and_then(|p| p.tiers.iter().find(|t| &t.name == tier))
            });
        tier.is_some_and(|t| t.kind.is_cloud())
    }

    /// `pool`'s unconsumed spares that hold nothing and may be terminated.
    fn idle_terminable_spares<'b>(&'b self, pool: &'b str, occupied: &'b HashSet<NodeId>) -> Vec<&'b NodeState> {
        self.unconsumed_spares(pool, occupied)
            .filter(|n| self.is_terminable(n))
            .collect()
    }
}

impl SpareState {
    /// Notes what the reconciler learns from Manager's events: when a node
    /// was last active, and how its image pulls settled.
    fn note(&mut self, event: &ManagerEvent, now: UnixMillis) {
        match event {
            ManagerEvent::NodeStarting(info)
            | ManagerEvent::NodeStarted(info)
            | ManagerEvent::NodeRunning { node: info, .. } => {
                self.activity.insert(info.node_id.clone(), now);
            }
            ManagerEvent::NodeInventory { node_id, .. } => {
                self.activity.insert(node_id.clone(), now);
            }
            ManagerEvent::ImagesPrefetched { node_id, results } => {
                let pulls = self.pulls.entry(node_id.clone()).or_default();
                for result in results {
                    pulls.requested.remove(&result.image);
                    // "An ok: false entry leaves that spare cold for that
                    // image": it is not asked for again.
                    if !result.ok {
                        pulls.failed.insert(result.image.clone());
                    }
                }
            }
            ManagerEvent::NodeStopped(node_id) => {
                self.activity.remove(node_id);
                self.pulls.remove(node_id);
            }
            _ => {}
        }
    }

    /// Per `hotSpares[]` entry: its live and provisioning spares, its
    /// target, the last underflow and any provision backoff (what a
    /// `HotSparePolicy` status shows).
    pub(super) fn status(&self, facts: &Facts) -> Vec<HotSpareStatus> {
        facts
            .settings()
            .hot_spares
            .iter()
            .map(|entry| {
                let SpareCount { live, provisioning } = facts.spare_count(&entry.pool);
                HotSpareStatus {
                    pool: entry.pool.clone(),
                    target: entry.target_count,
                    live,
                    provisioning,
                    underflow: self.underflow.get(&entry.pool).map(|&(effective, _)| effective),
                    last_underflow_at: self.underflow_at.get(&entry.pool).copied(),
                    consumed: self.consumed.get(&entry.pool).copied().unwrap_or(0),
                    backoff_until: self.backoff.get(&entry.pool).copied(),
                }
            })
            .collect()
    }

    /// When the reconciler next needs a step: its tick (while any pool has
    /// an entry) and the end of each provision backoff.
    fn deadline(&self, settings: &AutoSettings) -> Option<UnixMillis> {
        let tick = self.next_tick.filter(|_| !settings.hot_spares.is_empty());
        tick.into_iter().chain(self.backoff.values().copied()).min()
    }

    /// One reconciler pass, when one is due (see the module docs).
    fn reconcile(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
        let configured = !facts.settings().hot_spares.is_empty();
        let tick = configured && self.next_tick.is_none_or(|at| at <= now);
        let backoff_ended = self.backoff.values().any(|&until| until <= now);
        let changed = self.seen_epoch != Some(facts.capacity_epoch());
        if !configured {
            // Only orphans can be left to reap, and only a fleet change
            // can bring one.
            if !(changed || self.forced) {
                return;
            }
            if !facts.fleet.iter().any(is_spare_tagged) {
                self.seen_epoch = Some(facts.capacity_epoch());
                self.forced = false;
                return;
            }
        }
        // Manager accepting a start does not move the capacity epoch, so while
        // spares are configured a spare taking a job is looked for on
        // every step.
        let consumed = facts.consumed_spares();
        if !(tick || backoff_ended || changed || self.forced || !consumed.is_empty()) {
            return;
        }
        self.backoff.retain(|_, until| *until > now);
        // "A spare that picks up a job is no longer a spare": once Manager
        // accepted the job there, never on placement alone.
        for node_id in consumed {
            if let Some(pool) = facts.fleet.get(&node_id).and_then(|n| n.tags.get(tags::POOL)) {
                *self.consumed.entry(pool.clone()).or_default() += 1;
            }
            update_tags(
                facts,
                outbox,
                &node_id,
                BTreeMap::new(),
                SPARE_TAGS.map(str::to_owned).to_vec(),
            );
            self.pulls.remove(&node_id);
        }
        let occupied = facts.occupied_nodes();
        reap_orphans(facts, outbox, &occupied);
        let loud = tick || self.forced;
        // Owned: converging changes the facts the list is read from.
        let entries = facts.settings().hot_spares.clone();
        for entry in &entries {
            self.converge(facts, outbox, entry, &occupied, loud, now);
        }
        self.prefetch_warm_for(facts, outbox, &occupied);
        if tick {
            self.next_tick = Some(now + facts.settings().hot_spare_reconcile_interval_ms as i64);
        }
        self.forced = false;
        self.seen_epoch = Some(facts.capacity_epoch());
    }

    /// Brings one pool to its target.
    fn converge(
        &mut self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        entry: &HotSpareSpec,
        occupied: &HashSet<NodeId>,
        loud: bool,
        now: UnixMillis,
    ) {
        let SpareCount { live, provisioning } = facts.spare_count(&entry.pool);
        let effective = live + provisioning;
        let target = entry.target_count;
        if effective < target {
            let last = self.underflow.insert(entry.pool.clone(), (effective, target));
            if loud || last != Some((effective, target)) {
                self.underflow_at.insert(entry.pool.clone(), now);
                outbox.notify(Notification::SpareUnderflow {
                    pool: entry.pool.clone(),
                    effective,
                    target,
                });
            }
            if !self.backoff.contains_key(&entry.pool) {
                self.provision_shortfall(facts, outbox, entry, target - effective, now);
            }
            return;
        }
        self.underflow.remove(&entry.pool);
        if effective > target {
            self.terminate_coldest(facts, outbox, entry, occupied, effective - target);
        }
    }

    /// Provisions up to `shortfall` spares from the pool's first elastic
    /// tier, within its `maxNodes`. A pool with no elastic tier cannot be
    /// scaled here: the operator provides the hardware.
    fn provision_shortfall(
        &mut self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        entry: &HotSpareSpec,
        shortfall: u32,
        now: UnixMillis,
    ) {
        // Owned: provisioning changes the facts the pools are read from.
        let Some(tier) = facts
            .pools()
            .get(&entry.pool)
            .and_then(|p| p.first_elastic_tier())
            .cloned()
        else {
            return;
        };
        let counted = facts
            .fleet
            .iter()
            .filter(|n| {
                n.tags.get(tags::POOL) == Some(&entry.pool)
                    && n.tags.get(tags::TIER) == Some(&tier.name)
                    && n.phase != crate::model::NodePhase::Stopped
            })
            .count() as u32;
        let room = tier.max_nodes.map_or(u32::MAX, |max| max.saturating_sub(counted));
        for _ in 0..shortfall.min(room) {
            self.provision_spare(facts, outbox, entry, &tier, now);
        }
    }

    fn provision_spare(
        &mut self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        entry: &HotSpareSpec,
        tier: &PlacementTier,
        now: UnixMillis,
    ) {
        let node_id = facts
            .node_ids
            .fresh(&entry.pool, &tier.name, |id| facts.fleet.contains(id));
        let provisioned = Provisioned {
            pool: entry.pool.clone(),
            tier: tier.name.clone(),
            instance_type: entry.spec.instance_type.clone(),
            kind: tier.kind,
            region: entry
                .spec
                .region
                .clone()
                .or_else(|| tier.region.clone())
                .unwrap_or_default(),
            for_job: None,
            start_deadline: now + tier.effective_provision_timeout_ms() as i64,
        };
        let mut node_tags = provisioned_tags(&provisioned);
        node_tags.insert(tags::SPARE.to_owned(), "true".to_owned());
        for (name, value) in entry.spare_spec().tag_values() {
            if let Some(value) = value {
                node_tags.insert(name.to_owned(), value);
            }
        }
        let rpc = Rpc::CreateNode {
            provider: provisioned.kind,
            node_id: node_id.clone(),
            tags: node_tags.clone(),
            region: provisioned.region.clone(),
            availability_domain: tier.availability_domain.clone(),
            instance_type: provisioned.instance_type.clone(),
            launch_mode: tier.launch_mode,
            root_volume: tier.root_volume.clone(),
        };
        facts.fleet.add_provisioned(node_id.clone(), provisioned);
        facts.fleet.set_tags(&node_id, node_tags);
        self.activity.insert(node_id.clone(), now);
        outbox.call(
            rpc,
            Pending::Subsystem(SubsystemCall::Spare(SpareRequest::Provision {
                node_id,
                pool: entry.pool.clone(),
            })),
        );
    }

    /// Terminates `excess` unconsumed spares of the entry's pool, coldest
    /// first (fewest of the entry's `warmFor` images held), the least
    /// recently active first among equals; never one a job or migration
    /// target was placed on.
    fn terminate_coldest(
        &self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        entry: &HotSpareSpec,
        occupied: &HashSet<NodeId>,
        excess: u32,
    ) {
        let read = &*facts;
        let warm_images: BTreeSet<&String> = entry
            .warm_for
            .iter()
            .filter_map(|t| read.settings().template_images.get(t))
            .flatten()
            .collect();
        let mut candidates: Vec<(usize, UnixMillis, NodeId)> = read
            .idle_terminable_spares(&entry.pool, occupied)
            .into_iter()
            .map(|n| {
                let held = n.inventory.as_ref().map_or(0, |i| {
                    i.images.iter().filter(|image| warm_images.contains(image)).count()
                });
                let last = self.activity.get(&n.id).copied().unwrap_or(UnixMillis::MIN);
                (held, last, n.id.clone())
            })
            .collect();
        candidates.sort();
        for (_, _, node_id) in candidates.into_iter().take(excess as usize) {
            facts.terminate(outbox, &node_id);
        }
    }

    /// Asks each running unconsumed spare to pull the images of its
    /// `warmFor` templates it neither holds, nor was asked for, nor failed.
    fn prefetch_warm_for(&mut self, facts: &Facts, outbox: &mut Outbox, occupied: &HashSet<NodeId>) {
        let mut asks = Vec::new();
        for entry in &facts.settings().hot_spares {
            for node in facts.unconsumed_spares(&entry.pool, occupied) {
                if node.phase != crate::model::NodePhase::Running {
                    continue;
                }
                let held: BTreeSet<&String> = node.inventory.iter().flat_map(|i| &i.images).collect();
                let pulls = self.pulls.get(&node.id);
                let wanted: BTreeSet<String> = SpareSpec::from_tags(&node.tags)
                    .warm_for
                    .iter()
                    .filter_map(|t| facts.settings().template_images.get(t))
                    .flatten()
                    .filter(|image| !held.contains(image))
                    .filter(|image| pulls.is_none_or(|p| !p.requested.contains(*image) && !p.failed.contains(*image)))
                    .cloned()
                    .collect();
                if !wanted.is_empty() {
                    asks.push((node.id.clone(), wanted));
                }
            }
        }
        for (node_id, images) in asks {
            let pulls = self.pulls.entry(node_id.clone()).or_default();
            pulls.requested.extend(images.iter().cloned());
            let images: Vec<String> = images.into_iter().collect();
            outbox.call(
                Rpc::PrefetchImages {
                    node_id: node_id.clone(),
                    images: images.clone(),
                },
                Pending::Subsystem(SubsystemCall::Spare(SpareRequest::Prefetch { node_id, images })),
            );
        }
    }

    /// The result of a reconciler RPC.
    fn rpc_result(
        &mut self,
        facts: &mut Facts,
        outbox: &mut Outbox,
        request: SpareRequest,
        result: Result<(), RpcFailure>,
        now: UnixMillis,
    ) {
        let Err(failure) = result else {
            return;
        };
        match request {
            SpareRequest::Provision { node_id, pool } => {
                // No phantom node: it is forgotten (anything placed on it
                // is placed again) and the pool backs off.
                facts.fleet.remove(&node_id);
                self.activity.remove(&node_id);
                for mut record in facts.jobs.values_mut() {
                    if record.is_bound_to(&node_id) {
                        record.binding = None;
                    }
                }
                self.backoff.insert(pool, now + SPARE_PROVISION_RETRY_BACKOFF_MS);
                outbox.notify(Notification::Error {
                    message: format!("provisioning spare {node_id} failed: {}", failure.message),
                });
            }
            SpareRequest::Prefetch { node_id, images } => {
                // Not settled: asked again on a later pass.
                if let Some(pulls) = self.pulls.get_mut(&node_id) {
                    for image in &images {
                        pulls.requested.remove(image);
                    }
                }
                outbox.notify(Notification::Error {
                    message: format!("prefetching images on {node_id} failed: {}", failure.message),
                });
            }
            SpareRequest::Tags { node_id } => outbox.notify(Notification::Error {
                message: format!("updating the tags of {node_id} failed: {}", failure.message),
            }),
        }
    }
}

/// Unconsumed spares of pools without an entry are orphans; those holding
/// nothing are reaped.
fn reap_orphans(facts: &mut Facts, outbox: &mut Outbox, occupied: &HashSet<NodeId>) {
    let read = &*facts;
    let entries: BTreeSet<&str> = read.settings().hot_spares.iter().map(|e| e.pool.as_str()).collect();
    let pools: BTreeSet<&String> = read
        .fleet
        .iter()
        .filter(|n| is_spare_tagged(n))
        .filter_map(|n| n.tags.get(tags::POOL))
        .filter(|p| !entries.contains(p.as_str()))
        .collect();
    let orphans: Vec<NodeId> = pools
        .into_iter()
        .flat_map(|pool| read.idle_terminable_spares(pool, occupied))
        .map(|n| n.id.clone())
        .collect();
    for node_id in orphans {
        facts.terminate(outbox, &node_id);
    }
}

/// Writes tags to a node, here at once (placement reads them) and on
/// Manager.
pub(super) fn update_tags(
    facts: &mut Facts,
    outbox: &mut Outbox,
    node_id: &NodeId,
    set: BTreeMap<String, String>,
    remove: Vec<String>,
) {
    facts.fleet.update_tags(node_id, &set, &remove);
    outbox.call(
        Rpc::UpdateNodeTags {
            node_id: node_id.clone(),
            set,
            remove,
        },
        Pending::Subsystem(SubsystemCall::Spare(SpareRequest::Tags {
            node_id: node_id.clone(),
        })),
    );
}

impl Subsystem for SpareState {
    type Call = SpareRequest;
    const PASS: Pass = Pass::AfterPlacement;

    fn observe(&mut self, event: &ManagerEvent, now: UnixMillis) {
        self.note(event, now);
    }

    fn answered(
        &mut self,
        request: SpareRequest,
        result: Result<(), RpcFailure>,
        facts: &mut Facts,
        outbox: &mut Outbox,
        now: UnixMillis,
    ) {
        self.rpc_result(facts, outbox, request, result, now);
    }

    fn step(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
        self.reconcile(facts, outbox, now);
    }

    fn next_deadline(&self, facts: &Facts, _now: UnixMillis) -> Option<UnixMillis> {
        self.deadline(facts.settings())
    }

    /// How many spares took a job since start stays cumulative across a
    /// reconnect; the rest is rebuilt.
    fn carried(&self) -> Self {
        Self {
            consumed: self.consumed.clone(),
            ..Self::default()
        }
    }
}
