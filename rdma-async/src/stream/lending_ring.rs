//! The receive ring of a stream that lends its bytes (`RStreamOptions::zero_copy_reads`): how
//! it is registered, and the memory windows its halves are granted through after the first
//! time (see `proto::ring_access`).

use std::io;
use std::sync::Arc;

use crate::proto::RingKeys;
use crate::verbs::{Access, MemoryWindow, ProtectionDomain, RegFlags, RegisteredBuffer};

/// A lending ring's registrations of its halves (in the ring's `ranges()`, by index): each
/// half's first registration (remote write), then each half's registration for its window.
pub(super) const INITIAL_RANGE: [usize; 2] = [0, 1];
pub(super) const WINDOW_RANGE: [usize; 2] = [2, 3];
/// Send-queue entries a lending ring needs besides rsockets' own: a bind rides with each of up
/// to 4 outstanding SGL updates, and each half has at most one invalidation outstanding.
pub(super) const WINDOW_WRS: u32 = 6;

/// A receive ring that can lend its bytes: allocated and registered without local write or
/// remote access; each half registered again for remote write (the first grants) and for
/// window binds (later grants), and one memory window per half.
pub(super) fn lending_ring(
    pd: &Arc<ProtectionDomain>,
    len: usize,
) -> io::Result<(RegisteredBuffer, Vec<MemoryWindow>, Option<RingKeys>)> {
    let nothing = RegFlags {
        local_write: false,
        on_demand: false,
    };
    let rbuf = RegisteredBuffer::allocated(pd.clone(), len, Access::default(), nothing)?;
    let half = len / 2;
    let remote_write = Access {
        remote_write: true,
        ..Access::default()
    };
    let bindable = Access {
        mw_bind: true,
        ..Access::default()
    };
    for (access, offset) in [
        (remote_write, 0),
        (remote_write, half),
        (bindable, 0),
        (bindable, half),
    ] {
        rbuf.register_range(offset, half, access)?;
    }
    let windows = vec![
        MemoryWindow::alloc(pd.clone())?,
        MemoryWindow::alloc(pd.clone())?,
    ];
    let key = |range| {
        rbuf.ranges()
            .rkey(range)
            .ok_or_else(|| io::Error::other("a ring registration vanished"))
    };
    let keys = RingKeys {
        initial: [key(INITIAL_RANGE[0])?, key(INITIAL_RANGE[1])?],
        window: [windows[0].rkey(), windows[1].rkey()],
    };
    Ok((rbuf, windows, Some(keys)))
}
