//! `ibv_get_device_list`: the RDMA devices of this machine.

use std::ffi::CStr;
use std::io;
use std::ptr::NonNull;

use rdma_async_sys as sys;

use crate::error;

/// An owned device list; freed with `ibv_free_device_list`.
#[derive(Debug)]
pub(crate) struct DeviceList {
    raw: NonNull<*mut sys::ibv_device>,
    len: usize,
}

/// What the crate reports of one device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceEntry {
    pub(crate) name: String,
    pub(crate) node_guid: u64,
}

impl DeviceList {
    /// The current devices (an empty list on a machine without devices).
    ///
    /// # Errors
    ///
    /// `NotFound` when the kernel has no RDMA support at all.
    pub(crate) fn new() -> io::Result<Self> {
        let mut len = 0;
        // SAFETY: `len` is a valid out-pointer; the list is freed in Drop.
        let raw = unsafe { sys::ibv_get_device_list(&mut len) };
        let Some(raw) = NonNull::new(raw) else {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::ENOSYS | libc::ENOENT) => {
                    Err(error::no_device(format!("no RDMA support ({err})")))
                }
                Some(errno) => Err(error::call_error("ibv_get_device_list", errno)),
                None => Err(err),
            };
        };
        Ok(DeviceList {
            raw,
            len: usize::try_from(len).unwrap_or(0),
        })
    }

    pub(crate) fn entries(&self) -> Vec<DeviceEntry> {
        (0..self.len)
            .filter_map(|i| {
                // SAFETY: `i < len`, so the slot is inside the list's array.
                let slot = unsafe { self.raw.as_ptr().add(i) };
                // SAFETY: the list holds `len` initialised device pointers while it is alive.
                let dev = unsafe { slot.read() };
                let dev = NonNull::new(dev)?;
                // SAFETY: `dev` is a live device of the list; the name is a static C string owned
                // by libibverbs.
                let name = unsafe { sys::ibv_get_device_name(dev.as_ptr()) };
                let name = NonNull::new(name.cast_mut())?;
                // SAFETY: a NUL-terminated string that lives as long as the list.
                let name = unsafe { CStr::from_ptr(name.as_ptr()) }
                    .to_string_lossy()
                    .into_owned();
                // SAFETY: `dev` is a live device of the list.
                let guid = unsafe { sys::ibv_get_device_guid(dev.as_ptr()) };
                Some(DeviceEntry {
                    name,
                    node_guid: u64::from_be(guid),
                })
            })
            .collect()
    }
}

impl DeviceList {
    /// Opens device `index` of the list and queries it and its ports (`ibv_devinfo`).
    pub(crate) fn query(
        &self,
        index: usize,
    ) -> io::Result<(sys::ibv_device_attr, Vec<sys::ibv_port_attr>)> {
        if index >= self.len {
            return Err(error::invalid_input("no such device"));
        }
        // SAFETY: `index < len`, so the slot is inside the list's array.
        let slot = unsafe { self.raw.as_ptr().add(index) };
        // SAFETY: the list holds `len` initialised device pointers while it is alive.
        let dev = unsafe { slot.read() };
        // SAFETY: `dev` is a live device of the list (or NULL, which ibv_open_device rejects).
        let ctx = NonNull::new(unsafe { sys::ibv_open_device(dev) })
            .ok_or_else(|| error::last_error("ibv_open_device"))?;
        let result = super::device_attr::query_device(ctx).and_then(|attr| {
            let ports = (1..=attr.phys_port_cnt)
                .map(|port| super::device_attr::query_port(ctx, port))
                .collect::<io::Result<Vec<_>>>()?;
            Ok((attr, ports))
        });
        // SAFETY: opened above and closed once; nothing created on it outlives this call.
        unsafe { sys::ibv_close_device(ctx.as_ptr()) };
        result
    }
}

impl Drop for DeviceList {
    fn drop(&mut self) {
        // SAFETY: the list came from ibv_get_device_list and is freed once.
        unsafe { sys::ibv_free_device_list(self.raw.as_ptr()) };
    }
}
