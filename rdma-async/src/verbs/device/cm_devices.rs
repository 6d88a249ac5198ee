//! `rdma_get_devices`: the device contexts librdmacm opened, the same `ibv_context`s its ids use.
//!
//! A protection domain shared by many connections must be allocated on the context their ids
//! are bound to, and that context must stay open for as long as the domain lives, without
//! keeping any one connection's id alive. librdmacm opens each device once per process and
//! counts references: holding this list holds one reference on every device in it.

use std::io;
use std::ptr::NonNull;

use rdma_async_sys as sys;

use super::device_attr::device_name;
use crate::error;

/// An owned `rdma_get_devices` list; freed (its references dropped) with `rdma_free_devices`.
#[derive(Debug)]
pub(crate) struct CmDevices {
    raw: NonNull<*mut sys::ibv_context>,
    len: usize,
}

// SAFETY: the list is an immutable array of context pointers; libibverbs contexts may be used
// from any thread.
unsafe impl Send for CmDevices {}
// SAFETY: as above; nothing is mutated through `&self`.
unsafe impl Sync for CmDevices {}

impl CmDevices {
    /// The devices librdmacm knows now, each held open until the list is dropped.
    ///
    /// # Errors
    ///
    /// `NotFound` when there is no RDMA device (or no RDMA support) at all.
    pub(crate) fn new() -> io::Result<Self> {
        let mut len = 0;
        // SAFETY: `len` is a valid out-pointer; the list is freed in Drop.
        let raw = unsafe { sys::rdma_get_devices(&mut len) };
        let raw = NonNull::new(raw).ok_or_else(|| {
            let err = io::Error::last_os_error();
            error::no_device(format!("rdma_get_devices found no RDMA device ({err})"))
        })?;
        Ok(CmDevices {
            raw,
            len: usize::try_from(len).unwrap_or(0),
        })
    }

    /// The contexts of the list.
    pub(crate) fn contexts(&self) -> impl Iterator<Item = NonNull<sys::ibv_context>> + '_ {
        (0..self.len).filter_map(|i| {
            // SAFETY: `i < len`, so the slot is inside the list's array.
            let slot = unsafe { self.raw.as_ptr().add(i) };
            // SAFETY: the list holds `len` initialised context pointers while it is alive.
            NonNull::new(unsafe { slot.read() })
        })
    }

    /// The names of the devices in the list.
    pub(crate) fn names(&self) -> Vec<String> {
        self.contexts().map(device_name).collect()
    }

    /// The context of the device called `name`.
    pub(crate) fn by_name(&self, name: &str) -> Option<NonNull<sys::ibv_context>> {
        self.contexts().find(|&ctx| device_name(ctx) == name)
    }

    /// Whether `ctx` is one of the list's contexts (so the list keeps it open).
    pub(crate) fn holds(&self, ctx: NonNull<sys::ibv_context>) -> bool {
        self.contexts().any(|c| c == ctx)
    }
}

impl Drop for CmDevices {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once; nothing allocated on its
        // contexts outlives it (protection domains hold the list in an `Arc`).
        unsafe { sys::rdma_free_devices(self.raw.as_ptr()) };
    }
}
