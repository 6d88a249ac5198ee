//! Whether this machine has a usable RDMA device, checked without touching the verbs libraries.

use std::path::Path;

/// `Ok` when an RDMA device and the rdma_cm device node exist; otherwise why not.
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
