//! What lets a peer write parts of a queue pair's own buffers through memory windows, and the
//! views of those buffers open meanwhile: a view exists only while nothing a peer holds can
//! reach its bytes, and nothing is bound over a view's bytes while it exists.
//!
//! A window counts as bound from the moment its bind is posted until the successful completion
//! of its local invalidation was seen here: a flushed or failed invalidation leaves it bound
//! for good, so its bytes are never lent to a reader (the caller copies them instead).

use std::io;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdma_async_sys as sys;

use crate::error;
use crate::verbs::cq::WorkCompletion;

/// A part of one of the queue pair's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BufferRange {
    pub(crate) buffer: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

impl BufferRange {
    fn overlaps(&self, other: &BufferRange) -> bool {
        self.buffer == other.buffer
            && self.offset < other.offset + other.len
            && other.offset < self.offset + self.len
    }
}

/// Where a window's binding stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WindowState {
    Unbound,
    Bound(BufferRange),
    /// Its invalidation was posted with this work-request id.
    Invalidating {
        wr_id: u64,
        target: BufferRange,
    },
}

#[derive(Debug, Default)]
struct Grants {
    windows: Vec<WindowState>,
    /// Open views, by id.
    views: Vec<(u64, BufferRange)>,
    next_view: u64,
}

/// The windows' bindings and the open views, for one queue pair.
#[derive(Debug, Default)]
pub(crate) struct RemoteGrants {
    grants: Mutex<Grants>,
}

impl RemoteGrants {
    pub(crate) fn new(windows: usize) -> Self {
        RemoteGrants {
            grants: Mutex::new(Grants {
                windows: vec![WindowState::Unbound; windows],
                ..Grants::default()
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Grants> {
        self.grants.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records that window `window` is about to be bound over `target`, or refuses: the
    /// window is still bound, or a view of those bytes is open. `post` posts the bind; if
    /// it fails, the window stays unbound.
    pub(crate) fn bind(
        &self,
        window: usize,
        target: BufferRange,
        post: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut grants = self.lock();
        match grants.windows.get(window) {
            Some(WindowState::Unbound) => {}
            Some(_) => {
                return Err(error::invalid_input(format!(
                    "memory window {window} is still bound: invalidate it first"
                )));
            }
            None => return Err(error::invalid_input(format!("no memory window {window}"))),
        }
        if grants.views.iter().any(|(_, view)| view.overlaps(&target)) {
            return Err(error::invalid_input(
                "a window over bytes open as a view: the peer could write them",
            ));
        }
        post()?;
        grants.windows[window] = WindowState::Bound(target);
        Ok(())
    }

    /// Records that window `window`'s invalidation is posted (by `post`) with `wr_id`.
    pub(crate) fn invalidate(
        &self,
        window: usize,
        wr_id: u64,
        post: impl FnOnce() -> io::Result<()>,
    ) -> io::Result<()> {
        let mut grants = self.lock();
        let Some(&WindowState::Bound(target)) = grants.windows.get(window) else {
            return Err(error::invalid_input(format!(
                "memory window {window} is not bound"
            )));
        };
        post()?;
        grants.windows[window] = WindowState::Invalidating { wr_id, target };
        Ok(())
    }

    /// Takes a send completion: a successful local invalidation posted by [`Self::invalidate`]
    /// unbinds its window. Whether it was one.
    pub(crate) fn completed(&self, wc: &WorkCompletion) -> bool {
        if !wc.status.is_success() || wc.opcode != sys::ibv_wc_opcode::IBV_WC_LOCAL_INV {
            return false;
        }
        let mut grants = self.lock();
        let found = grants
            .windows
            .iter_mut()
            .find(|w| matches!(w, WindowState::Invalidating { wr_id, .. } if *wr_id == wc.wr_id));
        match found {
            Some(window) => {
                *window = WindowState::Unbound;
                true
            }
            None => false,
        }
    }

    /// Opens a view of `range` when no window is bound (or being invalidated) over it and
    /// `reachable` (the buffer's own check of its registrations) says nothing else gives a peer
    /// or the device write access; returns the view's id.
    pub(crate) fn open_view(&self, range: BufferRange, reachable: bool) -> io::Result<u64> {
        let mut grants = self.lock();
        let windowed = grants.windows.iter().any(|w| match w {
            WindowState::Unbound => false,
            WindowState::Bound(target) | WindowState::Invalidating { target, .. } => {
                target.overlaps(&range)
            }
        });
        if windowed || reachable {
            return Err(io::Error::other(format!(
                "bytes {}+{} of buffer {} may still be written by the peer: not lent",
                range.offset, range.len, range.buffer
            )));
        }
        let id = grants.next_view;
        grants.next_view += 1;
        grants.views.push((id, range));
        Ok(id)
    }

    /// The view `id` was dropped.
    pub(crate) fn close_view(&self, id: u64) {
        let mut grants = self.lock();
        grants.views.retain(|(view, _)| *view != id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::cq::WcStatus;

    const HALF_0: BufferRange = BufferRange {
        buffer: 1,
        offset: 0,
        len: 4096,
    };
    const HALF_1: BufferRange = BufferRange {
        buffer: 1,
        offset: 4096,
        len: 4096,
    };

    fn inv_done(wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            opcode: sys::ibv_wc_opcode::IBV_WC_LOCAL_INV,
            ..WorkCompletion::EMPTY
        }
    }

    #[test]
    fn views_only_of_bytes_no_window_reaches_and_no_bind_over_a_view() {
        let g = RemoteGrants::new(2);
        g.bind(0, HALF_0, || Ok(())).unwrap();
        assert!(g.open_view(HALF_0, false).is_err(), "bound");
        let view = g.open_view(HALF_1, false).unwrap();
        assert!(
            g.open_view(HALF_1, true).is_err(),
            "a registration reaches it"
        );
        assert!(g.bind(1, HALF_1, || Ok(())).is_err(), "viewed");
        g.close_view(view);
        g.bind(1, HALF_1, || Ok(())).unwrap();
        assert!(g.bind(1, HALF_1, || Ok(())).is_err(), "bound twice");
    }

    #[test]
    fn only_a_successful_invalidation_with_its_id_unbinds() {
        let g = RemoteGrants::new(1);
        g.bind(0, HALF_0, || Ok(())).unwrap();
        g.invalidate(0, 7, || Ok(())).unwrap();
        assert!(
            g.open_view(HALF_0, false).is_err(),
            "invalidation not complete"
        );
        assert!(!g.completed(&inv_done(7, WcStatus::FLUSH)));
        assert!(!g.completed(&inv_done(8, WcStatus::SUCCESS)));
        let mut send = inv_done(7, WcStatus::SUCCESS);
        send.opcode = sys::ibv_wc_opcode::IBV_WC_RDMA_WRITE;
        assert!(!g.completed(&send));
        assert!(g.completed(&inv_done(7, WcStatus::SUCCESS)));
        g.open_view(HALF_0, false).unwrap();
    }

    #[test]
    fn a_failed_post_changes_nothing() {
        let g = RemoteGrants::new(1);
        assert!(g.bind(0, HALF_0, || Err(io::Error::other("post"))).is_err());
        g.open_view(HALF_0, false).unwrap();
        assert!(g.invalidate(0, 1, || Ok(())).is_err(), "never bound");
    }
}
