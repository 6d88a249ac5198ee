//! Queue sizes, handshake parameters and rdma_cm options of an [`super::RdmaConnection`].

use std::io;

use crate::cm::ConnParams;
use crate::cm::handshake::{DialOptions, dial_setters};
use crate::cm::queue_setters::{QueueOptions, queue_setters};
use crate::error;
use crate::verbs::MAX_SEGMENTS;

use super::srq::SharedReceiveQueue;

/// Options of [`super::RdmaConnection::connect`] and [`super::RdmaConnection::accept`].
#[derive(Debug, Clone)]
pub struct RdmaOptions {
    pub(crate) queue: QueueOptions,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) dial: DialOptions,
    pub(crate) params: ConnParams,
    pub(crate) srq: Option<SharedReceiveQueue>,
}

impl Default for RdmaOptions {
    fn default() -> Self {
        RdmaOptions {
            queue: QueueOptions::new(64, 64, 64),
            max_send_sge: 4,
            max_recv_sge: 4,
            dial: DialOptions::default(),
            params: ConnParams::new()
                .responder_resources(16)
                .initiator_depth(16),
            srq: None,
        }
    }
}

impl RdmaOptions {
    /// The defaults: 64 send-queue and 64 receive operations in flight, 4 scatter/gather
    /// segments each, sends and writes of up to 64 bytes inline, 16 RDMA reads/atomics outstanding each way (capped by the peer and the
    /// device), 10 µs busy-poll, 2 s resolution timeouts.
    pub fn new() -> Self {
        Self::default()
    }

    queue_setters! {
        /// Sends, writes, reads and atomics in flight at once; one more waits for a slot.
        send_depth;
        /// Receives posted at once; one more waits for a slot.
        recv_depth;
    }

    /// Segments of a vectored send, write or read (at most 16; the device may cap it lower).
    pub fn max_send_sge(mut self, n: u32) -> Self {
        self.max_send_sge = n.clamp(1, MAX_SEGMENTS as u32);
        self
    }

    /// Segments of a vectored receive (at most 16).
    pub fn max_recv_sge(mut self, n: u32) -> Self {
        self.max_recv_sge = n.clamp(1, MAX_SEGMENTS as u32);
        self
    }

    queue_setters! {
        /// Sends and writes of up to `bytes` (in all their segments) are copied into the work
        /// request when posted; the region is still the operation's until it completes. The
        /// device may grant less
        /// ([`RdmaConnection::max_inline`](super::RdmaConnection::max_inline) says what it got).
        max_inline;
        /// An operation that is the only one outstanding on its queue (send or receive) polls
        /// for its own completion for this long after posting, and wakes no other task when it
        /// comes in time; as `RStream`'s and `Endpoint`'s, that window grows (up to 8 times) when
        /// completions keep arriving just after it. With others outstanding, an operation parks
        /// at once and the connection's own task polls the queue and wakes it; that task spins
        /// for this long, not more (spinning longer there keeps a CPU busy without waking anyone
        /// sooner).
        busy_poll;
        /// A peer host that vanished then fails the connection, and every pending operation
        /// (receives included) ends with `TimedOut`, after about `interval` + the transport's
        /// retries.
        keepalive;
    }

    dial_setters!(conn_params);

    /// Receive through `srq` (shared with other connections) instead of the connection's own
    /// receive queue; [`super::RdmaConnection::recv`] then fails with `InvalidInput`. The
    /// connection's memory is registered in the queue's protection domain.
    pub fn shared_receive_queue(mut self, srq: &SharedReceiveQueue) -> Self {
        self.srq = Some(srq.clone());
        self
    }

    pub(crate) fn check(&self) -> io::Result<()> {
        self.queue
            .send_depth
            .checked_add(self.queue.recv_depth)
            .filter(|n| *n <= 1 << 20)
            .ok_or_else(|| error::invalid_input("queue depths are too large"))?;
        Ok(())
    }
}
