//! Injected RPC faults (`rpc-fault`): a Manager RPC can be slowed, made to
//! fail with UNAVAILABLE some fraction of the time, or both. A fault named
//! for one RPC overrides the `*` fault. The delay is wall-clock time, not
//! simulated time: it exists to exercise client deadlines, which are real.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::OnceLock;
use std::time::Duration;

use prost::Message;
use rand::Rng;
use rand::rngs::StdRng;

use super::RequestError;
use crate::manager::proto::{DESCRIPTOR_SET, sim_admin};

/// The name that applies a fault to every RPC.
pub const EVERY_RPC: &str = "*";

/// One RPC's fault.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RpcFault {
    /// Wall-clock delay before the call is handled.
    pub delay: Duration,
    /// Fraction (0..=1) of calls that fail with UNAVAILABLE.
    pub failure_rate: f64,
}

/// What a call suffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Verdict {
    /// Wait this long first.
    pub delay: Duration,
    /// Then fail.
    pub fail: bool,
}

/// The fault table.
#[derive(Debug, Default)]
pub struct RpcFaults {
    by_rpc: BTreeMap<String, RpcFault>,
}

impl RpcFaults {
    /// Sets or clears a fault; the RPC must be one of Manager's (or `*`).
    pub fn apply(&mut self, req: sim_admin::RpcFaultRequest) -> Result<(), RequestError> {
        if req.rpc.is_empty() {
            return Err(RequestError::MissingField("rpc"));
        }
        if req.rpc != EVERY_RPC && !manager_rpcs().contains(&req.rpc) {
            return Err(RequestError::InvalidField {
                field: "rpc",
                why: format!(
                    "{:?} is not a Manager RPC (known: {EVERY_RPC}, {})",
                    req.rpc,
                    manager_rpcs().iter().cloned().collect::<Vec<_>>().join(", ")
                ),
            });
        }
        if req.clear {
            self.by_rpc.remove(&req.rpc);
            return Ok(());
        }
        if !(0.0..=1.0).contains(&req.failure_rate) {
            return Err(RequestError::InvalidField {
                field: "failure_rate",
                why: format!("{} is not a fraction between 0 and 1", req.failure_rate),
            });
        }
        self.by_rpc.insert(
            req.rpc,
            RpcFault {
                delay: Duration::from_millis(req.delay_ms),
                failure_rate: req.failure_rate,
            },
        );
        Ok(())
    }

    /// What a call to `rpc` suffers now.
    pub fn decide(&self, rpc: &str, rng: &mut StdRng) -> Verdict {
        let Some(fault) = self.by_rpc.get(rpc).or_else(|| self.by_rpc.get(EVERY_RPC)) else {
            return Verdict {
                delay: Duration::ZERO,
                fail: false,
            };
        };
        let fail = fault.failure_rate > 0.0 && rng.random_bool(fault.failure_rate);
        Verdict {
            delay: fault.delay,
            fail,
        }
    }
}

/// The Manager service's RPC names, read from the compiled descriptors so
/// the list cannot drift from `manager.proto`.
pub fn manager_rpcs() -> &'static BTreeSet<String> {
    static NAMES: OnceLock<BTreeSet<String>> = OnceLock::new();
    NAMES.get_or_init(|| {
        prost_types::FileDescriptorSet::decode(DESCRIPTOR_SET)
            .map(|set| {
                set.file
                    .iter()
                    .filter(|f| f.package() == "norsk.api.manager")
                    .flat_map(|f| f.service.iter())
                    .filter(|s| s.name() == "Manager")
                    .flat_map(|s| s.method.iter().map(|m| m.name().to_owned()))
                    .collect()
            })
            .unwrap_or_default()
    })
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn fault(rpc: &str, delay_ms: u64, failure_rate: f64) -> sim_admin::RpcFaultRequest {
        sim_admin::RpcFaultRequest {
            rpc: rpc.into(),
            delay_ms,
            failure_rate,
            clear: false,
        }
    }

    #[test]
    fn manager_rpc_names_come_from_the_descriptors() {
        assert!(manager_rpcs().contains("StartJob"));
        assert!(manager_rpcs().contains("CreateBundle"));
    }

    #[test]
    fn a_named_fault_overrides_the_wildcard_and_clear_removes_it() {
        let mut faults = RpcFaults::default();
        let mut rng = StdRng::seed_from_u64(1);
        faults.apply(fault("*", 5, 0.0)).unwrap();
        faults.apply(fault("StartJob", 0, 1.0)).unwrap();
        assert!(faults.decide("StartJob", &mut rng).fail);
        assert_eq!(faults.decide("StopJob", &mut rng).delay, Duration::from_millis(5));
        faults
            .apply(sim_admin::RpcFaultRequest {
                clear: true,
                ..fault("StartJob", 0, 0.0)
            })
            .unwrap();
        assert!(!faults.decide("StartJob", &mut rng).fail);
    }

    #[test]
    fn unknown_rpcs_and_rates_outside_zero_to_one_are_refused() {
        let mut faults = RpcFaults::default();
        assert!(matches!(
            faults.apply(fault("StartJobs", 0, 0.5)),
            Err(RequestError::InvalidField { .. })
        ));
        assert!(faults.apply(fault("StartJob", 0, 1.5)).is_err());
        assert!(faults.apply(fault("StartJob", 0, f64::NAN)).is_err());
    }
}
