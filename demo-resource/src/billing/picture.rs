//! The billing rounds as one timeline picture.

use super::Report;
use crate::timeline::Timeline;

impl Report {
    /// The rounds as one timeline picture ([`Timeline::to_svg`] draws it).
    pub fn timeline(&self) -> Timeline {
        Timeline::new("billing")
    }
}
