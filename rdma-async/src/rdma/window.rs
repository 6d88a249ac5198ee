//! Memory windows on an [`RdmaConnection`]: remote access to part of a [`LocalRegion`] that one
//! work request grants and another revokes, without a system call and without giving the peer
//! the region's own key (`ibv_alloc_mw` type 2, `IBV_WR_BIND_MW`, `IBV_WR_LOCAL_INV`).
//!
//! The ownership model is that of every operation: binding takes the region by value, the
//! [`BoundWindow`] holds it while the peer may reach it (bytes come out by copying only), and
//! the region comes back only once the peer can no longer reach it: after an invalidation
//! completed, or after the window was deallocated.

use std::io;
use std::ops::RangeBounds;

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
/// window (which revokes it) and then frees the region.
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
            .region
            .registered()
            .read_at(self.offset + offset, dst)
    }
}

/// The window's region, after the window was deallocated (revoking whatever it granted).
fn unbind(binding: WindowBinding) -> LocalRegion {
    let WindowBinding { window, region } = binding;
    drop(window);
    LocalRegion::from_user(Carried(region))
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
    /// The region comes back with the error. `InvalidInput` when the region was not allocated by
    /// [`Self::reg_bindable`] (or its device context's), belongs to another device context, or
    /// the range is empty or outside it; `Unsupported` when the device has no type-2 memory
    /// windows; `BrokenPipe` once the connection is closed.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future after the bind was posted leaves the window and the region in the
    /// connection's table of outstanding work requests until the bind completes; then both are
    /// freed (the window first, so the peer loses access before the memory is freed).
    pub async fn bind_window(
        &self,
        region: LocalRegion,
        range: impl RangeBounds<usize>,
        access: RemoteAccess,
    ) -> Result<BoundWindow, (io::Error, LocalRegion)> {
        let registered = region.user().0.registered();
        let (offset, len) = match span(registered.len(), range) {
            Ok(span) if span.1 > 0 && span.1 <= u32::MAX as usize => span,
            Ok(_) => {
                let err = error::invalid_input(
                    "a window must cover 1 byte to 4 GiB - 1 (its remote descriptor carries a \
                     32-bit length)",
                );
                return Err((err, region));
            }
            Err(e) => return Err((e, region)),
        };
        if !registered.access().mw_bind {
            let err = error::invalid_input(
                "the region was not registered for memory windows: allocate it with \
                 reg_bindable",
            );
            return Err((err, region));
        }
        let window = match MemoryWindow::alloc(self.pd().clone()) {
            Ok(window) => window,
            Err(e) => return Err((e, region)),
        };
        let rkey = window.bound_rkey();
        let binding = Box::new(WindowBinding {
            window,
            region: region.into_user().0,
        });
        let addr = binding.region.registered().addr(offset);
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
            (Err(e), binding) => Err((e, unbind(*binding))),
        }
    }

    /// Revokes the peer's access through `window` (a local invalidation on the send queue) and
    /// returns its region. From the completion on, the peer's accesses through the window's key
    /// fail with a remote access error (which breaks its connection).
    ///
    /// # Errors
    ///
    /// `BrokenPipe` once the connection is closed, or the error of a failed connection. The
    /// region comes back in every case, and only once the peer cannot reach it: on an error the
    /// window is deallocated (which revokes it) before the region is returned.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::bind_window`]: a dropped future leaves the window and the region in the
    /// table until the invalidation completes; then both are freed.
    pub async fn invalidate_window(&self, window: BoundWindow) -> (io::Result<()>, LocalRegion) {
        let (result, binding) = self.run_window(WindowOp::Invalidate, window.binding).await;
        (result, unbind(*binding))
    }
}
