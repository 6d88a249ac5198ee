//! The registered memory of an [`RdmaConnection`]: its device context and the regions
//! allocated or registered in it.

use std::io;

use bytes::BytesMut;

use super::RdmaConnection;
use crate::device::DeviceContext;
use crate::memory::{LocalRegion, RemoteAccess, SharedRegion};

impl RdmaConnection {
    /// The device context the connection works in: regions registered through it (or through
    /// any connection of it) can be used here.
    pub fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.shared.pd.clone())
    }

    /// Allocates `len` zeroed, page-aligned bytes for sends, receives and the local side of
    /// RDMA operations, with no remote access (`rdma_reg_msgs`), in the connection's
    /// [context](Self::context).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_msgs(&self, len: usize) -> io::Result<LocalRegion> {
        self.context().reg_msgs(len)
    }

    /// Allocates `len` bytes the peer may RDMA-read (`rdma_reg_read`).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_read(&self, len: usize) -> io::Result<SharedRegion> {
        self.context().reg_read(len)
    }

    /// Allocates `len` bytes the peer may RDMA-write (`rdma_reg_write`).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_write(&self, len: usize) -> io::Result<SharedRegion> {
        self.context().reg_write(len)
    }

    /// Allocates `len` bytes with the given remote access.
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_shared(&self, len: usize, access: RemoteAccess) -> io::Result<SharedRegion> {
        self.context().reg_shared(len, access)
    }

    /// Registers `bytes` (its length, not its spare capacity), taking ownership until
    /// [`LocalRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register(&self, bytes: Vec<u8>) -> io::Result<LocalRegion> {
        self.context().register(bytes)
    }

    /// Registers `bytes` for remote access, taking ownership until [`SharedRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register_shared(
        &self,
        bytes: Vec<u8>,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        self.context().register_shared(bytes, access)
    }

    /// Registers the bytes of a `BytesMut` (without a copy when it is the only owner of its
    /// memory).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register_bytes_mut(&self, bytes: BytesMut) -> io::Result<LocalRegion> {
        self.context().register_bytes_mut(bytes)
    }
}
