//! The colours of successive lines, shared by the run report's plot ([`crate::report`]) and the
//! study's figures ([`crate::figures`]).

use plotters::style::RGBColor;

/// The colours of successive lines, in every plot whale draws.
pub(crate) const PALETTE: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];
