//! The verbs layer: RAII owners of libibverbs and librdmacm objects.
//!
//! This is the only module of the crate with `unsafe` code. Each type owns one C object, frees it
//! in `Drop`, and holds `Arc`s to the objects it depends on, so a parent can never be destroyed
//! before a child (a queue pair before its completion queues, a memory region before its
//! protection domain, everything before its `rdma_cm_id`). Registered memory is never viewed
//! through a Rust reference: the device (and, with remote access, the peer) may write it at any
//! time, so data moves in and out with raw-pointer copies only.
//!
//! The files are grouped by the family of C objects they own, in floors: each folder imports
//! only from the folders below it, never from one above, and the imports between the files of
//! one folder form no circle. From the bottom:
//!
//! 1. [`device`]: device lists and contexts, device and port attributes, asynchronous events,
//!    the limits creation runs into, channel descriptors for Tokio.
//! 2. [`cm`]: rdma_cm ids and event channels (on a device).
//! 3. [`cq`]: completion channels and queues, work completions (on an id's device context).
//! 4. [`pd`]: protection domains and address handles (on an id's or the device list's context;
//!    a handle may be made from a work completion).
//! 5. [`mr`]: registered memory and memory windows (on a protection domain).
//! 6. [`qp`]: queue pairs, shared receive queues and what they post (on all of the above).
//!
//! The rest of the crate uses the re-exports below, not the folders.

mod cm;
mod cq;
mod device;
mod mr;
mod pd;
mod qp;

pub(crate) use cm::{
    AhAttr, CmEvent, CmId, EventChannel, IdDevice, IncomingId, PortSpace, RawConnParam, UdParam,
};
pub(crate) use cq::{
    CompletionBatch, CompletionChannel, CompletionQueue, CqEventSink, PolledCompletion, WcStatus,
    WorkCompletion, completion_error, wc_error,
};
#[cfg(rdma_async_hooks)]
pub use device::Resource;
#[cfg(rdma_async_hooks)]
pub(crate) use device::fault_injection;
pub(crate) use device::{
    AsyncEventFd, ChannelFd, CmDevices, DeviceList, RawAsyncEvent, ResourceError,
    binding_memlock_limit, event_type_str, query_port_state, register_readable,
};
pub(crate) use mr::{
    Access, MemoryWindow, OdpCaps, RegFlags, RegisteredBuffer, SlabSlice, SliceHome, UserBuffer,
    WindowBinding, WindowOp, huge_page_size, page_size, prefetch,
};
#[cfg(rdma_async_hooks)]
pub(crate) use pd::reply_handle_hold;
pub(crate) use pd::{AddressHandle, GRH_LEN, ProtectionDomain};
pub(crate) use qp::{
    BatchRefused, BufferView, Doorbell, Held, InFlightTable, MAX_SEGMENTS, Opcode, Payload, Posted,
    QpCaps, Segment, SendChain, SharedRecvQueue, Ticket, UdCaps, UdQueuePair, UdSend, WorkQueue,
    WorkRequest, port_mtu,
};
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use qp::{Probe, batch_member_id};
// `pub` so that the test hooks (`--cfg rdma_async_hooks`) can re-export them; without them they
// stay crate-private.
pub use mr::ForeignMemory;
pub use qp::{CallerMemoryQueuePair, OwnedBufferQueuePair};
