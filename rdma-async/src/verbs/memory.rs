//! Registered memory owned by the crate: page-aligned allocations, or a caller's `Vec<u8>` whose
//! ownership moves in for as long as it is registered.

use std::alloc::{self, Layout};
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::protection_domain::ProtectionDomain;
use super::resource_limits::{
    DeviceLimits, MEMORY_REGIONS, Memlock, Resource, injected_failure, registration_error,
};
use crate::error;

/// A heap buffer registered with a protection domain (page-aligned when the crate allocates it).
///
/// The device may write this memory at any time while a receive (or, with remote-write access,
/// a peer's RDMA write) is outstanding, so no Rust reference to it is ever created: data moves in
/// and out with raw copies at checked offsets. The registration is dropped before the memory is
/// freed, and the queue pairs that use it must be destroyed before it is dropped (owners hold it
/// in fields declared after their queue pair).
#[derive(Debug)]
pub(crate) struct RegisteredBuffer {
    ptr: NonNull<u8>,
    len: usize,
    backing: Backing,
    access: Access,
    mr: NonNull<sys::ibv_mr>,
    pd: Arc<ProtectionDomain>,
}

/// Who frees the memory, and how.
#[derive(Debug)]
enum Backing {
    /// `alloc_zeroed` with this layout.
    Allocated(Layout),
    /// The parts of a `Vec<u8>` (length `len`, this capacity), taken apart so that no `Vec` (and
    /// so no unique reference) exists while the device owns the bytes.
    Vec { capacity: usize },
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
    /// `IBV_ACCESS_REMOTE_ATOMIC`: the peer may compare-and-swap and fetch-and-add 8-byte words.
    pub(crate) remote_atomic: bool,
}

impl Access {
    /// Whether a peer can reach the memory at all.
    pub(crate) fn is_remote(self) -> bool {
        self.remote_read || self.remote_write || self.remote_atomic
    }

    fn flags(self) -> i32 {
        let mut flags = sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        if self.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        if self.remote_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        if self.remote_atomic {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        flags as i32
    }
}

/// Registers `len` bytes at `ptr`; on failure the error names the limit that was hit (the
/// locked-memory limit, the device's memory regions), the size asked and how to raise it.
///
/// # Safety
///
/// `ptr..ptr + len` must be one live allocation that stays allocated until the returned
/// registration is deregistered.
unsafe fn register(
    pd: &ProtectionDomain,
    ptr: NonNull<u8>,
    len: usize,
    access: Access,
) -> io::Result<NonNull<sys::ibv_mr>> {
    let result = match injected_failure(Resource::MemoryRegion) {
        Some(errno) => Err(errno),
        // SAFETY: `pd` is live; the caller guarantees the memory outlives the registration.
        None => NonNull::new(unsafe {
            sys::rdma_async_reg_mr(pd.as_ptr(), ptr.as_ptr().cast(), len, access.flags())
        })
        .ok_or_else(|| {
            io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO)
        }),
    };
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

/// Deregisters `mr` (of `len` bytes); whether it worked.
///
/// # Safety
///
/// `mr` is a live registration, deregistered once.
unsafe fn deregister(mr: NonNull<sys::ibv_mr>, len: usize) -> bool {
    // SAFETY: the caller guarantees the registration is live and deregistered once.
    let ok = unsafe { sys::ibv_dereg_mr(mr.as_ptr()) } == 0;
    if ok {
        MEMORY_REGIONS.destroyed(len);
    }
    ok
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
        // SAFETY: the memory is a live allocation of `layout.size()` bytes that stays allocated
        // until after the registration is dropped.
        let mr = match unsafe { register(&pd, ptr, layout.size(), access) } {
            Ok(mr) => mr,
            Err(err) => {
                // SAFETY: allocated above with this layout and not registered.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(err);
            }
        };
        Ok(RegisteredBuffer {
            ptr,
            len: layout.size(),
            backing: Backing::Allocated(layout),
            access,
            mr,
            pd,
        })
    }

    /// Registers the bytes of `vec` (its length, not its spare capacity), taking ownership of it
    /// until [`Self::into_vec`].
    pub(crate) fn from_vec(
        pd: Arc<ProtectionDomain>,
        vec: Vec<u8>,
        access: Access,
    ) -> io::Result<Self> {
        if vec.is_empty() {
            return Err(error::invalid_input("cannot register an empty buffer"));
        }
        let mut vec = std::mem::ManuallyDrop::new(vec);
        let (len, capacity) = (vec.len(), vec.capacity());
        let ptr = NonNull::new(vec.as_mut_ptr())
            .ok_or_else(|| error::invalid_input("vector has no allocation"))?;
        // SAFETY: `ptr` is the vector's live allocation of at least `len` bytes; it is freed only
        // in `Drop`/`into_vec`, after deregistration.
        let mr = match unsafe { register(&pd, ptr, len, access) } {
            Ok(mr) => mr,
            Err(err) => {
                // SAFETY: the parts of the vector taken apart above, never registered.
                drop(unsafe { Vec::from_raw_parts(ptr.as_ptr(), len, capacity) });
                return Err(err);
            }
        };
        Ok(RegisteredBuffer {
            ptr,
            len,
            backing: Backing::Vec { capacity },
            access,
            mr,
            pd,
        })
    }

    /// Deregisters the memory and returns it as a vector (a copy when the crate allocated it,
    /// or when deregistration failed and the original must be leaked).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: the registration is live and deregistered once; `this` is never dropped.
        let deregistered = unsafe { deregister(this.mr, this.len) };
        // SAFETY: reading the Arc out of a ManuallyDrop that is never used again moves it.
        drop(unsafe { std::ptr::read(&this.pd) });
        match (deregistered, &this.backing) {
            // SAFETY: the vector's own parts; deregistered above, so nothing else can write it.
            (true, Backing::Vec { capacity }) => unsafe {
                Vec::from_raw_parts(this.ptr.as_ptr(), this.len, *capacity)
            },
            (_, backing) => {
                let mut out = vec![0; this.len];
                // SAFETY: the allocation is live for `len` bytes; `out` is separate memory.
                unsafe {
                    std::ptr::copy_nonoverlapping(this.ptr.as_ptr(), out.as_mut_ptr(), this.len)
                };
                match backing {
                    // SAFETY: allocated in `new` with this layout, no longer registered.
                    Backing::Allocated(layout) if deregistered => unsafe {
                        alloc::dealloc(this.ptr.as_ptr(), *layout)
                    },
                    // Still registered (a peer might write it): leak it.
                    _ => tracing::warn!("ibv_dereg_mr failed; leaking the memory"),
                }
                out
            }
        }
    }

    /// The access rights the memory was registered with.
    pub(crate) fn access(&self) -> Access {
        self.access
    }

    /// The protection domain the memory is registered with.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// A view of the bytes, only for memory that no peer can reach.
    ///
    /// # Safety
    ///
    /// No work request may be outstanding on this memory while the view lives (the device could
    /// write it).
    pub(crate) unsafe fn local_slice(&self) -> Option<&[u8]> {
        // SAFETY: without remote access only this process's work requests can write the memory,
        // and the caller guarantees none is outstanding; `ptr..ptr + len` is live.
        (!self.access.is_remote())
            .then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// A mutable view of the bytes, only for memory that no peer can reach.
    ///
    /// # Safety
    ///
    /// As [`Self::local_slice`].
    pub(crate) unsafe fn local_slice_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: as in `local_slice`; `&mut self` makes the view unique.
        (!self.access.is_remote())
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
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
        if !unsafe { deregister(self.mr, self.len) } {
            // Still registered: a peer or the device might write it. Leak it.
            tracing::warn!(len = self.len, "ibv_dereg_mr failed; leaking the memory");
            return;
        }
        match self.backing {
            // SAFETY: allocated in `new` with this layout; no reference into it exists.
            Backing::Allocated(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Backing::Vec { capacity } => {
                // SAFETY: the parts of the vector `from_vec` took apart; no reference into it
                // exists.
                let vec = unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, capacity) };
                drop(vec);
            }
        }
    }
}
