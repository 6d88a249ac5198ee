//! Registering memory the application already has, or needs of a special kind: huge pages,
//! mapped files, caller-owned memory, dma-bufs and on-demand paging.

use std::fs::File;
use std::io;
use std::ops::RangeBounds;
use std::os::fd::OwnedFd;

use rdma_async_sys as sys;

use super::DeviceContext;
use crate::memory::{LocalRegion, RegisteredBytes, RemoteAccess, SharedRegion, check_len, span};
use crate::verbs::{
    Access, ForeignMemory, OdpCaps, RegFlags, RegisteredBuffer, UserBuffer, huge_page_size,
    prefetch,
};

/// What a device can do with on-demand paging (`ibv_device_attr_ex::odp_caps`), for reliable
/// connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OnDemandPaging {
    /// The device supports on-demand paging at all (`IBV_ODP_SUPPORT`).
    pub supported: bool,
    /// Implicit on-demand registration of the whole address space (`IBV_ODP_SUPPORT_IMPLICIT`).
    pub implicit: bool,
    /// Sends from on-demand memory.
    pub send: bool,
    /// Receives into on-demand memory.
    pub recv: bool,
    /// RDMA writes to and from on-demand memory.
    pub write: bool,
    /// RDMA reads of and into on-demand memory.
    pub read: bool,
    /// Atomics on on-demand memory.
    pub atomic: bool,
}

impl OnDemandPaging {
    fn from_caps(caps: OdpCaps) -> Self {
        use sys::ibv_odp_general_caps as general;
        use sys::ibv_odp_transport_cap_bits as rc;
        let has = |bit: u32| caps.rc & bit != 0;
        OnDemandPaging {
            supported: caps.general & u64::from(general::IBV_ODP_SUPPORT) != 0,
            implicit: caps.general & u64::from(general::IBV_ODP_SUPPORT_IMPLICIT) != 0,
            send: has(rc::IBV_ODP_SUPPORT_SEND),
            recv: has(rc::IBV_ODP_SUPPORT_RECV),
            write: has(rc::IBV_ODP_SUPPORT_WRITE),
            read: has(rc::IBV_ODP_SUPPORT_READ),
            atomic: has(rc::IBV_ODP_SUPPORT_ATOMIC),
        }
    }
}

impl DeviceContext {
    /// Allocates `len` zeroed bytes of huge pages (`MAP_HUGETLB`, the kernel's default huge page
    /// size, rounded up to whole pages) for sends, receives and the local side of RDMA
    /// operations. Huge pages cut the device's address translation work for large buffers.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes (or more than `u32::MAX` for a shared region); `OutOfMemory`
    /// when not enough huge
    /// pages are reserved (the message says how many are free and how to reserve more, as root:
    /// `echo N > /proc/sys/vm/nr_hugepages`); the OS error of `ibv_reg_mr`.
    pub fn reg_msgs_huge(&self, len: usize) -> io::Result<LocalRegion> {
        check_len(len, Access::default())?;
        let buffer = RegisteredBuffer::huge(self.pd().clone(), len, Access::default())?;
        Ok(LocalRegion::new(UserBuffer::new(buffer)))
    }

    /// Allocates `len` zeroed bytes of huge pages a peer may access as `access` allows.
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs_huge`].
    pub fn reg_shared_huge(&self, len: usize, access: RemoteAccess) -> io::Result<SharedRegion> {
        check_len(len, access.access())?;
        let buffer = RegisteredBuffer::huge(self.pd().clone(), len, access.access())?;
        Ok(SharedRegion::new(UserBuffer::new(buffer)))
    }

    /// The kernel's default huge page size, which [`Self::reg_msgs_huge`] rounds up to.
    pub fn huge_page_size() -> usize {
        huge_page_size()
    }

    /// Maps `len` bytes of `file` from `offset` read-only and registers them so that a peer may
    /// RDMA-read them, as a file server does: send [`SharedRegion::remote`] to the peer.
    ///
    /// The mapping is shared, so the device reads the page cache itself, with no copy. Kernels
    /// before 6.2 refuse to register a shared read-only mapping (they pin even read-only
    /// registrations for write); there the mapping is private and the kernel copies the pages
    /// once at registration. Writes to the file by others after registration show through on
    /// the shared path, not on the private one.
    ///
    /// The region is also the source of sends and RDMA writes. It cannot be the destination of
    /// a receive, an RDMA read or an atomic (`InvalidInput`), and [`SharedRegion::write_at`]
    /// fails with `PermissionDenied`. [`SharedRegion::read_at`] reads through the file, so if
    /// another process truncates it the read fails with `UnexpectedEof` instead of raising
    /// `SIGBUS`; the device keeps the pages it pinned.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is empty, not inside the file, longer than `u32::MAX`, or
    /// `offset` is not a multiple of the page size, or when the file system has no shared
    /// mappings (9p without a cache, some FUSE file systems: the message says so); the OS error
    /// of `mmap` or `ibv_reg_mr`.
    pub fn map_file(&self, file: &File, offset: u64, len: usize) -> io::Result<SharedRegion> {
        check_len(len, RemoteAccess::READ.access())?;
        let buffer = RegisteredBuffer::file(
            self.pd().clone(),
            file,
            offset,
            len,
            RemoteAccess::READ.access(),
        )?;
        Ok(SharedRegion::new(UserBuffer::new(buffer)))
    }

    /// Registers memory the application owns, with no remote access: the region derefs to
    /// `[u8]` like any [`LocalRegion`], and drops the memory's owner after deregistering it.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes (or more than `u32::MAX` for a shared region); the OS error of
    /// `ibv_reg_mr`. On error
    /// the owner is dropped.
    pub fn register_foreign(&self, memory: ForeignMemory) -> io::Result<LocalRegion> {
        check_len(memory.len(), Access::default())?;
        let buffer = RegisteredBuffer::foreign(self.pd().clone(), memory, Access::default())?;
        Ok(LocalRegion::new(UserBuffer::new(buffer)))
    }

    /// Registers memory the application owns for remote access.
    ///
    /// # Errors
    ///
    /// As [`Self::register_foreign`].
    pub fn register_foreign_shared(
        &self,
        memory: ForeignMemory,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        check_len(memory.len(), access.access())?;
        let buffer = RegisteredBuffer::foreign(self.pd().clone(), memory, access.access())?;
        Ok(SharedRegion::new(UserBuffer::new(buffer)))
    }

    /// Registers `len` bytes at `offset` of a dma-buf (`ibv_reg_dmabuf_mr`): GPU or other device
    /// memory exported by its driver. The region owns `fd` and closes it after deregistration.
    ///
    /// Work requests and the peer address the region's bytes by their offset in the dma-buf
    /// (`remote().addr()` is `offset`). The CPU has no mapping of it here:
    /// [`SharedRegion::read_at`] and [`SharedRegion::write_at`] fail with `Unsupported`.
    ///
    /// # Errors
    ///
    /// `Unsupported` when the device cannot register dma-bufs (Soft-RoCE cannot; the message
    /// names the device); `InvalidInput` for 0 or more than `u32::MAX` bytes; the OS error of
    /// `ibv_reg_dmabuf_mr` (`EINVAL` when `fd` is not a dma-buf or the range is outside it).
    pub fn register_dmabuf(
        &self,
        fd: OwnedFd,
        offset: u64,
        len: usize,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        check_len(len, access.access())?;
        let buffer =
            RegisteredBuffer::dmabuf(self.pd().clone(), fd, offset, len, offset, access.access())?;
        Ok(SharedRegion::new(UserBuffer::new(buffer)))
    }

    /// What the device can do with on-demand paging.
    ///
    /// # Errors
    ///
    /// The OS error of `ibv_query_device_ex`.
    pub fn on_demand_paging(&self) -> io::Result<OnDemandPaging> {
        Ok(OnDemandPaging::from_caps(OdpCaps::of(self.pd())?))
    }

    /// Allocates `len` bytes registered for on-demand paging (`IBV_ACCESS_ON_DEMAND`) with the
    /// given remote access: the device faults pages in as it touches them instead of the
    /// kernel pinning them all at registration, so regions larger than the locked-memory limit
    /// work. [`Self::prefetch`] faults a range in ahead of use.
    ///
    /// # Errors
    ///
    /// `Unsupported` when the device has no on-demand paging for reliable connections (the
    /// message names the device; Soft-RoCE before Linux 6.15 has none); otherwise as
    /// [`Self::reg_msgs`].
    pub fn reg_shared_on_demand(
        &self,
        len: usize,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        check_len(len, access.access())?;
        let odp = self.on_demand_paging()?;
        if !odp.supported {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "RDMA device {} has no on-demand paging (IBV_ODP_SUPPORT is not in its \
                     odp_caps); register pinned memory instead",
                    self.device_name()
                ),
            ));
        }
        let reg = RegFlags {
            local_write: true,
            on_demand: true,
        };
        let buffer = RegisteredBuffer::allocated(self.pd().clone(), len, access.access(), reg)?;
        Ok(SharedRegion::new(UserBuffer::new(buffer)))
    }

    /// Faults in `range` of an on-demand region (`ibv_advise_mr`, prefetch for write) and waits
    /// until the device has mapped it.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is outside the region or the region belongs to another
    /// context; the OS error of `ibv_advise_mr` (`EOPNOTSUPP` for memory that is not
    /// on-demand).
    pub fn prefetch<B: RegisteredBytes>(
        &self,
        region: &B,
        range: impl RangeBounds<usize>,
    ) -> io::Result<()> {
        let registered = region.user().0.registered();
        if !std::sync::Arc::ptr_eq(registered.pd(), self.pd()) {
            return Err(crate::memory::foreign_region(registered.pd(), self.pd()));
        }
        let (start, len) = span(registered.len(), range)?;
        let len = u32::try_from(len)
            .map_err(|_| crate::error::invalid_input("prefetch range too long"))?;
        prefetch(self.pd(), registered.addr(start), len, registered.lkey())
    }
}
