//! Reading what people write: the settings files and the resource
//! documents (`plan`'s inputs, the directory `standalone` follows), decoded
//! exactly as strictly as the API server admits the same resources.
//!
//! - [`strict`]: YAML decoding that refuses unknown fields, every problem
//!   with its field path, line and column.
//! - [`schema`]: the value constraints of the CRDs' OpenAPI schemas.
//! - [`rules`]: names and the CEL rules, including those checked on an
//!   update.
//! - [`resource`]: documents of every kind, typed.
//!
//! Nothing here acts: a refused document is an error value naming the
//! file's document, the field and why.

pub mod resource;
pub mod rules;
pub mod schema;
pub mod strict;

pub use resource::{Document, DocumentError, Kind, OfKind, Resource, ResourceKey, decode_file, update_problems};
pub use strict::{FieldPath, Problem, Segment};
