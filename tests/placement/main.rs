//! The placement engine: a test per filter and per key component, the spec's
//! examples as scenarios, resilience headroom, validation, property tests
//! over random fleets (the candidate index against the full scan among
//! them), and `plan` on `examples/`.

mod equivalence;
mod filters;
mod headroom;
mod plan;
mod properties;
mod ranking;
mod scenarios;
mod support;
mod validation;
