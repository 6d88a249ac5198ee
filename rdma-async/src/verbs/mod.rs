//! The verbs layer: RAII owners of libibverbs and librdmacm objects.
//!
//! This is the only module of the crate with `unsafe` code. Each type owns one C object, frees it
//! in `Drop`, and holds `Arc`s to the objects it depends on, so a parent can never be destroyed
//! before a child (a queue pair before its completion queues, a memory region before its
//! protection domain, everything before its `rdma_cm_id`). Registered memory is never viewed
//! through a Rust reference: the device (and, with remote access, the peer) may write it at any
//! time, so data moves in and out with raw-pointer copies only.

mod access;
mod address_handle;
mod ah_attr;
mod async_events;
mod async_fd;
mod cm_devices;
mod cm_id;
mod comp_queue;
mod completion_batch;
mod deferred_sends;
mod device_attr;
mod device_list;
mod event_channel;
#[cfg(feature = "test-hooks")]
pub(crate) mod fault_injection;
mod foreign_memory;
mod held_posting;
mod id_device;
mod in_flight;
mod mapping;
mod memory;
mod memory_window;
mod multicast;
mod odp;
mod protection_domain;
mod qp_attr;
mod qp_creation;
mod queue_pair;
mod range_registration;
mod registration;
mod remote_grants;
mod resource;
mod resource_limits;
mod send_chain;
mod shared_recv_queue;
mod sockaddr;
mod ud_queue_pair;
mod user_buffer;
mod work;
mod work_request;

pub(crate) use access::{Access, RegFlags};
pub(crate) use address_handle::{AddressHandle, AddressHandles, GRH_LEN};
pub(crate) use async_events::{AsyncEventFd, RawAsyncEvent, event_type_str, query_port_state};
pub(crate) use async_fd::register_readable;
pub(crate) use cm_devices::CmDevices;
pub(crate) use cm_id::{CmId, PortSpace, RawConnParam};
pub(crate) use comp_queue::{CompletionChannel, CompletionQueue};
pub(crate) use completion_batch::CompletionBatch;
pub(crate) use device_list::DeviceList;
pub(crate) use event_channel::{CmEvent, EventChannel, IncomingId, UdParam};
pub(crate) use id_device::IdDevice;
pub(crate) use in_flight::{Held, InFlightTable, Ticket, WorkQueue};
pub(crate) use mapping::huge_page_size;
pub(crate) use memory::RegisteredBuffer;
pub(crate) use memory_window::{MemoryWindow, WindowBinding, WindowOp};
pub(crate) use odp::{OdpCaps, prefetch};
pub(crate) use protection_domain::ProtectionDomain;
pub(crate) use queue_pair::{BufferView, QpCaps};
#[cfg(feature = "test-hooks")]
pub use resource::Resource;
pub(crate) use resource_limits::ResourceError;
pub(crate) use send_chain::SendChain;
pub(crate) use user_buffer::{SlabSlice, SliceHome, UserBuffer};
// `pub` so that the `test-hooks` feature can re-export them; without it they stay crate-private.
pub use foreign_memory::ForeignMemory;
pub use queue_pair::{CallerMemoryQueuePair, OwnedBufferQueuePair};
pub(crate) use shared_recv_queue::SharedRecvQueue;
pub(crate) use ud_queue_pair::{UdCaps, UdQueuePair, UdSend, port_mtu};
pub(crate) use work::{WcStatus, WorkCompletion};
pub(crate) use work_request::{
    Doorbell, MAX_SEGMENTS, Opcode, Payload, Posted, Segment, WorkRequest,
};
