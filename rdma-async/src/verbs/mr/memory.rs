//! [`RegisteredBuffer`]: memory registered with a protection domain, and the CPU's access to
//! it: raw copies in and out at checked offsets, views only of bytes no peer and no work request
//! can write, and deregistration before the memory is freed. Where the memory comes from is
//! [`sources`]'s part.

use std::alloc::{self, Layout};
use std::any::Any;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::access::{Access, RegFlags};
use super::mapping::Mapping;
use super::range_registration::{self, RangeRegistrations};
use super::registration::{deregister, register};
use crate::error;
use crate::verbs::pd::ProtectionDomain;

mod sources;

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

impl RegisteredBuffer {
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
    pub(in crate::verbs) fn unreachable_view(&self, offset: usize, len: usize) -> Option<&[u8]> {
        if self.cpu_access() != CpuAccess::ReadWrite || self.may_be_written(offset, len) {
            return None;
        }
        let ptr = self.range_ptr(offset, len).ok()?;
        // SAFETY: `range_ptr` checked the range lies in the live allocation. Nothing but the
        // CPU can write these bytes: no remote access through the registration or a live part
        // of it, no local write through the registration, and the parts' local keys are never
        // used in work requests. The caller keeps windows away while the view lives, and
        // `&self` methods write only through raw copies that callers never aim at a range
        // they hold a view of.
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
    ///
    /// Inlined, its usual case (CPU memory, a range inside) alone: it runs for every copied
    /// chunk, and its frame cost as much as the check.
    #[inline]
    pub(crate) fn write_at(&self, offset: usize, src: &[u8]) -> io::Result<()> {
        if let Some(dst) = self.cpu_range_ptr(offset, src.len()) {
            // SAFETY: `dst` starts a checked range of the live allocation, and `src` is
            // ordinary Rust memory that cannot overlap it (no reference into the buffer exists).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
            return Ok(());
        }
        self.write_at_other(offset, src)
    }

    /// [`Self::write_at`] but for its usual case: the errors, or a range outside.
    #[cold]
    #[inline(never)]
    fn write_at_other(&self, offset: usize, src: &[u8]) -> io::Result<()> {
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

    /// Copies `dst.len()` bytes at `offset` out of the buffer. Inlined, its usual case alone,
    /// as [`Self::write_at`]: it runs for every read.
    #[inline]
    pub(crate) fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        if let Some(src) = self.cpu_range_ptr(offset, dst.len()) {
            // SAFETY: as in `write_at`, in the other direction.
            unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
            return Ok(());
        }
        self.read_at_other(offset, dst)
    }

    /// [`Self::read_at`] but for its usual case: a file's bytes, the errors, or a range
    /// outside.
    #[cold]
    #[inline(never)]
    fn read_at_other(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
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

    /// A pointer to byte `offset` of memory the CPU may read and write, if `len` bytes from
    /// there are in the buffer.
    #[inline]
    fn cpu_range_ptr(&self, offset: usize, len: usize) -> Option<*mut u8> {
        let inside = offset.checked_add(len).is_some_and(|end| end <= self.len());
        if !inside || !matches!(self.cpu_access(), CpuAccess::ReadWrite) {
            return None;
        }
        // SAFETY: the check keeps `offset` within the allocation (at most one past its end).
        Some(unsafe { self.ptr.as_ptr().add(offset) })
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
