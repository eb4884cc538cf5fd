//! What a burst of placements keeps from one placement to the next.
//!
//! A node lost with 200 jobs on it means 200 placements in one round. Each
//! is a search of the candidate index (`placement::search`), whose cost
//! does not grow with the fleet and which the view keeps up to date with
//! every reservation, so nothing about the fleet has to be kept between
//! them. [`Rankings`] keeps the search's scratch space, so a burst sets it
//! up once rather than once per placement.

use super::fleet::NodeIdx;
use super::search::Scratch;

/// What a burst of placements on one view keeps between them (see the
/// module docs). Give it to [`super::place_ranked`] for each placement of
/// the burst; the decisions are exactly [`super::place`]'s.
#[derive(Debug, Default)]
pub struct Rankings {
    pub(super) scratch: Scratch,
}

impl Rankings {
    /// Starts a burst of placements, each applied to the view before the
    /// next.
    pub fn for_burst() -> Self {
        Rankings {
            scratch: Scratch::keeping(1),
        }
    }

    /// A burst that also keeps, after each placement the indexed search
    /// decided, the `keep` best survivors of the deciding tier
    /// ([`Rankings::podium`]).
    pub(crate) fn keeping(keep: usize) -> Self {
        Rankings {
            scratch: Scratch::keeping(keep),
        }
    }

    /// The last placement's best survivors of its deciding tier, best
    /// first, and whether they are every survivor there was; empty when
    /// the indexed search did not decide it (a pinned or co-located job,
    /// a provision, nothing placed).
    pub(crate) fn podium(&self) -> (impl Iterator<Item = NodeIdx> + '_, bool) {
        let complete = self.scratch.podium.len() < self.scratch.keep;
        (self.scratch.podium.iter().map(|b| b.idx), complete)
    }

    /// How full the last placement's winner may be and still win (see
    /// [`Podium::winner_fill_limit`](super::replay::Podium)).
    pub(crate) fn winner_fill_limit(&self) -> Option<f64> {
        let complete = self.scratch.podium.len() < self.scratch.keep;
        super::search::winner_fill_limit(&self.scratch.podium, complete)
    }
}
