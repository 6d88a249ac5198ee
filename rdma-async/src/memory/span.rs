//! Checking a range of a region against its length.

use std::io;
use std::ops::{Bound, RangeBounds};

use crate::error;

/// `range` of a `len`-byte buffer as (offset, length).
pub(crate) fn span(len: usize, range: impl RangeBounds<usize>) -> io::Result<(usize, usize)> {
    let start = match range.start_bound() {
        Bound::Included(&s) => s,
        Bound::Excluded(&s) => s.saturating_add(1),
        Bound::Unbounded => 0,
    };
    let end = match range.end_bound() {
        Bound::Included(&e) => e.saturating_add(1),
        Bound::Excluded(&e) => e,
        Bound::Unbounded => len,
    };
    if start > end || end > len {
        return Err(error::invalid_input(format!(
            "range {start}..{end} is outside the {len}-byte region"
        )));
    }
    Ok((start, end - start))
}
