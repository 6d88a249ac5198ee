//! Queue pairs, the top floor: reliable-connected and datagram queue pairs (`ibv_qp`) created
//! on an rdma_cm id, shared receive queues (`ibv_srq`), and what they post: the work-request
//! vocabulary, send chains, the requests deferred to share a doorbell, and the in-flight tables
//! that hold caller memory while a request may touch it.

mod deferred_sends;
mod held_posting;
mod in_flight;
mod qp_attr;
mod qp_creation;
mod queue_pair;
mod remote_grants;
mod send_chain;
mod shared_recv_queue;
mod ud_queue_pair;
mod work_request;

pub(crate) use in_flight::{Held, InFlightTable, Ticket, WorkQueue};
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use in_flight::{Probe, batch_member_id};
// `pub` so that the test hooks (`--cfg rdma_async_hooks`) can re-export them; without them they
// stay crate-private.
pub(crate) use queue_pair::{BatchRefused, BufferView, QpCaps};
pub use queue_pair::{CallerMemoryQueuePair, OwnedBufferQueuePair};
pub(crate) use send_chain::SendChain;
pub(crate) use shared_recv_queue::SharedRecvQueue;
pub(crate) use ud_queue_pair::{UdCaps, UdQueuePair, UdSend, port_mtu};
pub(crate) use work_request::{
    Doorbell, MAX_SEGMENTS, Opcode, Payload, Posted, Segment, WorkRequest,
};
