//! `rdma_join_multicast` / `rdma_leave_multicast` on a datagram id.

use std::io;
use std::net::SocketAddr;
use std::ptr;

use rdma_async_sys as sys;

use super::cm_id::CmId;
use super::sockaddr::to_sockaddr;
use crate::error;

/// The kernel-internal errno rdma_cm returns for an unsupported join (not in libc).
const ENOTSUPP: i32 = 524;

impl CmId {
    /// Starts joining the multicast group `group` (the id's address must be resolved); the
    /// result arrives as `MULTICAST_JOIN` (with the group's address handle attributes) or
    /// `MULTICAST_ERROR`.
    pub(crate) fn join_multicast(&self, group: SocketAddr) -> io::Result<()> {
        let (storage, _) = to_sockaddr(group);
        // SAFETY: the id is valid; the sockaddr lives across the call (librdmacm copies it);
        // the user context may be NULL.
        let ret = unsafe {
            sys::rdma_join_multicast(
                self.as_ptr(),
                ptr::from_ref(&storage).cast_mut().cast(),
                ptr::null_mut(),
            )
        };
        if ret != 0 {
            let err = io::Error::last_os_error();
            if err.raw_os_error() == Some(ENOTSUPP) && group.is_ipv6() {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "cannot join {}: the kernel's rdma_cm joins IPv6 groups only on \
                         InfiniBand and RoCE v1, and this port uses RoCE v2 (ENOTSUPP)",
                        group.ip()
                    ),
                ));
            }
            return Err(error::call_error(
                "rdma_join_multicast",
                err.raw_os_error().unwrap_or(libc::EIO),
            ));
        }
        Ok(())
    }

    /// Leaves a group joined with [`Self::join_multicast`].
    pub(crate) fn leave_multicast(&self, group: SocketAddr) -> io::Result<()> {
        let (storage, _) = to_sockaddr(group);
        // SAFETY: as in `join_multicast`.
        let ret = unsafe {
            sys::rdma_leave_multicast(self.as_ptr(), ptr::from_ref(&storage).cast_mut().cast())
        };
        if ret != 0 {
            return Err(error::last_error("rdma_leave_multicast"));
        }
        Ok(())
    }
}
