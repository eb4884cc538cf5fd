//! Why a reconcile failed, one error type per step of the pipeline — read,
//! decide, apply, write status — each variant named after what was tried,
//! on which object, with the error that stopped it chained as its source.
//! [`ReconcileError::reason`] is the stable, low-cardinality label of
//! `norsk_automanager_reconcile_errors_total`.
//!
//! What a controller does about an error is not decided here: see
//! [`Context::failed`](super::Context::failed).

use kube::runtime::finalizer;

use crate::automanager::{CommandError, QueryError};

/// Reading what a decision needs failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The core could not be read (it is closed, or its fleet view could
    /// not be built).
    #[error("failed to read the AutoManager core: {source}")]
    Core {
        /// Why.
        #[from]
        source: QueryError,
    },
    /// Listing objects from the API server failed.
    #[error(
        "failed to list the {kind}s{}: {source}",
        .selector.as_ref().map(|s| format!(" labelled {s}")).unwrap_or_default()
    )]
    List {
        /// The kind listed.
        kind: &'static str,
        /// The label selector of the list (none: every object of the kind).
        selector: Option<String>,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// Nothing can be decided yet: each variant waits for something that
/// passes by itself, and is retried on the backoff without a warning.
#[derive(Debug, thiserror::Error)]
pub enum DecideError {
    /// The core has not yet hydrated from Manager's snapshot: it does not
    /// know what runs.
    #[error("the AutoManager core has not hydrated from Manager yet")]
    NotHydrated,
    /// The pools have not yet been handed to the core this term: a bundle
    /// or policy naming a pool would be refused for nothing.
    #[error("waiting for the PlacementPools to be handed to the core")]
    PoolsNotSynced,
    /// The job's Bundle exists but the core has not been handed it yet this
    /// term: on a Manager without a bundle store, a new leader knows a job
    /// only once its Bundle is applied.
    #[error("bundle {bundle} is not yet applied to the AutoManager core this term")]
    BundleNotApplied {
        /// The bundle id.
        bundle: String,
    },
    /// Manager is still running the stop-then-delete saga of the bundle.
    #[error("bundle {bundle} is still being deleted on Manager")]
    StillDeleting {
        /// The bundle id.
        bundle: String,
    },
}

/// Carrying out a decision failed: on the core (and Manager), or on the
/// API server.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// A command on the core (and Manager) failed for a reason that may pass.
    #[error("failed to {action} {object}: {source}")]
    Command {
        /// What was attempted (`create`, `drain`, `cordon`, ...).
        action: &'static str,
        /// The object, with its kind (`bundle default/ch1`, `node node-a`).
        object: String,
        /// Why.
        #[source]
        source: CommandError,
    },
    /// Creating an object failed.
    #[error("failed to create {kind} {name}: {source}")]
    Create {
        kind: &'static str,
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Deleting an object failed.
    #[error("failed to delete {kind} {name}: {source}")]
    Delete {
        kind: &'static str,
        name: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Labelling an object failed.
    #[error("failed to label {kind} {name} with {label}={value}: {source}")]
    Label {
        kind: &'static str,
        name: String,
        label: &'static str,
        value: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Setting a field of an object's spec failed.
    #[error("failed to set {field} of {kind} {name}: {source}")]
    SetField {
        kind: &'static str,
        name: String,
        /// The field, as a path (`spec.cordoned`).
        field: &'static str,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// Adding or removing a finalizer failed.
    #[error(transparent)]
    Finalizer(#[from] FinalizerError),
}

/// Holding an object with a finalizer, or letting it go, failed.
#[derive(Debug, thiserror::Error)]
pub enum FinalizerError {
    /// The patch adding the finalizer was refused.
    #[error("failed to add the finalizer {finalizer} to {object}: {source}")]
    Add {
        finalizer: &'static str,
        /// The object, with its kind.
        object: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The patch removing the finalizer was refused.
    #[error("failed to remove the finalizer {finalizer} from {object}: {source}")]
    Remove {
        finalizer: &'static str,
        /// The object, with its kind.
        object: String,
        /// Why.
        #[source]
        source: kube::Error,
    },
    /// The object has no name, so no patch can name it.
    #[error("cannot hold {object} with the finalizer {finalizer}: the object has no name")]
    UnnamedObject {
        finalizer: &'static str,
        /// The object, with its kind.
        object: String,
    },
    /// The finalizer's JSON patch path was refused as invalid.
    #[error("cannot patch the finalizer {finalizer} of {object}: its patch path is invalid")]
    InvalidFinalizer {
        finalizer: &'static str,
        /// The object, with its kind.
        object: String,
    },
}

/// Writing an object's status (server-side apply of the status
/// subresource) was refused.
#[derive(Debug, thiserror::Error)]
#[error("failed to write the status of {kind} {name}: {source}")]
pub struct WriteStatusError {
    /// The object's kind.
    pub kind: String,
    pub name: String,
    /// Why.
    #[source]
    pub source: kube::Error,
}

/// Why a reconcile failed: the step that failed and why.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Reading what the decision needs.
    #[error(transparent)]
    Read(#[from] ReadError),
    /// Deciding: not possible yet.
    #[error(transparent)]
    Decide(#[from] DecideError),
    /// Carrying out the decision.
    #[error(transparent)]
    Apply(#[from] ApplyError),
    /// Writing the status.
    #[error(transparent)]
    WriteStatus(#[from] WriteStatusError),
}

impl From<QueryError> for ReconcileError {
    fn from(source: QueryError) -> Self {
        Self::Read(ReadError::Core { source })
    }
}

impl From<FinalizerError> for ReconcileError {
    fn from(error: FinalizerError) -> Self {
        Self::Apply(ApplyError::Finalizer(error))
    }
}

impl ReconcileError {
    /// A stable, low-cardinality reason for metrics (the `reason` label of
    /// `norsk_automanager_reconcile_errors_total`).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Read(ReadError::Core { .. }) => "ReadCore",
            Self::Read(ReadError::List { .. }) => "List",
            Self::Decide(DecideError::NotHydrated) => "NotHydrated",
            Self::Decide(DecideError::PoolsNotSynced) => "PoolsNotSynced",
            Self::Decide(DecideError::StillDeleting { .. }) => "StillDeleting",
            Self::Decide(DecideError::BundleNotApplied { .. }) => "BundleNotApplied",
            Self::Apply(ApplyError::Command { .. }) => "ManagerCommand",
            Self::Apply(ApplyError::Create { .. }) => "Create",
            Self::Apply(ApplyError::Delete { .. }) => "Delete",
            Self::Apply(ApplyError::Label { .. }) => "Label",
            Self::Apply(ApplyError::SetField { .. }) => "SetField",
            Self::Apply(ApplyError::Finalizer(_)) => "Finalizer",
            Self::WriteStatus(_) => "WriteStatus",
        }
    }

    /// Whether the reconcile only waits for something that passes by itself
    /// (worth a retry, not a warning).
    pub fn is_waiting(&self) -> bool {
        matches!(self, Self::Decide(_))
    }

    /// The error of a reconcile run behind `finalizer` on `object` (its
    /// kind and name): the reconcile's own, or the finalizer's.
    pub fn of_finalizer(error: finalizer::Error<Self>, finalizer: &'static str, object: &str) -> Self {
        let object = object.to_owned();
        match error {
            finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
            finalizer::Error::AddFinalizer(source) => FinalizerError::Add {
                finalizer,
                object,
                source,
            }
            .into(),
            finalizer::Error::RemoveFinalizer(source) => FinalizerError::Remove {
                finalizer,
                object,
                source,
            }
            .into(),
            finalizer::Error::UnnamedObject => FinalizerError::UnnamedObject { finalizer, object }.into(),
            finalizer::Error::InvalidFinalizer => FinalizerError::InvalidFinalizer { finalizer, object }.into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    fn refused() -> kube::Error {
        kube::Error::Api(
            kube::core::Status::failure("nodedrains.automanager.norsk.video \"n1\" is forbidden", "Forbidden")
                .with_code(403)
                .boxed(),
        )
    }

    /// Asserts `error` is classified `reason` and says `says` (then why).
    fn assert_says(error: impl Into<ReconcileError>, reason: &str, says: &str) -> ReconcileError {
        let error = error.into();
        assert_eq!(error.reason(), reason);
        assert!(error.to_string().starts_with(says), "{error}");
        error
    }

    #[test]
    fn each_step_names_what_failed_and_keeps_why() {
        let list = assert_says(
            ReadError::List {
                kind: "NorskNode",
                selector: Some("automanager.norsk.video/fleet=default".to_owned()),
                source: refused(),
            },
            "List",
            "failed to list the NorskNodes labelled automanager.norsk.video/fleet=default: ",
        );
        assert!(list.source().is_some_and(|s| s.to_string().contains("forbidden")));
        let every = ReadError::List {
            kind: "NodeDrain",
            selector: None,
            source: refused(),
        };
        assert_says(every, "List", "failed to list the NodeDrains: ");
        let delete = ApplyError::Delete {
            kind: "NorskNode",
            name: "node-a".to_owned(),
            source: refused(),
        };
        assert_says(delete, "Delete", "failed to delete NorskNode node-a: ");
        let create = ApplyError::Create {
            kind: "NorskNode",
            name: "node-a".to_owned(),
            source: refused(),
        };
        assert_says(create, "Create", "failed to create NorskNode node-a: ");
        let status = WriteStatusError {
            kind: "Bundle".to_owned(),
            name: "ch1".to_owned(),
            source: refused(),
        };
        assert_says(status, "WriteStatus", "failed to write the status of Bundle ch1: ");
    }

    #[test]
    fn a_finalizer_failure_keeps_the_api_error_and_the_reconciles_own_errors_pass_through() {
        let error = ReconcileError::of_finalizer(
            finalizer::Error::AddFinalizer(refused()),
            "automanager.norsk.video/drain",
            "NodeDrain n1",
        );
        assert_eq!(error.reason(), "Finalizer");
        assert!(
            error
                .to_string()
                .starts_with("failed to add the finalizer automanager.norsk.video/drain to NodeDrain n1: "),
            "{error}"
        );
        assert!(matches!(
            error.source().and_then(|s| s.downcast_ref::<kube::Error>()),
            Some(kube::Error::Api(_))
        ));

        let own = ReconcileError::of_finalizer(
            finalizer::Error::CleanupFailed(
                DecideError::StillDeleting {
                    bundle: "ns/b".to_owned(),
                }
                .into(),
            ),
            "automanager.norsk.video/bundle",
            "Bundle ns/b",
        );
        assert_eq!(own.reason(), "StillDeleting");
        assert!(own.is_waiting());
        assert_eq!(own.to_string(), "bundle ns/b is still being deleted on Manager");
    }
}
