//! `Endpoint`: messages over a reliable connected queue pair established through rdma_cm.
//!
//! Each `send` copies the message into a slot of a registered send buffer and posts it; each
//! received message is copied out of a registered receive slot, which is then posted again. The
//! endpoint owns all registered memory and destroys its queue pair before freeing it, so every
//! future may be dropped at any point without the device touching freed memory.
//!
//! This file holds the type and what it reports about itself; its setup, sending, receiving
//! and closing are in the sibling files.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use crate::cm::link::CmLink;
use crate::cm::{SlotQueue, Slots};
use crate::verbs::OwnedBufferQueuePair;

mod caller_memory;
mod closing;
#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub mod hooks;
mod options;
mod receiving;
mod sending;
mod setup;

use caller_memory::SentRegion;
pub use options::EndpointOptions;

const SEND_BUFFER: usize = 0;
const RECV_BUFFER: usize = 1;

/// The send slots: a region's send holds its attach id, and the region comes back as ready.
type SendSlots = Slots<SentRegion, u64>;
/// The receive slots: one posted in a pool buffer holds its attach id.
type RecvSlots = Slots<Bytes, u64>;

/// A connected RDMA endpoint that exchanges messages (`IBV_WR_SEND` / posted receives).
///
/// Messages keep their boundaries: each `send` arrives as one `recv`. It interoperates with any
/// librdmacm program that exchanges send/receive messages over `RDMA_PS_TCP` (such as
/// `ucmatose`). Dropping the endpoint disconnects.
///
/// # What `Ok` from `send` promises
///
/// That the message was handed to the device, as a socket write's `Ok` does: not that it
/// arrived. Messages still in flight when the endpoint is dropped (or its process ends) may be
/// lost, and the peer's `recv` then ends with an error, not with silence. To close without
/// losing any, call [`Self::disconnect`], which waits until every posted send completed (the
/// peer's device has acknowledged it) before disconnecting; to know the peer's application
/// has a message, have it answer. ([`crate::rdma::RdmaConnection`]'s operations return only
/// once their completion arrived: their `Ok` is the acknowledgement.)
#[derive(Debug)]
pub struct Endpoint {
    // Drop order matters: disconnect, then destroy the queue pair, then free its buffers and CQs.
    link: CmLink,
    qp: OwnedBufferQueuePair,
    /// Slots of the send buffer; a slot is free again when its send completed. A slot that
    /// sends from a caller's region holds its attach id; the region comes back through `ready`.
    send: SlotQueue<SentRegion, u64>,
    /// Receive slots, all posted; what arrived waits in `ready`. A slot posted in a pool
    /// buffer holds its attach id, else it is the slot of the receive buffer with its number.
    recv: SlotQueue<Bytes, u64>,
    /// Where receives land without a copy ([`EndpointOptions::recv_pool`]).
    recv_pool: Option<crate::device::BufferPool>,
    /// Regions of `send_region` calls dropped before their completion: freed when it comes.
    abandoned: std::sync::Mutex<std::collections::HashSet<u64>>,
    max_message_size: usize,
    /// The inline limit the queue pair really got.
    max_inline: usize,
    /// How often a waiting `recv` probes the peer ([`EndpointOptions::keepalive`]).
    keepalive: Option<Duration>,
    /// Every how many sends one asks for a completion ([`crate::reactor::SendOrder::signal`]).
    signal_interval: usize,
    /// Send completions reaped, for the test hook that checks how few sends are signaled.
    #[cfg(rdma_async_hooks)]
    send_completions: std::sync::atomic::AtomicU64,
}

impl Endpoint {
    /// The peer's address.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.link.peer_addr())
    }

    /// The local address of the connection.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.link.local_addr())
    }

    /// Private data the peer sent in the handshake (its accept, or its request), zero-padded by
    /// IB/RoCE to the transport's size.
    pub fn peer_private_data(&self) -> &[u8] {
        self.link.peer_private_data()
    }

    /// The largest message this endpoint sends or receives.
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// The local queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }
}
