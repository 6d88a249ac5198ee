//! `ibv_mw`: type-2 memory windows, remote access to part of a registration that work requests
//! grant (`IBV_WR_BIND_MW`) and revoke (`IBV_WR_LOCAL_INV`) without a system call.
//!
//! A window is bound to one queue pair: only that connection's peer can use its key. The memory
//! it exposes must be registered with `IBV_ACCESS_MW_BIND` (and local write, for a window the
//! peer may write); the registration itself needs no remote access, so the peer reaches nothing
//! the window does not cover.

use std::io;
use std::mem::ManuallyDrop;
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
// (its key) and freed once, in `dealloc` or `Drop`.
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

    /// Deallocates the window (`ibv_dealloc_mw`), which revokes it if it is bound.
    ///
    /// # Errors
    ///
    /// The error of `ibv_dealloc_mw`. The window is then leaked (never freed nor reused), and
    /// may still be bound: the caller must not free or reuse memory it may be bound over
    /// unless its key is known to be revoked.
    pub(crate) fn dealloc(self) -> io::Result<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again, so the domain's reference is moved out
        // of it exactly once.
        let pd = unsafe { std::ptr::read(&this.pd) };
        dealloc_raw(this.raw, pd)
    }
}

/// Fills `wr` as the local invalidation of window key `rkey`.
pub(crate) fn fill_invalidate_key(wr: &mut sys::ibv_send_wr, rkey: u32) {
    wr.opcode = sys::ibv_wr_opcode::IBV_WR_LOCAL_INV;
    wr.__bindgen_anon_1.invalidate_rkey = rkey;
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        // Owners that can act on a failure call `dealloc`; here it can only be logged (the
        // window is leaked, and its domain with it, by `dealloc_raw`).
        if let Err(e) = dealloc_raw(self.raw, Arc::clone(&self.pd)) {
            tracing::warn!("{e}: the memory window is leaked");
        }
    }
}

/// Deallocates the window `raw` of `pd` (`ibv_dealloc_mw`), which revokes it if it is bound.
///
/// On failure the window is leaked, never freed again nor reused: the provider still holds
/// it, perhaps bound, and a second `ibv_dealloc_mw` of an object it may have half torn down is
/// not safe. Its protection domain is leaked with it (`pd`'s reference is forgotten), since a
/// domain cannot be deallocated under a window.
fn dealloc_raw(raw: NonNull<sys::ibv_mw>, pd: Arc<ProtectionDomain>) -> io::Result<()> {
    #[cfg(rdma_async_hooks)]
    if let Some(errno) = crate::verbs::device::fault_injection::injected_teardown(
        crate::verbs::device::fault_injection::Teardown::DeallocWindow,
    ) {
        std::mem::forget(pd);
        return Err(error::call_error("ibv_dealloc_mw", errno));
    }
    // SAFETY: the window is live and freed once (its owner is consumed or being dropped, and
    // on failure it is never freed again); its domain outlives it (`pd`).
    match unsafe { sys::rdma_async_dealloc_mw(raw.as_ptr()) } {
        0 => Ok(()),
        errno => {
            std::mem::forget(pd);
            Err(error::call_error("ibv_dealloc_mw", errno))
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

/// A window and the region it is (or is being) bound over.
///
/// The region comes out only through [`Self::release`], once the window was deallocated or its
/// key is known to be revoked: a window whose deallocation failed may still be bound, and then
/// its region is leaked (left registered and allocated) rather than freed or reused under a key
/// the peer may still hold. Dropping the binding releases it the same way, without a revoked
/// key.
#[derive(Debug)]
pub(crate) struct WindowBinding {
    // Both taken once, by `release` or `Drop` (which `release` skips).
    window: ManuallyDrop<MemoryWindow>,
    region: ManuallyDrop<UserBuffer>,
}

/// A window deallocation that failed, and the region when it may come back (the window's key
/// was revoked) or `None` when it was leaked.
pub(crate) type Unreleased = (io::Error, Option<UserBuffer>);

impl WindowBinding {
    /// Binds nothing yet: `window` and the `region` it is to be bound over.
    pub(crate) fn new(window: MemoryWindow, region: UserBuffer) -> Self {
        WindowBinding {
            window: ManuallyDrop::new(window),
            region: ManuallyDrop::new(region),
        }
    }

    /// The window.
    pub(crate) fn window(&self) -> &MemoryWindow {
        &self.window
    }

    /// The region the window is (or is being) bound over.
    pub(crate) fn region(&self) -> &UserBuffer {
        &self.region
    }

    /// Deallocates the window, then gives the region back. `key_revoked` says whether the
    /// window's key is known to be revoked (a local invalidation of it completed successfully).
    ///
    /// # Errors
    ///
    /// The deallocation's error. The window is leaked; the region comes with the error when
    /// the key was revoked, and is otherwise leaked too, since the window may still be bound
    /// over it.
    pub(crate) fn release(self, key_revoked: bool) -> Result<UserBuffer, Unreleased> {
        let mut this = ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again.
        let (window, region) = unsafe { this.take_parts() };
        release(window, region, key_revoked)
    }

    /// Moves the window and the region out.
    ///
    /// # Safety
    ///
    /// Called at most once, and the binding is not used afterwards (nor dropped, unless from
    /// `Drop` itself).
    unsafe fn take_parts(&mut self) -> (MemoryWindow, UserBuffer) {
        // SAFETY: the caller guarantees the fields are taken once and not used again.
        let window = unsafe { ManuallyDrop::take(&mut self.window) };
        // SAFETY: as above.
        let region = unsafe { ManuallyDrop::take(&mut self.region) };
        (window, region)
    }
}

/// [`WindowBinding::release`] of a window and its region.
fn release(
    window: MemoryWindow,
    region: UserBuffer,
    key_revoked: bool,
) -> Result<UserBuffer, Unreleased> {
    match window.dealloc() {
        // The window is gone, and with it any access it granted.
        Ok(()) => Ok(region),
        Err(e) if key_revoked => Err((e, Some(region))),
        Err(e) => {
            // The window may still be bound over the region: deregistering or freeing it, or
            // handing it back to be reused, would let the peer reach memory that is no longer
            // the window's. Leaking it is the only safe end.
            std::mem::forget(region);
            Err((e, None))
        }
    }
}

impl Drop for WindowBinding {
    fn drop(&mut self) {
        // SAFETY: `drop` runs once, and `release` (which takes the fields otherwise) skips it.
        let (window, region) = unsafe { self.take_parts() };
        if let Err((e, _)) = release(window, region, false) {
            tracing::warn!(
                "{e}: the memory window may still be bound, so it and its region are leaked"
            );
        }
    }
}
