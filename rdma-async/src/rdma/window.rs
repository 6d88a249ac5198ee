//! Memory windows on an [`RdmaConnection`]: remote access to part of a [`LocalRegion`] that one
//! work request grants and another revokes, without a system call and without giving the peer
//! the region's own key (`ibv_alloc_mw` type 2, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`).
//!
//! The ownership model is that of every operation: binding takes the region by value, the
//! [`BoundWindow`] holds it while the peer may reach it (bytes come out by copying only), and
//! the region comes back only once the peer can no longer reach it: after an invalidation
//! completed, or after the window was deallocated. When neither is known (the window's
//! deallocation failed after a failed bind or invalidation), the window may still be bound and
//! the region never comes back: it is leaked, left registered and allocated ([`WindowError`]).

use std::io;
use std::ops::RangeBounds;

use super::WindowError;
use super::connection::RdmaConnection;
use crate::error;
use crate::memory::RemoteRegion;
use crate::memory::sealed::{Carried, SealedRegion};
use crate::memory::span;
use crate::memory::{LocalRegion, RemoteAccess};
use crate::verbs::{MemoryWindow, WindowBinding, WindowOp};

/// Part of a [`LocalRegion`] the connection's peer may access through [`Self::remote`], until
/// [`RdmaConnection::invalidate_window`] revokes it.
///
/// The window is bound to the connection that bound it: only that connection's peer can use
/// its key, and only within the bound range, with the bound access. Dropping it deallocates the
/// window (which revokes it) and then frees the region; if the deallocation fails, both are
/// leaked (the window may still be bound) and a warning is logged.
#[derive(Debug)]
pub struct BoundWindow {
    binding: Box<WindowBinding>,
    remote: RemoteRegion,
    /// The bound range's offset in the region.
    offset: usize,
}

impl BoundWindow {
    /// The descriptor to send to the peer: the bound range's address, length and the window's
    /// key.
    pub fn remote(&self) -> RemoteRegion {
        self.remote
    }

    /// Copies `dst.len()` bytes at `offset` of the bound range out (the peer may write them at
    /// any time: coordinate with it, as for a [`super::SharedRegion`]).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is outside the bound range.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        let bound = self.remote.len() as usize;
        if offset.checked_add(dst.len()).is_none_or(|end| end > bound) {
            return Err(error::invalid_input(format!(
                "range {offset}+{} is outside the {bound}-byte window",
                dst.len()
            )));
        }
        self.binding
            .region()
            .registered()
            .read_at(self.offset + offset, dst)
    }
}

/// The region of a window whose bind or invalidation failed with `error`, as the error to
/// return: the window is deallocated (which revokes it) and the region comes back with
/// `error`; if the deallocation fails, the window may still be bound, so the region is leaked
/// and the error says so (keeping `error`'s kind: a closed connection stays `BrokenPipe`).
fn unbind_failed(binding: WindowBinding, error: io::Error) -> WindowError {
    match binding.release(false) {
        Ok(region) => WindowError::new(error, Some(LocalRegion::from_user(Carried(region)))),
        Err((dealloc, _leaked)) => WindowError::new(
            io::Error::new(
                error.kind(),
                format!(
                    "{error}; then deallocating the memory window failed ({dealloc}): the window \
                     could not be revoked and may still be bound, so its region is leaked (left \
                     registered and allocated) rather than returned"
                ),
            ),
            None,
        ),
    }
}

/// The region of a window whose invalidation completed (its key is revoked): the window is
/// deallocated and the region comes back, with the error if the deallocation failed (the window
/// is leaked then).
fn unbind_revoked(binding: WindowBinding) -> Result<LocalRegion, WindowError> {
    let carried = |region| LocalRegion::from_user(Carried(region));
    binding
        .release(true)
        .map(carried)
        .map_err(|(dealloc, region)| {
            let error = io::Error::new(
                dealloc.kind(),
                format!(
                    "the window's key was revoked, so its region comes back, but deallocating the \
                 memory window failed ({dealloc}): the window is leaked"
                ),
            );
            WindowError::new(error, region.map(carried))
        })
}

impl RdmaConnection {
    /// Allocates `len` zeroed bytes that memory windows can expose
    /// ([`Self::bind_window`]); the region itself gives the peer no access.
    ///
    /// # Errors
    ///
    /// As [`crate::device::DeviceContext::reg_msgs`].
    pub fn reg_bindable(&self, len: usize) -> io::Result<LocalRegion> {
        self.context().reg_bindable(len)
    }

    /// Grants the peer `access` to the bytes `range` of `region` through a new memory window:
    /// send it [`BoundWindow::remote`]. Returns once the device has bound the window.
    ///
    /// Devices confine the peer to the window's range, as the InfiniBand specification asks,
    /// with one known exception: Soft-RoCE (rxe, Linux 6.1 and later as of this writing) checks
    /// an access through a window against the bounds of the registration under it, so there the
    /// peer reaches the whole region. Where that matters, bind windows over regions of exactly
    /// the size to grant.
    ///
    /// # Errors
    ///
    /// The region comes back with the error ([`WindowError::into_region`]), but for one case.
    /// `InvalidInput` when the region was not allocated by [`Self::reg_bindable`] (or its
    /// device context's), belongs to another device context, or the range is empty or outside
    /// it; `Unsupported` when the device has no type-2 memory windows; `BrokenPipe` once the
    /// connection is closed. When the bind failed and deallocating the window failed too, the
    /// window may be bound: the region does not come back (it is leaked, left registered and
    /// allocated) and the error says so.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the bind was posted leaves the window and the region in the
    /// connection's table of outstanding work requests until the bind completes; then both are
    /// freed (the window first, so the peer loses access before the memory is freed; if the
    /// window's deallocation fails, both are leaked).
    pub async fn bind_window(
        &self,
        region: LocalRegion,
        range: impl RangeBounds<usize>,
        access: RemoteAccess,
    ) -> Result<BoundWindow, WindowError> {
        let refuse = |e, region| Err(WindowError::new(e, Some(region)));
        let registered = region.user().0.registered();
        let (offset, len) = match span(registered.len(), range) {
            Ok(span) if span.1 > 0 && span.1 <= u32::MAX as usize => span,
            Ok(_) => {
                let err = error::invalid_input(
                    "a window must cover 1 byte to 4 GiB - 1 (its remote descriptor carries a \
                     32-bit length)",
                );
                return refuse(err, region);
            }
            Err(e) => return refuse(e, region),
        };
        if !registered.access().mw_bind {
            let err = error::invalid_input(
                "the region was not registered for memory windows: allocate it with \
                 reg_bindable",
            );
            return refuse(err, region);
        }
        let window = match MemoryWindow::alloc(self.pd().clone()) {
            Ok(window) => window,
            Err(e) => return refuse(e, region),
        };
        let rkey = window.bound_rkey();
        let binding = Box::new(WindowBinding::new(window, region.into_user().0));
        let addr = binding.region().registered().addr(offset);
        let op = WindowOp::Bind {
            offset,
            len,
            access: access.access().remote_flags(),
        };
        match self.run_window(op, binding).await {
            (Ok(()), binding) => Ok(BoundWindow {
                binding,
                remote: RemoteRegion::registered(addr, len as u32, rkey),
                offset,
            }),
            // Not bound, or not known not to be: only a deallocation revokes it.
            (Err(e), binding) => Err(unbind_failed(*binding, e)),
        }
    }

    /// Revokes the peer's access through `window` (a local invalidation on the send queue) and
    /// returns its region. From the completion on, the peer's accesses through the window's key
    /// fail with a remote access error (which breaks its connection).
    ///
    /// # Errors
    ///
    /// `BrokenPipe` once the connection is closed, or the error of a failed connection. The
    /// region comes back only once the peer cannot reach it: on an error the window is
    /// deallocated (which revokes it) before the region comes back with the error
    /// ([`WindowError::into_region`]). If that deallocation fails too, the window may still be
    /// bound: the region does not come back (it is leaked, left registered and allocated) and
    /// the error says the window could not be revoked. If the invalidation completed but the
    /// window's deallocation failed, the key is revoked and the region comes back with that
    /// error (the window is leaked).
    ///
    /// # Cancel safety
    ///
    /// As [`Self::bind_window`]: a dropped future leaves the window and the region in the
    /// table until the invalidation completes; then both are freed (or, if the window's
    /// deallocation fails, leaked).
    pub async fn invalidate_window(&self, window: BoundWindow) -> Result<LocalRegion, WindowError> {
        match self.run_window(WindowOp::Invalidate, window.binding).await {
            (Ok(()), binding) => unbind_revoked(*binding),
            (Err(e), binding) => Err(unbind_failed(*binding, e)),
        }
    }
}
