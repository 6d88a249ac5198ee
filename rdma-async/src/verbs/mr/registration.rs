//! `ibv_reg_mr` and `ibv_dereg_mr`: one registration of memory, counted while it lives, and
//! the error that names the limit when it cannot be made. Both a buffer's own registration and
//! the further registrations of its parts go through here.

use std::io;
use std::ptr::NonNull;

use rdma_async_sys as sys;

use super::access::{Access, RegFlags};
use crate::error;
use crate::verbs::device::{
    DeviceLimits, MEMORY_REGIONS, Memlock, Resource, injected_failure, registration_error,
};
use crate::verbs::pd::ProtectionDomain;

/// Registers `len` bytes at `ptr`; on failure the error names the limit that was hit (the
/// locked-memory limit, the device's memory regions), the size asked and how to raise it.
///
/// # Safety
///
/// `ptr..ptr + len` must be one live allocation that stays allocated until the returned
/// registration is deregistered.
pub(super) unsafe fn register(
    pd: &ProtectionDomain,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
    reg: RegFlags,
) -> io::Result<NonNull<sys::ibv_mr>> {
    // SAFETY: the caller's contract.
    let result = unsafe { try_register(pd, ptr, len, access, reg) };
    registered(pd, len, result)
}

/// `ibv_reg_mr`, with the errno of a failure.
///
/// # Safety
///
/// As [`register`].
pub(super) unsafe fn try_register(
    pd: &ProtectionDomain,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
    reg: RegFlags,
) -> Result<NonNull<sys::ibv_mr>, i32> {
    match injected_failure(Resource::MemoryRegion) {
        Some(errno) => Err(errno),
        // SAFETY: `pd` is live; the caller guarantees the memory outlives the registration.
        None => NonNull::new(unsafe {
            sys::rdma_async_reg_mr(pd.as_ptr(), ptr.as_ptr().cast(), len, access.flags(reg))
        })
        .ok_or_else(last_errno),
    }
}

/// The errno of the call that just failed.
pub(super) fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Counts a registration of `len` bytes, or explains why it failed.
pub(super) fn registered(
    pd: &ProtectionDomain,
    len: usize,
    result: Result<NonNull<sys::ibv_mr>, i32>,
) -> io::Result<NonNull<sys::ibv_mr>> {
    match result {
        Ok(mr) => {
            MEMORY_REGIONS.created(len);
            Ok(mr)
        }
        Err(errno) => {
            let device = DeviceLimits::of(pd.context());
            Err(registration_error(
                len,
                errno,
                Memlock::current(),
                device.as_ref(),
            ))
        }
    }
}

/// Deregisters `mr` (of `len` bytes). On an error the registration stays: the peer may still
/// use its key, so its memory must be neither viewed nor freed.
///
/// # Safety
///
/// `mr` is a live registration, deregistered once it succeeded.
pub(super) unsafe fn deregister(mr: NonNull<sys::ibv_mr>, len: usize) -> io::Result<()> {
    #[cfg(rdma_async_hooks)]
    if let Some(errno) = crate::verbs::device::fault_injection::injected_teardown(
        crate::verbs::device::fault_injection::Teardown::DeregisterMemory,
    ) {
        return Err(error::call_error("ibv_dereg_mr", errno));
    }
    // SAFETY: the caller guarantees the registration is live and deregistered once.
    match unsafe { sys::ibv_dereg_mr(mr.as_ptr()) } {
        0 => {
            MEMORY_REGIONS.destroyed(len);
            Ok(())
        }
        errno => Err(error::call_error("ibv_dereg_mr", errno)),
    }
}
