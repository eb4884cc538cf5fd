//! Nodes joining, changing and leaving a view after it was built: a
//! provision's prospective node, a node added, described anew (membership,
//! spare tags, cordon, condition, inventory) or removed. Each change lands
//! in place, in the tier lists, the id order and the candidate index; the
//! view is never rebuilt for it.

use crate::model::{FleetNode, InstanceShape, NodeId, NodePhase, ProviderKind};

use super::{FleetError, FleetView, NO_SLOT, NodeIdx};

impl FleetView {
    /// Adds a prospective node of `pool`/`tier` provisioned as
    /// `instance_type`, so later placements can use it. It advertises what
    /// the shape says, in the tier's provider and region, with no AZ yet.
    pub fn add_prospective_node(
        &mut self,
        id: NodeId,
        pool: &str,
        tier: &str,
        instance_type: &str,
    ) -> Result<(), FleetError> {
        let unknown = || FleetError::UnknownShape {
            pool: pool.to_owned(),
            tier: tier.to_owned(),
            instance_type: instance_type.to_owned(),
        };
        let tier_spec = self
            .pools
            .get(pool)
            .and_then(|p| p.tiers.iter().find(|t| t.name == tier));
        let tier_spec = tier_spec.ok_or_else(unknown)?;
        let shape = tier_spec
            .candidate_instance_types
            .iter()
            .find(|s| s.instance_type == instance_type);
        let node = prospective_node(
            id,
            pool,
            tier,
            tier_spec.kind,
            tier_spec.region.clone(),
            shape.ok_or_else(unknown)?,
        );
        self.push_node(&node).map(|_| ())
    }

    /// Adds a node after the view was built: into its tier's list, the id
    /// order (with a label of its own) and the index.
    fn push_node(&mut self, node: &FleetNode) -> Result<NodeIdx, FleetError> {
        let (idx, slot) = self.append_node(node)?;
        if let Some(list) = self.tier_list(slot) {
            list.push(idx);
        }
        for moved in self.insert_in_order(idx) {
            self.refile(moved, false);
        }
        self.index
            .reprofile(idx, &self.hot[idx as usize], &self.nodes[idx as usize]);
        Ok(idx)
    }

    /// Adds `node` (as a snapshot would hold it, its jobs reserved) to the
    /// view.
    pub fn add_node(&mut self, node: &FleetNode) -> Result<(), FleetError> {
        self.push_node(node)?;
        for job in &node.jobs {
            self.reserve(&node.id, job)?;
        }
        Ok(())
    }

    /// Replaces what the view holds of node `node.id` — its membership,
    /// spare tags, cordon, condition, inventory and jobs — with `node`, as
    /// [`FleetView::new`] would have read it. The node keeps its place.
    pub fn replace_node(&mut self, node: &FleetNode) -> Result<(), FleetError> {
        let idx = self
            .node_index(&node.id)
            .ok_or_else(|| FleetError::UnknownNode(node.id.clone()))?;
        self.vacate(idx);
        let old_slot = self.hot[idx as usize].slot;
        let (mut hot, entry) = self.describe(node);
        hot.rank = self.hot[idx as usize].rank;
        if hot.slot != old_slot {
            if let Some(list) = self.tier_list(old_slot) {
                list.retain(|&i| i != idx);
            }
            if let Some(list) = self.tier_list(hot.slot) {
                list.push(idx);
            }
        }
        self.hot[idx as usize] = hot;
        self.nodes[idx as usize] = entry;
        self.index
            .reprofile(idx, &self.hot[idx as usize], &self.nodes[idx as usize]);
        for job in &node.jobs {
            self.reserve(&node.id, job)?;
        }
        Ok(())
    }

    /// Removes node `id` and every job reserved on it from the view.
    pub fn remove_node(&mut self, id: &NodeId) -> Result<(), FleetError> {
        let idx = self.node_index(id).ok_or_else(|| FleetError::UnknownNode(id.clone()))?;
        self.vacate(idx);
        self.remove_from_order(idx);
        self.by_id.remove(id);
        let slot = self.hot[idx as usize].slot;
        if let Some(list) = self.tier_list(slot) {
            list.retain(|&i| i != idx);
        }
        // The index stays unused: nothing refers to it any more, and no
        // filter passes a node of no pool without an inventory.
        let hot = &mut self.hot[idx as usize];
        hot.slot = NO_SLOT;
        hot.flags = 0;
        self.index
            .forget(idx, &self.hot[idx as usize], &self.nodes[idx as usize]);
        Ok(())
    }

    /// Takes every job off node `idx` (its description stays).
    fn vacate(&mut self, idx: NodeIdx) {
        let slot = self.hot[idx as usize].slot;
        let entry = &mut self.nodes[idx as usize];
        for port in entry.ports.drain(..) {
            self.index.port_claim(slot, port, false);
        }
        for o in std::mem::take(&mut entry.occupants) {
            self.free_occupants.push(o);
            if let Some(bundle) = &self.occupants[o as usize].bundle
                && let Some(list) = self.replicas.get_mut(bundle)
            {
                list.retain(|&other| other != o);
            }
        }
        entry.gpus.iter_mut().for_each(|d| d.used = 0.0);
        let usable = entry.usable;
        let hot = &mut self.hot[idx as usize];
        hot.free = usable;
        hot.refill(usable);
        hot.used_cores = 0;
        hot.occupants = 0;
        hot.exclusive_occupants = 0;
        hot.ports = 0;
        self.refile(idx, false);
    }
}

fn prospective_node(
    id: NodeId,
    pool: &str,
    tier: &str,
    kind: ProviderKind,
    region: Option<String>,
    shape: &InstanceShape,
) -> FleetNode {
    FleetNode {
        id,
        pool: Some(pool.to_owned()),
        tier: Some(tier.to_owned()),
        phase: NodePhase::Prospective,
        cordoned: false,
        unhealthy: false,
        spare: false,
        spare_spec: Default::default(),
        tags: Default::default(),
        inventory: Some(shape.prospective_inventory(kind, region.unwrap_or_default())),
        jobs: Vec::new(),
    }
}
