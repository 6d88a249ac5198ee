//! The RDMA devices of this machine and what they can do (as `ibv_devices` and `ibv_devinfo`
//! show them), their ports and GID tables ([`Device::ports`], as `ibv_devinfo -v` and
//! `rdma link`), choosing the device, port and GID a connection or listener goes through
//! ([`DeviceChoice`]), and the devices' asynchronous events ([`events()`]).

use std::io;
use std::path::Path;

use rdma_async_sys as sys;

use crate::verbs::DeviceList;

mod context;
mod event;
pub(crate) mod events;
mod memory;
mod pool;
mod ports;
mod select;

pub use crate::verbs::ForeignMemory;
pub use context::DeviceContext;
pub use event::{DeviceEvent, DeviceEventKind};
pub use events::{DeviceEvents, event_counts, events, port_states};
pub use memory::OnDemandPaging;
pub use pool::{BufferPool, PoolOptions, PoolStats};
pub use ports::{Gid, GidKind, LinkLayer, Port, PortState};
pub use select::DeviceChoice;
pub(crate) use select::{source_addr, verify as verify_device};

/// An RDMA device, as `ibv_devices` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Device {
    name: String,
    node_guid: u64,
    index: usize,
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

    /// Opens the device and reads its attributes and those of its ports (`ibv_devinfo -v`).
    ///
    /// # Errors
    ///
    /// `NotFound` when the device went away; the OS error of `ibv_query_device` or
    /// `ibv_query_port`.
    pub fn attributes(&self) -> io::Result<DeviceAttributes> {
        let list = DeviceList::new()?;
        let index = list
            .entries()
            .iter()
            .position(|e| e.name == self.name)
            .unwrap_or(self.index);
        let (attr, ports) = list.query(index)?;
        Ok(DeviceAttributes::from_sys(&attr, &ports))
    }
}

/// What a device supports for atomic operations (`enum ibv_atomic_cap`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtomicCapability {
    /// No atomics (`IBV_ATOMIC_NONE`): compare-and-swap and fetch-and-add fail with
    /// `Unsupported`.
    None,
    /// Atomic between operations of this device (`IBV_ATOMIC_HCA`).
    Device,
    /// Atomic also with respect to the CPUs (`IBV_ATOMIC_GLOB`).
    Global,
}

/// A device's attributes (`struct ibv_device_attr`), with its ports.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceAttributes {
    /// Firmware version.
    pub fw_ver: String,
    /// Node GUID, host order.
    pub node_guid: u64,
    /// System image GUID, host order.
    pub sys_image_guid: u64,
    /// IEEE vendor id.
    pub vendor_id: u32,
    /// Vendor part id.
    pub vendor_part_id: u32,
    /// Hardware version.
    pub hw_ver: u32,
    /// Largest registrable memory region, in bytes.
    pub max_mr_size: u64,
    /// Queue pairs.
    pub max_qp: i32,
    /// Work requests per queue.
    pub max_qp_wr: i32,
    /// Scatter/gather entries per work request.
    pub max_sge: i32,
    /// Completion queues.
    pub max_cq: i32,
    /// Entries per completion queue.
    pub max_cqe: i32,
    /// Memory regions.
    pub max_mr: i32,
    /// Protection domains.
    pub max_pd: i32,
    /// RDMA reads and atomics a queue pair can serve at once (responder resources).
    pub max_qp_rd_atom: i32,
    /// RDMA reads and atomics a queue pair can issue at once (initiator depth).
    pub max_qp_init_rd_atom: i32,
    /// Atomic operations support.
    pub atomic_cap: AtomicCapability,
    /// Shared receive queues.
    pub max_srq: i32,
    /// Work requests per shared receive queue.
    pub max_srq_wr: i32,
    /// The device's ports, numbered from 1.
    pub ports: Vec<PortAttributes>,
}

/// A port's attributes (`struct ibv_port_attr`).
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortAttributes {
    /// The port number (from 1).
    pub port_num: u8,
    /// `PORT_ACTIVE`, `PORT_DOWN`, ... as `ibv_devinfo` prints it.
    pub state: String,
    /// Largest MTU the port supports, in bytes.
    pub max_mtu: u32,
    /// The MTU in use, in bytes.
    pub active_mtu: u32,
    /// The local identifier (0 on RoCE).
    pub lid: u16,
    /// GID table entries.
    pub gid_tbl_len: i32,
    /// Largest message, in bytes.
    pub max_msg_sz: u32,
    /// Whether the link layer is Ethernet (RoCE, iWARP) rather than InfiniBand.
    pub ethernet: bool,
}

fn mtu_bytes(mtu: sys::ibv_mtu::Type) -> u32 {
    // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5.
    if (1..=5).contains(&mtu) {
        128 << mtu
    } else {
        0
    }
}

impl DeviceAttributes {
    pub(crate) fn from_sys(attr: &sys::ibv_device_attr, ports: &[sys::ibv_port_attr]) -> Self {
        let fw: Vec<u8> = attr
            .fw_ver
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        DeviceAttributes {
            fw_ver: String::from_utf8_lossy(&fw).into_owned(),
            node_guid: u64::from_be(attr.node_guid),
            sys_image_guid: u64::from_be(attr.sys_image_guid),
            vendor_id: attr.vendor_id,
            vendor_part_id: attr.vendor_part_id,
            hw_ver: attr.hw_ver,
            max_mr_size: attr.max_mr_size,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_sge: attr.max_sge,
            max_cq: attr.max_cq,
            max_cqe: attr.max_cqe,
            max_mr: attr.max_mr,
            max_pd: attr.max_pd,
            max_qp_rd_atom: attr.max_qp_rd_atom,
            max_qp_init_rd_atom: attr.max_qp_init_rd_atom,
            atomic_cap: match attr.atomic_cap {
                sys::ibv_atomic_cap::IBV_ATOMIC_HCA => AtomicCapability::Device,
                sys::ibv_atomic_cap::IBV_ATOMIC_GLOB => AtomicCapability::Global,
                _ => AtomicCapability::None,
            },
            max_srq: attr.max_srq,
            max_srq_wr: attr.max_srq_wr,
            ports: ports
                .iter()
                .enumerate()
                .map(|(i, p)| PortAttributes::from_sys(i as u8 + 1, p))
                .collect(),
        }
    }
}

impl PortAttributes {
    pub(crate) fn from_sys(port_num: u8, p: &sys::ibv_port_attr) -> Self {
        let state = match p.state {
            sys::ibv_port_state::IBV_PORT_DOWN => "PORT_DOWN",
            sys::ibv_port_state::IBV_PORT_INIT => "PORT_INIT",
            sys::ibv_port_state::IBV_PORT_ARMED => "PORT_ARMED",
            sys::ibv_port_state::IBV_PORT_ACTIVE => "PORT_ACTIVE",
            sys::ibv_port_state::IBV_PORT_ACTIVE_DEFER => "PORT_ACTIVE_DEFER",
            _ => "PORT_NOP",
        };
        PortAttributes {
            port_num,
            state: state.to_owned(),
            max_mtu: mtu_bytes(p.max_mtu),
            active_mtu: mtu_bytes(p.active_mtu),
            lid: p.lid,
            gid_tbl_len: p.gid_tbl_len,
            max_msg_sz: p.max_msg_sz,
            ethernet: u32::from(p.link_layer) == sys::_bindgen_ty_13::IBV_LINK_LAYER_ETHERNET,
        }
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
        .enumerate()
        .map(|(index, e)| Device {
            name: e.name,
            node_guid: e.node_guid,
            index,
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
