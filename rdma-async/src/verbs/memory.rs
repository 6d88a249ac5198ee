//! Registered memory: page-aligned allocations, a caller's `Vec<u8>` whose ownership moves in for
//! as long as it is registered, huge pages, read-only file mappings, caller-owned memory and
//! dma-bufs.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::foreign_memory::ForeignMemory;
use super::mapping::Mapping;
use super::protection_domain::ProtectionDomain;
use super::range_registration::{self, RangeRegistrations};
use super::resource_limits::{
    DeviceLimits, MEMORY_REGIONS, Memlock, Resource, injected_failure, registration_error,
};
use crate::error;

/// Memory registered with a protection domain.
///
/// The device may write this memory at any time while a receive (or, with remote-write access,
/// a peer's RDMA write) is outstanding, so no Rust reference to it is ever created: data moves in
/// and out with raw copies at checked offsets. The registration is dropped before the memory is
/// freed, and the queue pairs that use it must be destroyed before it is dropped (owners hold it
/// in fields declared after their queue pair).
#[derive(Debug)]
pub(crate) struct RegisteredBuffer {
    /// The first byte (dangling for a dma-buf, which has no CPU mapping: never dereferenced).
    ptr: NonNull<u8>,
    /// The address work requests name: `ptr`, or the I/O virtual address of a dma-buf.
    iova: u64,
    len: usize,
    backing: Backing,
    access: Access,
    mr: NonNull<sys::ibv_mr>,
    pd: Arc<ProtectionDomain>,
    /// Registrations of parts of the memory, each with its own key and access.
    ranges: RangeRegistrations,
    /// Whether the registration lets local work requests write the memory (`false` only when
    /// known to be registered without local write).
    device_writable: bool,
}

/// Who frees the memory, and how.
#[derive(Debug)]
enum Backing {
    /// `alloc_zeroed` with this layout.
    Allocated(Layout),
    /// The parts of a `Vec<u8>` (length `len`, this capacity), taken apart so that no `Vec` (and
    /// so no unique reference) exists while the device owns the bytes.
    Vec { capacity: usize },
    /// Anonymous huge pages, unmapped after deregistration.
    Huge(#[allow(dead_code, reason = "held to unmap after deregistration")] Mapping),
    /// A read-only mapping of `file` at `offset`. The CPU reads through the file (`pread`), not
    /// the mapping, so a file truncated by another process gives an error rather than `SIGBUS`.
    File {
        _mapping: Mapping,
        file: File,
        offset: u64,
    },
    /// Memory the caller owns; this value (its owner) is dropped after deregistration.
    Foreign(
        #[allow(dead_code, reason = "dropped after deregistration")] Box<dyn Any + Send + Sync>,
    ),
    /// A dma-buf (device memory, no CPU mapping here); the descriptor closes after
    /// deregistration.
    DmaBuf(#[allow(dead_code, reason = "closed after deregistration")] OwnedFd),
    /// Deregistered and freed (or leaked) already.
    Released,
}

/// What the CPU may do with a registration's bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CpuAccess {
    ReadWrite,
    /// Only reads, through the file.
    ReadOnlyFile,
    /// None: device memory.
    Nothing,
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
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound over the memory (which grants the peer
    /// access only through them).
    pub(crate) mw_bind: bool,
}

/// How a registration is made, besides its remote access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegFlags {
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, RDMA read results).
    pub(crate) local_write: bool,
    /// `IBV_ACCESS_ON_DEMAND`: pages are faulted in by the device rather than pinned.
    pub(crate) on_demand: bool,
}

impl RegFlags {
    pub(crate) const PINNED: RegFlags = RegFlags {
        local_write: true,
        on_demand: false,
    };
}

impl Access {
    /// Whether a peer can reach the memory at all.
    pub(crate) fn is_remote(self) -> bool {
        self.remote_read || self.remote_write || self.remote_atomic
    }

    /// The remote-access flags alone (`ibv_access_flags`), as a memory window bind takes them.
    pub(crate) fn remote_flags(self) -> u32 {
        let no_local = RegFlags {
            local_write: false,
            on_demand: false,
        };
        Access {
            mw_bind: false,
            ..self
        }
        .flags(no_local) as u32
    }

    fn flags(self, reg: RegFlags) -> i32 {
        let mut flags = 0;
        if reg.local_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        }
        if reg.on_demand {
            flags |= sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND;
        }
        if self.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        if self.remote_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        if self.remote_atomic {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        if self.mw_bind {
            flags |= sys::ibv_access_flags::IBV_ACCESS_MW_BIND;
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
unsafe fn try_register(
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
fn last_errno() -> i32 {
    io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

/// Counts a registration of `len` bytes, or explains why it failed.
fn registered(
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
    #[cfg(feature = "test-hooks")]
    if let Some(errno) = super::fault_injection::injected_teardown(
        super::fault_injection::Teardown::DeregisterMemory,
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

impl RegisteredBuffer {
    /// Allocates `len` zeroed bytes and registers them for local write (and `access`).
    pub(crate) fn new(pd: Arc<ProtectionDomain>, len: usize, access: Access) -> io::Result<Self> {
        Self::allocated(pd, len, access, RegFlags::PINNED)
    }

    /// Allocates `len` zeroed bytes and registers them with `reg`.
    pub(crate) fn allocated(
        pd: Arc<ProtectionDomain>,
        len: usize,
        access: Access,
        reg: RegFlags,
    ) -> io::Result<Self> {
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
        let mr = match unsafe { register(&pd, ptr, layout.size(), access, reg) } {
            Ok(mr) => mr,
            Err(err) => {
                // SAFETY: allocated above with this layout and not registered.
                unsafe { alloc::dealloc(ptr.as_ptr(), layout) };
                return Err(err);
            }
        };
        let mut buffer = Self::assemble(
            ptr,
            layout.size(),
            Backing::Allocated(layout),
            access,
            mr,
            pd,
        );
        buffer.device_writable = reg.local_write;
        Ok(buffer)
    }

    fn assemble(
        ptr: NonNull<u8>,
        len: usize,
        backing: Backing,
        access: Access,
        mr: NonNull<sys::ibv_mr>,
        pd: Arc<ProtectionDomain>,
    ) -> Self {
        RegisteredBuffer {
            ptr,
            iova: ptr.as_ptr() as u64,
            len,
            backing,
            access,
            mr,
            pd,
            ranges: RangeRegistrations::default(),
            device_writable: true,
        }
    }

    /// Whether anything may write `len` bytes at `offset` besides the CPU: a peer through the
    /// registration or one of its parts, or a local work request.
    pub(crate) fn may_be_written(&self, offset: usize, len: usize) -> bool {
        self.access.is_remote()
            || self.device_writable
            || self.ranges.remotely_writable(offset, len)
    }

    /// A view of `len` bytes at `offset`, when [`Self::may_be_written`] is false for them (and
    /// the CPU owns the memory); the caller keeps windows from being bound over them while the
    /// view lives.
    pub(super) fn unreachable_view(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if self.cpu_access() != CpuAccess::ReadWrite || self.may_be_written(offset, len) {
            return None;
        }
        let ptr = self.range_ptr(offset, len).ok()?;
        // SAFETY: `range_ptr` checked the range lies in the live allocation. Nothing but the
        // CPU can write these bytes: no remote access through the registration or a live part
        // of it, no local write through the registration, and the parts' local keys are never
        // used in work requests. The caller keeps windows away while the view lives, and
        // `&self` methods write only through raw copies that callers never aim at a range
        // they lent out.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// Registers `len` bytes at `offset` once more, with `access`; returns the index of the
    /// registration in [`Self::ranges`]. It is deregistered with the buffer, before the memory
    /// is freed, if not earlier.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a range outside the buffer or memory the CPU does not own here (a
    /// dma-buf); the error of `ibv_reg_mr`.
    pub(crate) fn register_range(
        &self,
        offset: usize,
        len: usize,
        access: Access,
    ) -> io::Result<usize> {
        if offset.checked_add(len).is_none_or(|end| end > self.len)
            || len == 0
            || self.cpu_access() != CpuAccess::ReadWrite
        {
            return Err(range_registration::outside(offset, len, self.len));
        }
        let ptr = NonNull::new(self.ptr.as_ptr().wrapping_add(offset))
            .ok_or_else(|| range_registration::outside(offset, len, self.len))?;
        // SAFETY: `ptr..ptr + len` lies within this buffer's live allocation, which stays
        // allocated until after the registration is deregistered (`release` deregisters the
        // ranges first).
        let mr = unsafe { register(&self.pd, ptr, len, access, RegFlags::PINNED) }?;
        Ok(self.ranges.add(mr, offset, len, access.is_remote()))
    }

    /// The registrations of parts of the buffer.
    pub(crate) fn ranges(&self) -> &RangeRegistrations {
        &self.ranges
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
        let mr = match unsafe { register(&pd, ptr, len, access, RegFlags::PINNED) } {
            Ok(mr) => mr,
            Err(err) => {
                // SAFETY: the parts of the vector taken apart above, never registered.
                drop(unsafe { Vec::from_raw_parts(ptr.as_ptr(), len, capacity) });
                return Err(err);
            }
        };
        Ok(Self::assemble(
            ptr,
            len,
            Backing::Vec { capacity },
            access,
            mr,
            pd,
        ))
    }

    /// `len` zeroed bytes of anonymous huge pages, registered for local write (and `access`).
    pub(crate) fn huge(pd: Arc<ProtectionDomain>, len: usize, access: Access) -> io::Result<Self> {
        let mapping = Mapping::huge(len)?;
        let ptr = mapping.ptr();
        // SAFETY: the mapping covers at least `len` bytes and is unmapped only after the
        // registration is dropped (it is this buffer's backing).
        let mr = unsafe { register(&pd, ptr, len, access, RegFlags::PINNED) }?;
        Ok(Self::assemble(
            ptr,
            len,
            Backing::Huge(mapping),
            access,
            mr,
            pd,
        ))
    }

    /// `len` bytes of `file` from `offset`, mapped read-only and registered without local write:
    /// the source of sends and RDMA writes, and (with `access`) of a peer's RDMA reads.
    pub(crate) fn file(
        pd: Arc<ProtectionDomain>,
        file: &File,
        offset: u64,
        len: usize,
        access: Access,
    ) -> io::Result<Self> {
        if access.remote_write || access.remote_atomic {
            return Err(error::invalid_input(
                "a file is mapped read-only: a peer may only read it",
            ));
        }
        let reg = RegFlags {
            local_write: false,
            on_demand: false,
        };
        let mut mapping = Mapping::file_read_only(file, offset, len, true)?;
        // SAFETY: the mapping covers `len` bytes and is unmapped only after the registration
        // is dropped (it moves into the backing).
        let mut result = unsafe { try_register(&pd, mapping.ptr(), len, access, reg) };
        if result == Err(libc::EFAULT) {
            // Kernels before 6.2 pin even read-only registrations for write, which a shared
            // read-only mapping refuses; a private one is copied on write instead.
            mapping = Mapping::file_read_only(file, offset, len, false)?;
            // SAFETY: as above, for the new mapping.
            result = unsafe { try_register(&pd, mapping.ptr(), len, access, reg) };
        }
        let mr = registered(&pd, len, result)?;
        let ptr = mapping.ptr();
        let backing = Backing::File {
            _mapping: mapping,
            file: file.try_clone()?,
            offset,
        };
        Ok(Self::assemble(ptr, len, backing, access, mr, pd))
    }

    /// Registers memory the caller vouched for; its owner is dropped after deregistration.
    pub(crate) fn foreign(
        pd: Arc<ProtectionDomain>,
        memory: ForeignMemory,
        access: Access,
    ) -> io::Result<Self> {
        // SAFETY: `ForeignMemory::new`'s contract: the memory stays allocated until the owner is
        // dropped, which this buffer does only after deregistration.
        let mr = unsafe { register(&pd, memory.ptr, memory.len, access, RegFlags::PINNED) }?;
        Ok(Self::assemble(
            memory.ptr,
            memory.len,
            Backing::Foreign(memory.owner),
            access,
            mr,
            pd,
        ))
    }

    /// Registers `len` bytes at `offset` of the dma-buf `fd` (`ibv_reg_dmabuf_mr`), named by
    /// work requests at I/O virtual address `iova`.
    pub(crate) fn dmabuf(
        pd: Arc<ProtectionDomain>,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        iova: u64,
        access: Access,
    ) -> io::Result<Self> {
        if iova.checked_add(len as u64).is_none() {
            return Err(error::invalid_input(
                "the dma-buf's I/O address range wraps around",
            ));
        }
        let result = match injected_failure(Resource::MemoryRegion) {
            Some(errno) => Err(errno),
            // SAFETY: `pd` is live and `fd` open; the kernel checks the range against the
            // dma-buf and keeps its own reference to it while registered.
            None => NonNull::new(unsafe {
                sys::rdma_async_reg_dmabuf_mr(
                    pd.as_ptr(),
                    offset,
                    len,
                    iova,
                    fd.as_raw_fd(),
                    access.flags(RegFlags::PINNED),
                )
            })
            .ok_or_else(last_errno),
        };
        let mr = match result {
            Err(errno) if errno == libc::EOPNOTSUPP || errno == libc::ENOSYS => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "RDMA device {} cannot register dma-bufs (ibv_reg_dmabuf_mr: {})",
                        pd.device_name(),
                        io::Error::from_raw_os_error(errno)
                    ),
                ));
            }
            other => registered(&pd, len, other)?,
        };
        let mut buffer = Self::assemble(
            NonNull::dangling(),
            len,
            Backing::DmaBuf(fd),
            access,
            mr,
            pd,
        );
        buffer.iova = iova;
        Ok(buffer)
    }

    /// What the CPU may do with the bytes.
    pub(crate) fn cpu_access(&self) -> CpuAccess {
        match self.backing {
            Backing::File { .. } => CpuAccess::ReadOnlyFile,
            Backing::DmaBuf(_) | Backing::Released => CpuAccess::Nothing,
            _ => CpuAccess::ReadWrite,
        }
    }

    /// Whether the device may write the memory (it was registered with local write).
    pub(crate) fn locally_writable(&self) -> bool {
        !matches!(self.backing, Backing::File { .. })
    }

    /// Deregisters the memory once and hands back its backing to free, or `None` when it was
    /// released already or deregistration failed (then the memory is leaked: a peer or the device
    /// might still write it).
    fn release(&mut self) -> Option<Backing> {
        let backing = std::mem::replace(&mut self.backing, Backing::Released);
        if matches!(backing, Backing::Released) {
            return None;
        }
        if !self.ranges.deregister_all() {
            tracing::warn!(
                len = self.len,
                "a part stays registered; leaking the memory"
            );
            std::mem::forget(backing);
            return None;
        }
        // SAFETY: the registration is live (the backing was not released) and deregistered once.
        match unsafe { deregister(self.mr, self.len) } {
            Ok(()) => Some(backing),
            Err(e) => {
                tracing::warn!(len = self.len, error = %e, "leaking the memory");
                std::mem::forget(backing);
                None
            }
        }
    }

    /// Frees `backing`, released from this buffer.
    fn free(&self, backing: Backing) {
        match backing {
            // SAFETY: allocated in `allocated` with this layout; deregistered, and no reference
            // into it exists.
            Backing::Allocated(layout) => unsafe { alloc::dealloc(self.ptr.as_ptr(), layout) },
            Backing::Vec { capacity } => {
                // SAFETY: the parts of the vector `from_vec` took apart; deregistered, and no
                // reference into it exists.
                drop(unsafe { Vec::from_raw_parts(self.ptr.as_ptr(), self.len, capacity) });
            }
            // Unmaps, drops the caller's owner, or closes the dma-buf.
            other => drop(other),
        }
    }

    /// Deregisters the memory and returns it as a vector (a copy unless it came from a vector;
    /// empty for a dma-buf, whose bytes the CPU cannot read here).
    pub(crate) fn into_vec(mut self) -> Vec<u8> {
        let copy = match self.backing {
            Backing::Vec { .. } => None,
            _ => {
                let mut out = vec![0; self.len];
                if self.read_at(0, &mut out).is_err() {
                    out.clear();
                }
                Some(out)
            }
        };
        let Some(backing) = self.release() else {
            return copy.unwrap_or_default();
        };
        match (backing, copy) {
            // SAFETY: the vector's own parts; deregistered, so nothing else can write them.
            (Backing::Vec { capacity }, None) => unsafe {
                Vec::from_raw_parts(self.ptr.as_ptr(), self.len, capacity)
            },
            (backing, copy) => {
                self.free(backing);
                copy.unwrap_or_default()
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
    /// write it), and no memory window may be bound over it (the peer could).
    pub(crate) unsafe fn local_slice(&self) -> Option<&[u8]> {
        // SAFETY: without remote access only this process's work requests and windows can
        // expose the memory, and the caller guarantees none is outstanding or bound;
        // `ptr..ptr + len` is live.
        (!self.access.is_remote()
            && !self.ranges.remotely_writable(0, self.len)
            && self.cpu_access() == CpuAccess::ReadWrite)
            .then(|| unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// A mutable view of the bytes, only for memory that no peer can reach.
    ///
    /// # Safety
    ///
    /// As [`Self::local_slice`].
    pub(crate) unsafe fn local_slice_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: as in `local_slice`; `&mut self` makes the view unique.
        (!self.access.is_remote()
            && !self.ranges.remotely_writable(0, self.len)
            && self.cpu_access() == CpuAccess::ReadWrite)
            .then(|| unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// Whether the bytes at `offset..offset + len` may be viewed: no peer can reach them and
    /// the CPU may read and write them.
    fn locally_viewable(&self, offset: usize, len: usize) -> bool {
        !self.access.is_remote()
            && !self.ranges.remotely_writable(offset, len)
            && self.cpu_access() == CpuAccess::ReadWrite
    }

    /// A shared view of `len` bytes at `offset`, only for memory that no peer can reach
    /// (`None` for other memory or a range outside the buffer).
    ///
    /// # Safety
    ///
    /// No work request may be outstanding on the range while the view lives, and no mutable
    /// view of it may exist (the caller owns the range, as a pool's slice does).
    pub(crate) unsafe fn local_range(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if !self.locally_viewable(offset, len) {
            return None;
        }
        let ptr = self.range_ptr(offset, len).ok()?;
        // SAFETY: the range is checked to lie in the live allocation; the caller guarantees the
        // device does not write it and nothing mutates it while the view lives.
        Some(unsafe { std::slice::from_raw_parts(ptr, len) })
    }

    /// A mutable view of `len` bytes at `offset`, only for memory that no peer can reach
    /// (`None` for other memory or a range outside the buffer).
    ///
    /// # Safety
    ///
    /// No work request may be outstanding on the range while the view lives, and no other view
    /// of it may exist (the caller owns the range, as a pool's slice does).
    #[allow(clippy::mut_from_ref, reason = "the caller owns the range exclusively")]
    pub(crate) unsafe fn local_range_mut(&self, offset: usize, len: usize) -> Option<&mut [u8]> {
        if !self.locally_viewable(offset, len) {
            return None;
        }
        let ptr = self.range_ptr(offset, len).ok()?;
        // SAFETY: the range is checked to lie in the live allocation; the caller guarantees the
        // device does not touch it and nothing else views it.
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// The address of byte `offset`, for a scatter/gather entry.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.iova + offset as u64
    }

    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the registration is live for `self`'s lifetime.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The registration, for a memory window bind; never dereferenced outside this module.
    pub(crate) fn mr_ptr(&self) -> *mut sys::ibv_mr {
        self.mr.as_ptr()
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
        match self.cpu_access() {
            CpuAccess::ReadWrite => {}
            CpuAccess::ReadOnlyFile => {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    "the region is a read-only file mapping",
                ));
            }
            CpuAccess::Nothing => return Err(no_cpu_mapping()),
        }
        let dst = self.range_ptr(offset, src.len())?;
        // SAFETY: `dst` starts a checked range of the live allocation, and `src` is ordinary Rust
        // memory that cannot overlap it (no reference into the buffer exists).
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies `dst.len()` bytes at `offset` out of the buffer.
    pub(crate) fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        match (self.cpu_access(), &self.backing) {
            (CpuAccess::ReadWrite, _) => {
                let src = self.range_ptr(offset, dst.len())?;
                // SAFETY: as in `write_at`, in the other direction.
                unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
                Ok(())
            }
            // Through the file: a mapping truncated by another process would raise SIGBUS.
            (
                _,
                Backing::File {
                    file, offset: base, ..
                },
            ) => {
                self.check(offset, dst.len())?;
                file.read_exact_at(dst, base + offset as u64)
                    .map_err(|e| io::Error::new(e.kind(), format!("reading the mapped file: {e}")))
            }
            _ => Err(no_cpu_mapping()),
        }
    }

    /// Appends the `len` bytes at `offset` to `out`, copying them straight into its spare
    /// capacity (a copy path that zeroed the new bytes first would write them twice).
    pub(crate) fn append_to(&self, offset: usize, len: usize, out: &mut Vec<u8>) -> io::Result<()> {
        if self.cpu_access() != CpuAccess::ReadWrite {
            let start = out.len();
            out.resize(start + len, 0);
            return self.read_at(offset, &mut out[start..]).inspect_err(|_| {
                out.truncate(start);
            });
        }
        let src = self.range_ptr(offset, len)?;
        out.reserve(len);
        let spare = out.spare_capacity_mut();
        debug_assert!(spare.len() >= len);
        // SAFETY: `src` starts a checked range of `len` bytes of the live allocation, and the
        // reserve made room for `len` more bytes in `out`, which cannot overlap it (ordinary
        // Rust memory).
        unsafe { std::ptr::copy_nonoverlapping(src, spare.as_mut_ptr().cast::<u8>(), len) };
        // SAFETY: within the capacity (reserved above), and the copy initialised those bytes.
        unsafe { out.set_len(out.len() + len) };
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

/// The error for CPU access to device memory.
fn no_cpu_mapping() -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        "the region is device memory (a dma-buf) with no CPU mapping in this process",
    )
}

impl Drop for RegisteredBuffer {
    fn drop(&mut self) {
        if let Some(backing) = self.release() {
            self.free(backing);
        }
    }
}
