//! What a `NorskNode` document's edits mean, whoever applies them: which
//! labels mark a mirrored node, what `spec.cordoned` asks of a node in its
//! current state (only what the spec cordoned is uncordoned), and the
//! `Cordoned` and `SpareSpecApplied` conditions each outcome of the core's
//! commands becomes. The operator's spec controller and `standalone` send
//! the commands; this module decides and words them. `spec.spare` is
//! brought in line the same way for both by [`apply_spare_spec`], handed
//! the core's handle.

use crate::automanager::{AutoManagerHandle, CommandError, QueryError};
use crate::model::{NodeId, NodeInventory, SpareSpec};

use super::conditions::Observed;

/// Condition: the node takes no new placements.
pub const CORDONED: &str = "Cordoned";
/// `Cordoned` reason: the spec asked for it.
pub const BY_SPEC: &str = "Spec";
/// `Cordoned` reason: a drain or an interruption notice cordoned the node.
const DRAIN_REASON: &str = "Drain";
/// `Cordoned` reason: the core refused the cordon (it holds no such node).
pub const CORDON_REFUSED: &str = "CordonRefused";
/// Condition: `spec.spare` is the live spare's spec.
pub const SPARE_SPEC_APPLIED: &str = "SpareSpecApplied";
/// `SpareSpecApplied` reason: the node is not a spare (any more), or unknown.
pub const NOT_A_SPARE: &str = "NotASpare";
/// Label on every `NorskNode` the operator mirrors.
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Label naming the fleet a `NorskNode` belongs to.
pub const FLEET: &str = "automanager.norsk.video/fleet";

/// What `spec.cordoned` (`wanted`) asks of a node that is `cordoned` now,
/// `by_spec` telling whether the spec cordoned it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CordonStep {
    /// `cordonNode`.
    Cordon,
    /// `uncordonNode`.
    Uncordon,
    /// Nothing to do: the `Cordoned` condition as it stands.
    Stay(Observed),
}

/// Only what the spec cordoned is uncordoned when the spec is cleared: a
/// node a drain (or an interruption notice) cordoned stays cordoned, since
/// uncordoning it would cancel the drain.
pub fn cordon_step(wanted: bool, cordoned: bool, by_spec: bool) -> CordonStep {
    match (wanted, cordoned) {
        (true, true) => CordonStep::Stay(cordon_done(true)),
        (true, false) => CordonStep::Cordon,
        (false, true) if by_spec => CordonStep::Uncordon,
        (false, true) => CordonStep::Stay(Observed::yes(
            CORDONED,
            DRAIN_REASON,
            "cordoned by a drain or an interruption notice",
        )),
        (false, false) => CordonStep::Stay(cordon_done(false)),
    }
}

/// The `Cordoned` condition once `cordonNode` / `uncordonNode` did its work.
pub fn cordon_done(cordoned: bool) -> Observed {
    if cordoned {
        Observed::yes(CORDONED, BY_SPEC, "no new placement lands here")
    } else {
        Observed::no(CORDONED, "Uncordoned", "")
    }
}

/// The `Cordoned` condition of a cordon or uncordon the core refused (an
/// unknown node, ...): nothing to cordon until Manager has the node. A
/// closed core is no refusal; the caller stops instead.
pub fn cordon_refused(error: &CommandError) -> Observed {
    Observed::no(CORDONED, CORDON_REFUSED, error.to_string())
}

/// Whether `spec.spare` (`wanted`) is already the live spare's spec
/// (`live`): then nothing is sent and the condition is [`spare_in_force`].
pub fn spare_unchanged(live: Option<&SpareSpec>, wanted: &SpareSpec) -> bool {
    live == Some(wanted)
}

/// `SpareSpecApplied` when `spec.spare` is the live spare's spec.
pub fn spare_in_force() -> Observed {
    Observed::yes(SPARE_SPEC_APPLIED, "InForce", "")
}

/// The `SpareSpecApplied` condition `updateHotSpareNode`'s answer becomes;
/// a closed core is an error, not a condition.
pub fn spare_updated(result: Result<(), CommandError>) -> Result<Observed, QueryError> {
    match result {
        Ok(()) => Ok(spare_in_force()),
        Err(CommandError::Closed) => Err(QueryError::Closed),
        // Not a spare (any more), or unknown: nothing to apply until it is.
        Err(e) => Ok(Observed::no(SPARE_SPEC_APPLIED, NOT_A_SPARE, e.to_string())),
    }
}

/// `spec.spare` (`wanted`) -> `updateHotSpareNode` on node `node_id`, when
/// it differs from the live spare's spec; the `SpareSpecApplied` condition
/// (none without a `spec.spare`).
pub async fn apply_spare_spec(
    core: &AutoManagerHandle,
    node_id: NodeId,
    wanted: Option<SpareSpec>,
) -> Result<Option<Observed>, QueryError> {
    let Some(wanted) = wanted else {
        return Ok(None);
    };
    let live = core.spare_spec(node_id.clone()).await?;
    if spare_unchanged(live.as_ref(), &wanted) {
        return Ok(Some(spare_in_force()));
    }
    spare_updated(core.update_hot_spare_node(node_id, wanted).await).map(Some)
}

/// `spec.inventory` -> what the core takes the node to be where Manager
/// reports no inventory (a declaration withdrawn when the field is).
pub async fn apply_inventory(
    core: &AutoManagerHandle,
    node_id: NodeId,
    declared: Option<NodeInventory>,
) -> Result<(), QueryError> {
    inventory_declared(core.declare_inventory(node_id, declared).await)
}

/// What a declared inventory's answer means: only a closed core fails it,
/// since a declaration needs nothing of the fleet and nothing else refuses
/// it.
pub fn inventory_declared(result: Result<(), CommandError>) -> Result<(), QueryError> {
    match result {
        Err(CommandError::Closed) => Err(QueryError::Closed),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_spec_cordons_and_uncordons_only_what_it_cordoned() {
        assert_eq!(cordon_step(true, false, false), CordonStep::Cordon);
        assert_eq!(cordon_step(false, true, true), CordonStep::Uncordon);
        assert_eq!(cordon_step(true, true, false), CordonStep::Stay(cordon_done(true)));
        assert_eq!(cordon_step(false, false, false), CordonStep::Stay(cordon_done(false)));
    }

    #[test]
    fn a_node_a_drain_cordoned_stays_cordoned_when_the_spec_is_cleared() {
        let CordonStep::Stay(cordoned) = cordon_step(false, true, false) else {
            panic!("uncordoning would cancel the drain");
        };
        assert_eq!(
            (
                cordoned.status_name(),
                cordoned.reason.as_str(),
                cordoned.message.as_str()
            ),
            ("True", "Drain", "cordoned by a drain or an interruption notice")
        );
    }

    #[test]
    fn the_cordoned_condition_says_whether_placements_land() {
        let on = cordon_done(true);
        assert_eq!(
            (on.type_, on.status_name(), on.reason.as_str(), on.message.as_str()),
            (CORDONED, "True", BY_SPEC, "no new placement lands here")
        );
        let off = cordon_done(false);
        assert_eq!((off.status_name(), off.reason.as_str()), ("False", "Uncordoned"));
    }
}
