//! What a `NodeDrain` document asks, whoever applies it: the command its
//! spec becomes (`drainNode`, or `handleNodeInterruption` when it carries a
//! provider's notice) and which answers of the core refuse it. The
//! operator's controller and `standalone` both start drains by it.

use crate::automanager::{CommandError, DrainOptions, InterruptionNotice, StrategyFor};
use crate::crd::NodeDrainSpec;
use crate::model::NodeId;

use super::drain_status::millis;

/// The command a `NodeDrain`'s spec sends to the core for its node.
#[derive(Clone, Debug)]
pub enum DrainCommand {
    /// `drainNode`.
    Drain(NodeId, DrainOptions),
    /// `handleNodeInterruption`: the answer to a provider's notice.
    Interruption(NodeId, InterruptionNotice),
}

/// What a `NodeDrain`'s `spec` asks of the core for its node: a drain
/// (`drainNode`) or, with `spec.interruption`, the answer to a provider's
/// notice (`handleNodeInterruption`).
pub fn drain_command(spec: &NodeDrainSpec) -> DrainCommand {
    let node = NodeId::from(spec.node_id.as_str());
    // No strategy in the spec: each job moves with its declared one.
    let strategy_for = StrategyFor {
        default: spec.strategy,
        ..StrategyFor::default()
    };
    match &spec.interruption {
        Some(interruption) => DrainCommand::Interruption(
            node,
            InterruptionNotice {
                kind: interruption.kind.into(),
                deadline: interruption.deadline.as_deref().and_then(millis),
                strategy_for,
            },
        ),
        None => DrainCommand::Drain(
            node,
            DrainOptions {
                timeout_ms: spec.timeout_seconds.map(|s| u64::from(s) * 1000),
                force: spec.force,
                strategy_for,
                after: spec.after,
            },
        ),
    }
}

/// Whether the core's answer refuses the drain for good (its node unknown
/// or gone): the document then waits for a change. Any other error is
/// transient and tried again.
pub fn drain_refused(error: &CommandError) -> bool {
    matches!(error, CommandError::UnknownNode(_) | CommandError::NodeGone(_))
}
