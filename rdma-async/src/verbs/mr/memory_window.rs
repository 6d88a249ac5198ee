//! `ibv_mw`: type-2 memory windows, remote access to part of a registration that work requests
//! grant (`IBV_WR_BIND_MW`) and revoke (`IBV_WR_LOCAL_INV`) without a system call.
//!
//! A window is bound to one queue pair: only that connection's peer can use its key. The memory
//! it exposes must be registered with `IBV_ACCESS_MW_BIND` (and local write, for a window the
//! peer may write); the registration itself needs no remote access, so the peer reaches nothing
//! the window does not cover.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::user_buffer::UserBuffer;
use crate::error;
use crate::verbs::pd::ProtectionDomain;

/// An owned type-2 memory window of a protection domain.
#[derive(Debug)]
pub(crate) struct MemoryWindow {
    raw: NonNull<sys::ibv_mw>,
    /// The key the window answers to once bound (the allocated key, with its low byte, the
    /// part a bind chooses, moved on).
    bound_rkey: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs objects may be used from any thread; the window's C struct is only read
// (its key) and freed once, in `Drop`.
unsafe impl Send for MemoryWindow {}
// SAFETY: as above; `&self` methods only read plain fields.
unsafe impl Sync for MemoryWindow {}

impl MemoryWindow {
    /// Allocates a type-2 window on `pd`.
    ///
    /// # Errors
    ///
    /// `Unsupported` when the device has no memory windows; the OS error of `ibv_alloc_mw`
    /// otherwise.
    pub(crate) fn alloc(pd: Arc<ProtectionDomain>) -> io::Result<Self> {
        let type2 = sys::ibv_mw_type::IBV_MW_TYPE_2 as i32;
        // SAFETY: `pd` is a live protection domain, kept alive by the window's `Arc`.
        let raw = unsafe { sys::rdma_async_alloc_mw(pd.as_ptr(), type2) };
        let Some(raw) = NonNull::new(raw) else {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EOPNOTSUPP) {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "device {} has no type-2 memory windows (ibv_alloc_mw: {err})",
                        pd.device_name()
                    ),
                ));
            }
            return Err(error::last_error("ibv_alloc_mw"));
        };
        // SAFETY: `raw` was just allocated and is live.
        let allocated = unsafe { (*raw.as_ptr()).rkey };
        Ok(MemoryWindow {
            raw,
            // `ibv_inc_rkey`: a bind must give the window a key other than the allocated one,
            // so a key granted before cannot reach what it binds now.
            bound_rkey: (allocated & 0xffff_ff00) | (allocated.wrapping_add(1) & 0xff),
            pd,
        })
    }

    /// The protection domain the window belongs to.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The key the peer uses once a bind posted by [`Self::fill_bind`] has completed.
    pub(crate) fn bound_rkey(&self) -> u32 {
        self.bound_rkey
    }

    /// Fills `wr` as a bind of this window over `len` bytes at `offset` of `region`, with
    /// `access` (`ibv_access_flags`). The caller posts it and keeps both the window and the
    /// region alive until the bind's completion was polled or the queue pair was destroyed.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is outside the region.
    pub(crate) fn fill_bind(
        &self,
        wr: &mut sys::ibv_send_wr,
        region: &UserBuffer,
        offset: usize,
        len: usize,
        access: u32,
    ) -> io::Result<()> {
        let registered = region.registered();
        if offset
            .checked_add(len)
            .is_none_or(|end| end > registered.len())
            || len == 0
        {
            return Err(error::invalid_input(format!(
                "window range {offset}..{} is empty or outside the {}-byte region",
                offset.saturating_add(len),
                registered.len()
            )));
        }
        let target = (registered.mr_ptr(), registered.addr(offset), len);
        self.fill_bind_with(wr, target, access, self.bound_rkey);
        Ok(())
    }

    /// Fills `wr` as a bind of this window under the key `rkey` over `target`: a registration
    /// of this window's protection domain, and the address and length within it to expose.
    /// The caller keeps both alive until the bind's completion was polled or the queue pair
    /// was destroyed, and calls [`Self::set_rkey`] once it is posted.
    pub(crate) fn fill_bind_with(
        &self,
        wr: &mut sys::ibv_send_wr,
        target: (*mut sys::ibv_mr, u64, usize),
        access: u32,
        rkey: u32,
    ) {
        let (mr, addr, len) = target;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_BIND_MW;
        wr.__bindgen_anon_2.bind_mw = sys::ibv_send_wr__bindgen_ty_4__bindgen_ty_1 {
            mw: self.raw.as_ptr(),
            rkey,
            bind_info: sys::ibv_mw_bind_info {
                mr,
                addr,
                length: len as u64,
                mw_access_flags: access,
            },
        };
    }

    /// The window's key as its C object holds it: the allocated one until [`Self::set_rkey`].
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the window is live for `self`'s lifetime.
        unsafe { (*self.raw.as_ptr()).rkey }
    }

    /// Records the key a bind just posted gives the window: providers read the window's
    /// current key from its C object when the next bind is posted (some update it themselves;
    /// setting the same value again is harmless).
    pub(crate) fn set_rkey(&self, rkey: u32) {
        // SAFETY: the window is live; binds of one window are posted one at a time by its
        // owner (the stream's lock), and the provider reads the field only while posting.
        unsafe { (*self.raw.as_ptr()).rkey = rkey };
    }

    /// Fills `wr` as the local invalidation of the window's bound key: once it completes, the
    /// peer's accesses through that key fail.
    pub(crate) fn fill_invalidate(&self, wr: &mut sys::ibv_send_wr) {
        fill_invalidate_key(wr, self.bound_rkey);
    }
}

/// Fills `wr` as the local invalidation of window key `rkey`.
pub(crate) fn fill_invalidate_key(wr: &mut sys::ibv_send_wr, rkey: u32) {
    wr.opcode = sys::ibv_wr_opcode::IBV_WR_LOCAL_INV;
    wr.__bindgen_anon_1.invalidate_rkey = rkey;
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // SAFETY: the window is live and freed once; its domain outlives it (the `Arc`).
        // Deallocating a bound window revokes it.
        let ret = unsafe { sys::rdma_async_dealloc_mw(self.raw.as_ptr()) };
        if ret != 0 {
            tracing::warn!(errno = ret, "ibv_dealloc_mw failed");
        }
    }
}

/// What a window work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WindowOp {
    /// Bind the window over `len` bytes at `offset` of the region, with `access`
    /// (`ibv_access_flags`: remote read, write, atomic).
    Bind {
        offset: usize,
        len: usize,
        access: u32,
    },
    /// Revoke the window's bound key.
    Invalidate,
}

/// A window and the region it is (or is being) bound over. The window is declared first so it
/// is deallocated, revoking the peer's access, before the region is deregistered and freed
/// (providers refuse to deregister memory a window is still bound to).
#[derive(Debug)]
pub(crate) struct WindowBinding {
    pub(crate) window: MemoryWindow,
    pub(crate) region: UserBuffer,
}
