//! Registered memory owned by the crate.

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::protection_domain::ProtectionDomain;
use crate::error;

/// A page-aligned heap buffer registered with a protection domain.
///
/// The device may write this memory at any time while a receive (or, with remote-write access,
/// a peer's RDMA write) is outstanding, so no Rust reference to it is ever created: data moves in
/// and out with raw copies at checked offsets. The registration is dropped before the memory is
/// freed, and the queue pairs that use it must be destroyed before it is dropped (owners hold it
/// in fields declared after their queue pair).
#[derive(Debug)]
pub(crate) struct RegisteredBuffer {
    ptr: NonNull<u8>,
    layout: Layout,
    mr: NonNull<sys::ibv_mr>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the buffer is plain memory plus a thread-safe verbs registration; all access goes
// through raw copies that callers synchronise (they take `&mut self` or hold a lock).
unsafe impl Send for RegisteredBuffer {}
// SAFETY: `&self` methods only read immutable fields or copy through raw pointers.
unsafe impl Sync for RegisteredBuffer {}

/// Access rights of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    pub(crate) remote_read: bool,
    pub(crate) remote_write: bool,
}

impl RegisteredBuffer {
    /// Allocates `len` zeroed bytes and registers them for local write (and `access`).
    pub(crate) fn new(pd: Arc<ProtectionDomain>, len: usize, access: Access) -> io::Result<Self> {
        let page = 4096;
        let layout = Layout::from_size_align(len.max(1), page)
            .map_err(|_| error::invalid_input("registered buffer size overflows"))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = NonNull::new(unsafe { alloc::alloc_zeroed(layout) }).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                "cannot allocate registered buffer",
            )
        })?;
        let mut flags = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if access.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        if access.remote_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        // SAFETY: `pd` is live; the memory is a live allocation of `layout.size()` bytes that
        // stays allocated until after the registration is dropped.
        let mr = unsafe {
            sys::rdma_async_reg_mr(
                pd.as_ptr(),
                ptr.as_ptr().cast(),
                layout.size(),
                flags as i32,
            )
        };
        let Some(mr) = NonNull::new(mr) else {
            let err = error::last_error("ibv_reg_mr");
            // SAFETY: allocated above with this layout and not registered.
            unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
            return Err(err);
        };
        Ok(RegisteredBuffer {
            ptr,
            layout,
            mr,
            _pd: pd,
        })
    }

    pub(crate) fn len(&self) -> usize {
        self.layout.size()
    }

    /// The address of byte `offset`, for a scatter/gather entry.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.ptr.as_ptr() as u64 + offset as u64
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the registration is live for `self`'s lifetime.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The key a peer uses to write or read this memory remotely.
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: the registration is live for `self`'s lifetime.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len() => Ok(()),
            _ => Err(error::invalid_input(format!(
                "range {offset}+{len} is outside the {}-byte registered buffer",
                self.len()
            ))),
        }
    }

    /// Copies `src` into the buffer at `offset`.
    ///
    /// Callers must not have a receive or remote write outstanding on this range (the device
    /// would race the copy); the range check makes any offset safe for memory.
    pub(crate) fn write_at(&self, offset: usize, src: &[u8]) -> io::Result<()> {
        let dst = self.range_ptr(offset, src.len())?;
        // SAFETY: `dst` starts a checked range of the live allocation, and `src` is ordinary Rust
        // memory that cannot overlap it (no reference into the buffer exists).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` out of the buffer.
    pub(crate) fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        let src = self.range_ptr(offset, dst.len())?;
        // SAFETY: as in `write_at`, in the other direction.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// A scatter/gather entry for `len` bytes at `offset`, after checking the range.
    pub(crate) fn sge(&self, offset: usize, len: usize) -> io::Result<sys::ibv_sge> {
        self.check(offset, len)?;
        let length =
            u32::try_from(len).map_err(|_| error::invalid_input("work request too long"))?;
        Ok(sys::ibv_sge {
            addr: self.addr(offset),
            length,
            lkey: self.lkey(),
        })
    }

    /// A pointer to byte `offset`, after checking that `len` bytes from there are in the buffer.
    fn range_ptr(&self, offset: usize, len: usize) -> io::Result<*mut u8> {
        self.check(offset, len)?;
        // SAFETY: the check keeps `offset` within the allocation (at most one past its end).
        Ok(unsafe { self.ptr.as_ptr().add(offset) })
    }
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        // SAFETY: the registration is live and dropped once, before the memory it covers.
        unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        // SAFETY: allocated in `new` with `self.layout`; no reference into it exists.
        unsafe { alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}
