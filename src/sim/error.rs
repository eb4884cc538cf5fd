//! Why the simulator refused a request. Every refusal becomes a gRPC status
//! whose code says what kind of mistake it was and whose message says what
//! and why; a bad request never takes the simulator down.

use tonic::{Code, Status};

/// A request the simulated Manager (or its admin service) refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RequestError {
    /// A field the request needs is empty.
    #[error("{0} is required")]
    MissingField(&'static str),
    /// A field holds a value the simulator cannot use.
    #[error("invalid {field}: {why}")]
    InvalidField {
        field: &'static str,
        /// Why it was refused.
        why: String,
    },
    /// No node has this id.
    #[error("unknown node {0:?}")]
    UnknownNode(String),
    /// No job has this id.
    #[error("unknown job {0:?}")]
    UnknownJob(String),
    /// No bundle has this id.
    #[error("unknown bundle {0:?}")]
    UnknownBundle(String),
    /// The job has no instance with this key.
    #[error("job {job:?} has no instance {role:?}")]
    UnknownInstance {
        job: String,
        /// The instance key.
        role: String,
    },
    /// The provider has no such region.
    #[error("unknown {provider} region {region:?} (known: {known})")]
    UnknownRegion {
        /// `aws` or `oci`.
        provider: &'static str,
        /// The region asked for.
        region: String,
        /// The regions the catalogue has.
        known: String,
    },
    /// The provider sells no such instance type.
    #[error("unknown {provider} instance type {instance_type:?} (known: {known})")]
    UnknownInstanceType {
        /// `aws` or `oci`.
        provider: &'static str,
        /// The type asked for.
        instance_type: String,
        /// The types the catalogue has.
        known: String,
    },
    /// The OCI availability domain is not in the region.
    #[error("unknown availability domain {zone:?} for OCI region {region:?} (known: {known})")]
    UnknownZone {
        /// The domain asked for.
        zone: String,
        region: String,
        /// The region's domains.
        known: String,
    },
    /// The region has no more capacity of the instance type. The message
    /// carries EC2's error name, which the provisioning cascade reacts to.
    #[error("InsufficientInstanceCapacity: no {instance_type} capacity left in {region}")]
    InsufficientInstanceCapacity { region: String, instance_type: String },
    /// The node exists but cannot take the request in its phase.
    #[error("node {node:?} is {phase}, not running")]
    NodeNotRunning { node: String, phase: String },
    /// Something with this id exists and differs from the request.
    #[error("{what} already exists: {why}")]
    AlreadyExists {
        /// What (e.g. `bundle "b1"`).
        what: String,
        /// How it differs.
        why: String,
    },
    /// The request is valid but the state forbids it now.
    #[error("{what}: {why}")]
    FailedPrecondition {
        /// What was asked.
        what: String,
        /// Why not now.
        why: String,
    },
    /// The simulator does not model this.
    #[error("not supported by the simulator: {0}")]
    Unsupported(String),
    /// An injected fault (`rpc-fault`).
    #[error("{rpc} failed: injected fault (rpc-fault)")]
    InjectedFault {
        /// The RPC that failed.
        rpc: String,
    },
}

impl RequestError {
    /// The gRPC code a client sees.
    pub fn code(&self) -> Code {
        match self {
            Self::MissingField(_)
            | Self::InvalidField { .. }
            | Self::UnknownRegion { .. }
            | Self::UnknownInstanceType { .. }
            | Self::UnknownZone { .. } => Code::InvalidArgument,
            Self::UnknownNode(_) | Self::UnknownJob(_) | Self::UnknownBundle(_) | Self::UnknownInstance { .. } => {
                Code::NotFound
            }
            Self::InsufficientInstanceCapacity { .. } => Code::ResourceExhausted,
            Self::NodeNotRunning { .. } | Self::FailedPrecondition { .. } => Code::FailedPrecondition,
            Self::AlreadyExists { .. } => Code::AlreadyExists,
            Self::Unsupported(_) => Code::Unimplemented,
            Self::InjectedFault { .. } => Code::Unavailable,
        }
    }
}

impl From<RequestError> for Status {
    fn from(err: RequestError) -> Self {
        Status::new(err.code(), err.to_string())
    }
}

/// Joins names for an error message.
pub(crate) fn known<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    names.into_iter().collect::<Vec<_>>().join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn insufficient_capacity_is_resource_exhausted_and_names_the_ec2_error() {
        let status = Status::from(RequestError::InsufficientInstanceCapacity {
            region: "eu-west-1".into(),
            instance_type: "m5.xlarge".into(),
        });
        assert_eq!(status.code(), Code::ResourceExhausted);
        assert!(status.message().contains("InsufficientInstanceCapacity"));
    }

    #[test]
    fn unknown_ids_are_not_found_with_the_id_in_the_message() {
        let status = Status::from(RequestError::UnknownNode("n-42".into()));
        assert_eq!(status.code(), Code::NotFound);
        assert!(status.message().contains("n-42"));
    }
}
