//! The one interface every subsystem answers, and the list of subsystems
//! the core's loop runs.
//!
//! A subsystem keeps its state private and is handed, on each call, the
//! facts and the outbox — never the core. It answers five things: what it
//! notes of a Manager event, what it does with the answer to one of its own
//! calls, its pass of a hydrated step, when it next needs a step without any
//! input, and what a successor core (after a stream break) starts with.
//! Each call it makes to Manager is kept in the outbox as
//! `Pending::Subsystem` with its own call type, and its answer comes back
//! to it alone.
//!
//! Adding a subsystem is a folder holding its state and its `impl
//! Subsystem`, one line in `subsystems!` below, and the variant its calls
//! are kept under in `outbox::SubsystemCall` (the compiler asks for it).

use crate::model::{ManagerEvent, UnixMillis};

use super::facts::Facts;
use super::headroom::state::HeadroomState;
use super::node_services::state::NodeServiceState;
use super::outbox::{Outbox, SubsystemCall};
use super::protocol::RpcFailure;
use super::schedule::state::Schedules;
use super::spares::state::SpareState;

/// Where in a hydrated step a subsystem's pass runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    /// Before the placement round, after migrations stepped: what decides
    /// which jobs are to run (a schedule's end).
    BeforePlacement,
    /// After the placement round: what fills the capacity placement left
    /// (hot spares, node services).
    AfterPlacement,
    /// Last, once drains have been followed: what reads the fleet as the
    /// step leaves it (headroom).
    Last,
}

/// See the module docs.
pub(super) trait Subsystem: Clone + std::fmt::Debug + Default {
    /// What its calls to Manager are for, kept until each is answered.
    type Call: Clone + std::fmt::Debug + PartialEq + Eq;

    /// Where its pass runs in a step.
    const PASS: Pass;

    /// Notes what it learns from a Manager event, before the facts take it
    /// in.
    fn observe(&mut self, _event: &ManagerEvent, _now: UnixMillis) {}

    /// Manager answered one of its calls.
    fn answered(
        &mut self,
        call: Self::Call,
        result: Result<(), RpcFailure>,
        facts: &mut Facts,
        outbox: &mut Outbox,
        now: UnixMillis,
    );

    /// Its pass of a hydrated step.
    fn step(&mut self, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis);

    /// When it next needs a step without any input.
    fn next_deadline(&self, facts: &Facts, now: UnixMillis) -> Option<UnixMillis>;

    /// What a successor core starts with: by default nothing, as what it
    /// knows is rebuilt from Manager's snapshot.
    fn carried(&self) -> Self {
        Self::default()
    }
}

/// Declares the subsystems the loop runs: a field of [`Subsystems`] each,
/// with the variant of [`SubsystemCall`] its calls are kept under. Within a
/// pass they run in the order listed.
macro_rules! subsystems {
    ($($field:ident: $state:ty => $variant:ident,)*) => {
        /// Every subsystem's state (see the module docs).
        #[derive(Clone, Debug, Default)]
        pub(super) struct Subsystems {
            $(pub(super) $field: $state,)*
        }

        impl Subsystems {
            /// Every subsystem notes `event`.
            pub(super) fn observe(&mut self, event: &ManagerEvent, now: UnixMillis) {
                $(Subsystem::observe(&mut self.$field, event, now);)*
            }

            /// The subsystems of `pass` step, in order.
            pub(super) fn step(&mut self, pass: Pass, facts: &mut Facts, outbox: &mut Outbox, now: UnixMillis) {
                $(if <$state as Subsystem>::PASS == pass {
                    Subsystem::step(&mut self.$field, facts, outbox, now);
                })*
            }

            /// The answer to `call` goes to the subsystem that made it.
            pub(super) fn answered(
                &mut self,
                call: SubsystemCall,
                result: Result<(), RpcFailure>,
                facts: &mut Facts,
                outbox: &mut Outbox,
                now: UnixMillis,
            ) {
                match call {
                    $(SubsystemCall::$variant(call) => Subsystem::answered(&mut self.$field, call, result, facts, outbox, now),)*
                }
            }

            /// The earliest deadline of any subsystem.
            pub(super) fn next_deadline(&self, facts: &Facts, now: UnixMillis) -> Option<UnixMillis> {
                [$(Subsystem::next_deadline(&self.$field, facts, now),)*].into_iter().flatten().min()
            }

            /// What a successor core's subsystems start with.
            pub(super) fn carried(&self) -> Self {
                Self {
                    $($field: Subsystem::carried(&self.$field),)*
                }
            }
        }
    };
}

subsystems! {
    schedules: Schedules => Schedule,
    spares: SpareState => Spare,
    node_services: NodeServiceState => NodeService,
    headroom: HeadroomState => Headroom,
}
