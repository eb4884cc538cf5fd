//! The read model: everything the edges — the controllers, `standalone`'s
//! status file, the metrics — read of the core, as views the core computes
//! by its own rules. An edge never sees the core's records (job records,
//! bindings, the fleet's node states): it is handed a [`ReadModel`] for one
//! consistent reading between two steps of the core, and every answer is
//! owned view data ([`JobView`], [`NodeView`], [`PoolUsage`],
//! [`DrainState`], [`MigrationState`], …), so an edge cannot re-derive a
//! rule of its own from the core's internals.
//!
//! Every reading carries the core's [`revision`](ReadModel::revision): the
//! number of steps the core has taken. No view changes between two steps,
//! so two readings at one revision agree (up to what depends on the clock
//! alone: a schedule's next transition, restarts in the trailing hour).
//! [`AutoManagerHandle::changes`](super::AutoManagerHandle::changes)
//! yields each new revision, which is how an edge learns that its views may
//! be stale.

use std::collections::BTreeMap;

use crate::model::{BundleId, BundleSpec, BundleState, JobId, MigrationId, NodeId, SpareSpec, UnixMillis};
use crate::placement::headroom::HeadroomReport;
use crate::placement::{Admission, BundleValidation, FleetError, Placement, PlacementError};

use super::core::AutoManagerCore;
use super::drain::state::DrainState;
use super::metrics::{Metrics, PoolUsage};
use super::migration::state::MigrationState;
use super::queries::{JobView, NodeView};
use super::schedule::state::ScheduleView;
use super::settings::AutoSettings;
use super::spares::state::HotSpareStatus;

/// One consistent reading of the core (see the module docs).
#[derive(Clone, Copy)]
pub struct ReadModel<'a> {
    core: &'a AutoManagerCore,
    now: UnixMillis,
}

/// A bundle as the core holds it.
#[derive(Clone, Debug, PartialEq)]
pub struct BundleView {
    /// Its spec as applied: which manual jobs run is the core's desired
    /// state, not the stored spec's.
    pub applied: BundleSpec,
    /// Created, or being deleted on Manager.
    pub state: BundleState,
}

impl AutoManagerCore {
    /// The core as the edges read it at `now`.
    pub fn read(&self, now: UnixMillis) -> ReadModel<'_> {
        ReadModel { core: self, now }
    }
}

impl<'a> ReadModel<'a> {
    /// When the reading was taken (the core's clock).
    pub fn now(&self) -> UnixMillis {
        self.now
    }

    /// The core's revision: how many steps it has taken.
    pub fn revision(&self) -> u64 {
        self.core.revision()
    }

    /// Whether Manager's `InitialDataComplete` has been seen.
    pub fn is_hydrated(&self) -> bool {
        self.core.is_hydrated()
    }

    /// The settings in force (the live pools and hot-spare specs included).
    pub fn settings(&self) -> &'a AutoSettings {
        self.core.settings()
    }

    /// `templateImages`.
    pub fn template_images(&self) -> &'a BTreeMap<String, Vec<String>> {
        self.core.template_images()
    }

    /// Bundle `id` as the core holds it, if Manager has it.
    pub fn bundle(&self, id: &BundleId) -> Option<BundleView> {
        let stored = self.core.facts.bundles.get(id)?;
        Some(BundleView {
            applied: self.core.applied_spec(id)?,
            state: stored.state,
        })
    }

    /// Every bundle Manager holds, by id.
    pub fn bundles(&self) -> BTreeMap<BundleId, BundleView> {
        self.core
            .facts
            .bundles
            .keys()
            .filter_map(|id| Some((id.clone(), self.bundle(id)?)))
            .collect()
    }

    /// Why bundle `id` is broken, if it is.
    pub fn broken(&self, id: &BundleId) -> Option<&'a str> {
        self.core.broken_bundles().get(id).map(String::as_str)
    }

    /// Bundle `id`'s schedule, if it has one.
    pub fn schedule(&self, id: &BundleId) -> Option<ScheduleView> {
        self.core.schedule_view(id, self.now)
    }

    /// Job `job_id` of bundle `bundle_id`.
    pub fn job(&self, bundle_id: &BundleId, job_id: &JobId) -> JobView {
        self.core.job_view(bundle_id, job_id, self.now)
    }

    /// The node job `job_id` is placed on, if any.
    pub fn node_of(&self, job_id: &JobId) -> Option<&'a NodeId> {
        self.core.node_of(job_id)
    }

    /// Every node of the fleet, in id order (a node swept after it stopped
    /// is not here).
    pub fn nodes(&self) -> Vec<NodeView> {
        self.core.node_views()
    }

    /// Whether the fleet holds node `id`.
    pub fn knows_node(&self, id: &NodeId) -> bool {
        self.core.knows_node(id)
    }

    /// `isCordoned`.
    pub fn is_cordoned(&self, id: &NodeId) -> bool {
        self.core.is_cordoned(id)
    }

    /// `metrics()`.
    pub fn metrics(&self) -> Metrics {
        self.core.metrics(self.now)
    }

    /// Pool `pool`'s usage, per tier of `tier_names`: what its gauges and
    /// its status both show.
    pub fn pool_usage(&self, pool: &str, tier_names: &[String]) -> PoolUsage {
        self.core.pool_usage(pool, tier_names)
    }

    /// The last headroom report, once one was computed.
    pub fn headroom(&self) -> Option<&'a HeadroomReport> {
        self.core.headroom()
    }

    /// Every hot-spare policy's state.
    pub fn hot_spares(&self) -> Vec<HotSpareStatus> {
        self.core.hot_spare_status()
    }

    /// A node's live spare spec, if it is a spare.
    pub fn spare_spec(&self, id: &NodeId) -> Option<SpareSpec> {
        self.core.spare_spec(id)
    }

    /// `drainStatus`: the node's running drain, or its last one.
    pub fn drain(&self, id: &NodeId) -> Option<&'a DrainState> {
        self.core.drain_status(id)
    }

    /// `migrationById`.
    pub fn migration(&self, id: &MigrationId) -> Option<&'a MigrationState> {
        self.core.migration_by_id(id)
    }

    /// `migrations()`: in flight and recently ended, oldest first.
    pub fn migrations(&self) -> Vec<&'a MigrationState> {
        self.core.migrations()
    }

    /// `validateBundle` against the fleet as it stands.
    pub fn validate_bundle(&self, spec: &BundleSpec) -> Result<BundleValidation, FleetError> {
        self.core.validate_bundle(spec)
    }

    /// `validateBundleAdmission` against the fleet as it stands.
    pub fn validate_bundle_admission(&self, id: &BundleId, spec: &BundleSpec) -> Result<Admission, FleetError> {
        self.core.validate_bundle_admission(id, spec)
    }

    /// `placeDryRun`: one job of one replica through the engine, traced,
    /// nothing placed.
    pub fn place_dry_run(
        &self,
        id: &BundleId,
        spec: &BundleSpec,
        replica_index: u32,
        job_name: &str,
    ) -> Result<Result<Placement, PlacementError>, FleetError> {
        self.core.place_dry_run(id, spec, replica_index, job_name)
    }
}

#[cfg(test)]
mod tests {
    use crate::automanager::testing::{ONE_JOB, TestCore};
    use crate::model::{BundleId, BundleState, JobPhase, runtime_job_id};

    #[test]
    fn every_step_is_a_new_revision_and_a_reading_shows_what_the_step_did() {
        let mut test = TestCore::hydrated(&[("a", 4.0)]);
        let before = test.read().revision();
        assert!(test.read().bundles().is_empty());
        let spec = test.bundle("ns/ch1", ONE_JOB);
        let after = test.read().revision();
        // One bundle update and one job announcement: two steps.
        assert_eq!(after, before + 2);
        let id = BundleId::from("ns/ch1");
        let bundle = test.read().bundle(&id).expect("the bundle is held");
        assert_eq!((bundle.applied, bundle.state), (spec, BundleState::Live));
        assert_eq!(test.read().bundles().keys().collect::<Vec<_>>(), [&id]);
        // Placed in the step that announced it, not yet running.
        let job = runtime_job_id(&id, 0, "encode");
        assert_eq!(test.read().node_of(&job).map(|n| n.as_str()), Some("a"));
        assert_eq!(test.read().job(&id, &job).phase, JobPhase::Starting);
        test.start_all();
        assert!(test.read().revision() > after);
        assert_eq!(test.read().job(&id, &job).phase, JobPhase::Running);
    }
}
