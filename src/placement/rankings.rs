//! What a burst of placements keeps from one placement to the next.
//!
//! A node lost with 200 jobs on it means 200 placements in one round. Each
//! is a search of the candidate index (`placement::search`), whose cost
//! does not grow with the fleet and which the view keeps up to date with
//! every reservation, so nothing about the fleet has to be kept between
//! them. [`Rankings`] keeps the search's scratch space, so a burst sets it
//! up once rather than once per placement.

use super::fleet::FleetView;
use super::search::Scratch;

/// What a burst of placements on one view keeps between them (see the
/// module docs). Give it to [`super::place_ranked`] for each placement of
/// the burst; the decisions are exactly [`super::place`]'s.
#[derive(Debug, Default)]
pub struct Rankings {
    pub(super) scratch: Scratch,
}

impl Rankings {
    /// Starts a burst of placements applied to `view` in turn, with room
    /// for its largest tier's classes.
    pub fn for_burst(view: &mut FleetView) -> Self {
        Rankings {
            scratch: Scratch::for_view(view),
        }
    }
}
