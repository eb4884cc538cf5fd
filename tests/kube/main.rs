//! Kubernetes: the definitions, the chart, the operator (in-process and as
//! its binary) and the kubectl plugin against a real kube-apiserver, the
//! scenario the kind run plays, and the Argo CD and kstatus health checks.
//!
//! The tests of each file share one control plane ([`control_plane::shared`]),
//! each test in a namespace of its own; files do not share one.

mod api_outage;
mod chart;
mod chart_crds;
mod crds;
mod drain;
mod gitops_health;
mod kubectl_plugin;
mod manager_status;
mod operator;
mod operator_process;
mod operator_scale;
mod scenario;
mod smoke;

mod control_plane;
mod operator_support;
#[path = "../support/sim.rs"]
mod sim_support;
