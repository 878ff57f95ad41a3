//! The K-quants' interleaved dot products on x86_64 ([`super::interleaved_k`]): a group's
//! sixteen rows against up to four Q8_K activation rows. As for the 32-value types, each
//! 64-byte chunk holds four values of each row and one `vpdpbusd` (or `maddubs` + `madd`) adds
//! four products into the row's lane; a sub-block's exact sum is then multiplied by the row's
//! scale (`vpmulld`, one lane per row). The integers equal [`super::portable`]'s, and the f32
//! steps are its own, so results are bitwise the portable kernel's.
//!
//! The 256-bit kernel is in `half.rs`, the 512-bit one in `whole.rs`, what they share in
//! `shared.rs`.

mod half;
mod shared;
mod whole;

use super::acts::Q8KRow;
use super::blocks::QuantType;
use super::interleaved_x86::entry_points;
use half::halves;
use whole::whole_group;

entry_points!(Q8KRow);
