//! Where registered memory comes from: page-aligned allocations, a caller's `Vec<u8>` whose
//! ownership moves in for as long as it is registered, huge pages, read-only file mappings,
//! caller-owned memory and dma-bufs. Each constructor registers the memory and hands the
//! buffer what frees it, to be freed only after deregistration.

use std::alloc::{self, Layout};
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::super::access::{Access, RegFlags};
use super::super::foreign_memory::ForeignMemory;
use super::super::mapping::Mapping;
use super::super::range_registration::RangeRegistrations;
use super::super::registration::{last_errno, register, registered, try_register};
use super::{Backing, RegisteredBuffer};
use crate::error;
use crate::verbs::device::{Resource, injected_failure};
use crate::verbs::pd::ProtectionDomain;

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
}
