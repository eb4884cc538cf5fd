//! Helpers shared by the placement tests: fleets, pools and bundles written
//! as YAML (the spec's own notation), and one-call placements with the trace
//! on so a test can assert which filter rejected which node.

use norsk_auto_manager::model::{BundleId, BundleSpec, FleetSnapshot, PlacementPool};
use norsk_auto_manager::placement::{
    FleetView, Outcome, Placement, PlacementRequest, Pools, Rejection, SequentialNodeIds, Verdict, validate_pools,
};

/// One pool `p` with one fixed tier `t`: nothing is ever provisioned.
pub const ONE_FIXED_TIER: &str = "
- name: p
  tiers:
    - {name: t, kind: aws, scaleOut: fixed}
";

/// Validated pools from YAML (a list of `PlacementPool`).
pub fn pools(yaml: &str) -> Pools {
    let pools: Vec<PlacementPool> = yaml_serde::from_str(yaml).expect("pools parse");
    validate_pools(pools).expect("pools are valid")
}

/// A fleet snapshot from YAML.
pub fn snapshot(yaml: &str) -> FleetSnapshot {
    yaml_serde::from_str(yaml).expect("fleet parses")
}

/// The view of a fleet (YAML) against pools (YAML).
pub fn view(pools_yaml: &str, fleet_yaml: &str) -> FleetView {
    FleetView::new(&snapshot(fleet_yaml), pools(pools_yaml)).expect("fleet view builds")
}

/// A bundle spec from YAML.
pub fn bundle(yaml: &str) -> BundleSpec {
    yaml_serde::from_str(yaml).expect("bundle parses")
}

/// The id every test bundle uses.
pub fn bundle_id() -> BundleId {
    BundleId::from("default/b")
}

/// Places one job as a launch, trace on.
pub fn launch(view: &FleetView, spec: &BundleSpec, replica: u32, job: &str) -> Placement {
    let id = bundle_id();
    let request = PlacementRequest::launch(&id, spec, replica, job).with_trace(true);
    norsk_auto_manager::placement::place(view, request, &mut SequentialNodeIds::default()).expect("placement runs")
}

/// Places with a customised request, trace on.
pub fn place_with(view: &FleetView, request: PlacementRequest<'_>) -> Placement {
    norsk_auto_manager::placement::place(view, request.with_trace(true), &mut SequentialNodeIds::default())
        .expect("placement runs")
}

/// The node a placement chose, or what it provisions.
pub fn node_of(placement: &Placement) -> Option<&str> {
    match &placement.outcome {
        Outcome::Placed { node_id, .. } | Outcome::Provision { node_id, .. } => Some(node_id.as_str()),
        Outcome::NoCapacityInAnyPool => None,
    }
}

/// The rejection of `node` in the first tier walked, if it was rejected.
pub fn rejection(placement: &Placement, node: &str) -> Option<Rejection> {
    let trace = placement.trace.as_ref().expect("trace recorded");
    let tier = trace.tiers.first().expect("a tier walked");
    tier.nodes
        .iter()
        .find(|n| n.node_id.as_str() == node)
        .and_then(|n| match &n.verdict {
            Verdict::Rejected { rejection, .. } => Some(rejection.clone()),
            Verdict::Survived { .. } => None,
        })
}

/// Applies a placement to the view, as plan does.
pub fn apply(view: &mut FleetView, spec: &BundleSpec, replica: u32, job: &str, placement: &Placement) {
    let id = bundle_id();
    let request = PlacementRequest::launch(&id, spec, replica, job);
    norsk_auto_manager::placement::apply_placement(view, &request, &placement.outcome).expect("placement applies");
}
