//! The RDMA devices of this machine.

use std::io;
use std::path::Path;

use crate::verbs::DeviceList;

/// An RDMA device, as `ibv_devices` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    node_guid: u64,
}

impl Device {
    /// The kernel's name for the device, e.g. `mlx5_0` or `rxe0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The node GUID, in host order.
    pub fn node_guid(&self) -> u64 {
        self.node_guid
    }
}

/// Lists this machine's RDMA devices (empty when it has none).
///
/// # Errors
///
/// `NotFound` when the kernel has no RDMA support at all; the OS error of
/// `ibv_get_device_list` otherwise.
pub fn devices() -> io::Result<Vec<Device>> {
    let list = DeviceList::new()?;
    Ok(list
        .entries()
        .into_iter()
        .map(|e| Device {
            name: e.name,
            node_guid: e.node_guid,
        })
        .collect())
}

/// `Ok` when an RDMA device and the rdma_cm device node exist; otherwise why not. Reads sysfs
/// only, so it is cheap and safe to call before any verbs call.
pub(crate) fn check() -> Result<(), String> {
    let devices = Path::new("/sys/class/infiniband");
    let has_device = std::fs::read_dir(devices).is_ok_and(|mut d| d.next().is_some());
    if !has_device {
        return Err("no device under /sys/class/infiniband".to_owned());
    }
    if !Path::new("/dev/infiniband/rdma_cm").exists() {
        return Err("/dev/infiniband/rdma_cm is missing".to_owned());
    }
    Ok(())
}
