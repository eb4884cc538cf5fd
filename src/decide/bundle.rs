//! What a `Bundle` document change means, for every front end: whether the
//! core is asked to create, update or delete the bundle or to do nothing,
//! and what the core's answer means — applied, refused for this spec (the
//! document waits for it to change), gone, still being deleted, or a
//! failure to try again. The operator's `Bundle` controller and
//! `standalone` both call [`apply_bundle`] and [`delete_bundle`], handing
//! them what the core holds and a way to send the command; neither decides
//! on its own, so the two cannot disagree.
//!
//! Two cases were once decided differently by the two, and are decided
//! here once:
//!
//! - A `createBundle` Manager answers `AlreadyExists` (Manager holds the
//!   bundle although the core does not: an earlier run created it, or the
//!   core has not heard of it yet) is followed by an `updateBundle`: a
//!   document is declarative, and what a person applies is what should run.
//! - A document removed for a bundle the core does not hold still sends
//!   `deleteBundle`: Manager may run its jobs all the same (a Manager
//!   without a bundle store, whose bundles the core hears of only once they
//!   are applied), and Manager answers `NOT_FOUND` when nothing is left.

use crate::automanager::{CommandError, RpcFailureKind};
use crate::model::{BundleSpec, BundleState};
use crate::placement::BundleIssue;

/// `Bundle`'s reason when the core's validation refused its spec.
pub const INVALID_BUNDLE: &str = "InvalidBundle";
/// `Bundle`'s reason when Manager refused its spec.
pub const REJECTED_BY_MANAGER: &str = "RejectedByManager";

/// A command on the core that brings a bundle in line with its document.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BundleCommand {
    /// `createBundle`.
    Create,
    /// `updateBundle`.
    Update,
}

impl BundleCommand {
    /// The command in a word, as errors name the action that failed.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Create => "create",
            Self::Update => "update",
        }
    }
}

/// Why the core or Manager refused a bundle's spec: it is not sent again
/// until the spec changes.
#[derive(Clone, Debug, PartialEq)]
pub enum BundleRefusal {
    /// The core's validation refused it; nothing reached Manager.
    Invalid(Vec<BundleIssue>),
    /// Manager refused it, in its words.
    Rejected(String),
}

impl BundleRefusal {
    /// The CamelCase reason the front ends report it under.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Invalid(_) => INVALID_BUNDLE,
            Self::Rejected(_) => REJECTED_BY_MANAGER,
        }
    }
}

/// What came of a wanted document.
#[derive(Debug)]
pub enum Applied {
    /// Manager runs the spec wanted: it was sent and taken, or nothing
    /// needed sending.
    InForce,
    /// Manager still runs the stop-then-delete saga of an earlier bundle of
    /// the same id (the resource deleted and made again): created once the
    /// saga has finished. Nothing was sent.
    AwaitingDeletion,
    /// The spec was refused.
    Refused(BundleRefusal),
    /// The command failed for a reason that may pass (Manager unreachable,
    /// the core closed): tried again.
    Failed {
        /// The command that failed.
        sent: BundleCommand,
        /// Why.
        error: CommandError,
    },
}

/// What came of a removed document (a deleted resource, a document gone
/// from the followed files).
#[derive(Debug)]
pub enum Deleted {
    /// Nothing is left of the bundle on Manager.
    Gone,
    /// Manager runs the stop-then-delete saga: it is gone once the saga
    /// has finished.
    Deleting,
    /// `deleteBundle` failed for a reason that may pass: tried again.
    Failed(CommandError),
}

/// The first command a wanted spec asks for, given what the core holds of
/// the bundle (its spec as applied and its state); `None` when nothing is
/// sent, with what that means.
pub fn apply_step(held: Option<(&BundleSpec, BundleState)>, wanted: &BundleSpec) -> Result<BundleCommand, Applied> {
    match held {
        None => Ok(BundleCommand::Create),
        Some((_, BundleState::Deleting)) => Err(Applied::AwaitingDeletion),
        // Compared as applied: which manual jobs run is the core's wanted
        // set, not part of Manager's stored spec.
        Some((live, BundleState::Live)) if !live.same_applied(wanted) => Ok(BundleCommand::Update),
        Some(_) => Err(Applied::InForce),
    }
}

/// What the core's answer to `sent`, a create or an update, means: the
/// next command to send (an update after a create Manager already held),
/// or what came of it.
pub fn answered(sent: BundleCommand, result: Result<(), CommandError>) -> Result<BundleCommand, Applied> {
    match result {
        Ok(()) => Err(Applied::InForce),
        Err(CommandError::Manager(f)) if sent == BundleCommand::Create && f.kind == RpcFailureKind::AlreadyExists => {
            Ok(BundleCommand::Update)
        }
        Err(CommandError::InvalidBundle { errors }) => Err(Applied::Refused(BundleRefusal::Invalid(errors))),
        Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::Rejected => {
            Err(Applied::Refused(BundleRefusal::Rejected(f.message)))
        }
        Err(error) => Err(Applied::Failed { sent, error }),
    }
}

/// Brings Manager in line with a wanted spec: the commands [`apply_step`]
/// and [`answered`] call for, each sent through `send`, and what came of
/// them.
pub async fn apply_bundle<F>(
    held: Option<(&BundleSpec, BundleState)>,
    wanted: &BundleSpec,
    mut send: impl FnMut(BundleCommand) -> F,
) -> Applied
where
    F: Future<Output = Result<(), CommandError>>,
{
    let mut next = apply_step(held, wanted);
    loop {
        match next {
            Ok(command) => next = answered(command, send(command).await),
            Err(applied) => return applied,
        }
    }
}

/// Removes a bundle no document wants any more, given the state the core
/// holds it in (none when it holds none): `send`, the `deleteBundle`
/// (Manager's stop-then-delete saga), is awaited unless the saga already
/// runs, and dropped unsent then.
pub async fn delete_bundle(held: Option<BundleState>, send: impl Future<Output = Result<(), CommandError>>) -> Deleted {
    if held == Some(BundleState::Deleting) {
        return Deleted::Deleting;
    }
    match send.await {
        // The core holds the bundle until Manager's saga has finished.
        Ok(()) if held.is_some() => Deleted::Deleting,
        Ok(()) => Deleted::Gone,
        Err(CommandError::Manager(f)) if f.kind == RpcFailureKind::NotFound => Deleted::Gone,
        Err(error) => Deleted::Failed(error),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::automanager::RpcFailure;
    use crate::model::BundleId;

    /// Manager as the two front ends meet it: the bundles it stores, and a
    /// spec it rejects.
    struct Manager {
        bundles: BTreeMap<BundleId, BundleSpec>,
        rejects: Option<BundleSpec>,
    }

    fn failure(kind: RpcFailureKind, message: &str) -> CommandError {
        CommandError::Manager(RpcFailure {
            kind,
            message: message.to_owned(),
        })
    }

    impl Manager {
        fn take(&mut self, id: &BundleId, spec: &BundleSpec, command: BundleCommand) -> Result<(), CommandError> {
            match command {
                _ if self.rejects.as_ref() == Some(spec) => Err(failure(RpcFailureKind::Rejected, "no such pool")),
                BundleCommand::Create if self.bundles.contains_key(id) => {
                    Err(failure(RpcFailureKind::AlreadyExists, "exists"))
                }
                BundleCommand::Create | BundleCommand::Update => {
                    self.bundles.insert(id.clone(), spec.clone());
                    Ok(())
                }
            }
        }

        fn delete(&mut self, id: &BundleId) -> Result<(), CommandError> {
            match self.bundles.remove(id) {
                Some(_) => Ok(()),
                None => Err(failure(RpcFailureKind::NotFound, "no such bundle")),
            }
        }
    }

    /// What a front end reports of one document change.
    #[derive(Debug, PartialEq)]
    enum Seen {
        InForce,
        Refused(&'static str),
        Gone,
        Other(String),
    }

    /// One front end's view of what the core holds: the operator's core is
    /// hydrated from Manager's snapshot and holds what Manager stores;
    /// `standalone` started afresh holds nothing of an earlier run's
    /// bundles until it applies them.
    fn held(manager: &Manager, id: &BundleId, knows: bool) -> Option<BundleSpec> {
        knows.then(|| manager.bundles.get(id).cloned()).flatten()
    }

    /// Runs `changes` (a wanted spec, or `None` for a removed document)
    /// through the shared decision as a front end calls it.
    async fn run(manager: &mut Manager, knows: bool, changes: &[Option<BundleSpec>]) -> Vec<Seen> {
        let id = BundleId("ns/ch1".to_owned());
        let mut seen = Vec::new();
        for change in changes {
            let live = held(manager, &id, knows);
            seen.push(match change {
                Some(spec) => {
                    let held = live.as_ref().map(|s| (s, BundleState::Live));
                    match apply_bundle(held, spec, |c| std::future::ready(manager.take(&id, spec, c))).await {
                        Applied::InForce => Seen::InForce,
                        Applied::Refused(r) => Seen::Refused(r.reason()),
                        other => Seen::Other(format!("{other:?}")),
                    }
                }
                None => {
                    let state = live.map(|_| BundleState::Live);
                    match delete_bundle(state, std::future::ready(manager.delete(&id))).await {
                        // The saga ran to its end at once in this Manager.
                        Deleted::Gone | Deleted::Deleting => Seen::Gone,
                        Deleted::Failed(e) => Seen::Other(e.to_string()),
                    }
                }
            });
        }
        seen
    }

    /// A one-job spec; specs of different pools differ.
    fn spec(pool: &str) -> BundleSpec {
        let yaml = format!("pool: {pool}\njobs:\n  - {{jobName: encode, requirements: {{requiredCapacity: 0.5}}}}\n");
        yaml_serde::from_str(&yaml).expect("a bundle spec")
    }

    /// The operator and `standalone` mean the same by the same document
    /// changes — created, its spec changed, a spec Manager rejects, the
    /// document removed — including when Manager holds the bundle from an
    /// earlier run the front end does not know of.
    #[tokio::test]
    async fn the_operator_and_standalone_mean_the_same_by_the_same_document_changes() {
        let changes = [
            Some(spec("a")),
            Some(spec("a")),
            Some(spec("b")),
            Some(spec("rejected")),
            Some(spec("c")),
            None,
            None,
        ];
        let expected = [
            Seen::InForce,
            Seen::InForce,
            Seen::InForce,
            Seen::Refused(REJECTED_BY_MANAGER),
            Seen::InForce,
            Seen::Gone,
            Seen::Gone,
        ];
        let mut outcomes = Vec::new();
        for knows in [true, false] {
            // Manager holds the bundle from an earlier run, with another spec.
            let mut manager = Manager {
                bundles: BTreeMap::from([(BundleId("ns/ch1".to_owned()), spec("old"))]),
                rejects: Some(spec("rejected")),
            };
            let seen = run(&mut manager, knows, &changes).await;
            assert!(manager.bundles.is_empty(), "the removed document leaves nothing behind");
            outcomes.push(seen);
        }
        assert_eq!(outcomes[0], expected, "as the operator calls it");
        assert_eq!(outcomes[1], expected, "as standalone calls it");
    }

    #[test]
    fn a_create_manager_already_holds_becomes_an_update_and_nothing_else_does() {
        let exists = failure(RpcFailureKind::AlreadyExists, "exists");
        assert!(matches!(
            answered(BundleCommand::Create, Err(exists)),
            Ok(BundleCommand::Update)
        ));
        let exists = failure(RpcFailureKind::AlreadyExists, "exists");
        assert!(matches!(
            answered(BundleCommand::Update, Err(exists)),
            Err(Applied::Failed {
                sent: BundleCommand::Update,
                ..
            })
        ));
        let rejected = failure(RpcFailureKind::Rejected, "no");
        assert!(matches!(
            answered(BundleCommand::Create, Err(rejected)),
            Err(Applied::Refused(BundleRefusal::Rejected(m))) if m == "no"
        ));
        assert!(matches!(
            answered(BundleCommand::Update, Err(CommandError::Closed)),
            Err(Applied::Failed {
                error: CommandError::Closed,
                ..
            })
        ));
    }

    #[test]
    fn a_bundle_being_deleted_is_created_again_only_once_its_saga_ended() {
        let wanted = spec("a");
        assert!(matches!(
            apply_step(Some((&wanted, BundleState::Deleting)), &wanted),
            Err(Applied::AwaitingDeletion)
        ));
        assert!(matches!(
            apply_step(Some((&wanted, BundleState::Live)), &wanted),
            Err(Applied::InForce)
        ));
        assert!(matches!(apply_step(None, &wanted), Ok(BundleCommand::Create)));
    }
}
