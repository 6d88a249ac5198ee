//! [`EndpointOptions`]: message size, queue depths, inline size, busy-poll, dialing and
//! connection parameters of an [`Endpoint`](super::Endpoint).

use std::io;

use crate::cm::ConnParams;
use crate::cm::handshake::{DialOptions, dial_setters};
use crate::cm::queue_setters::{QueueOptions, queue_setters};
use crate::device::BufferPool;
use crate::error;

/// Sizes and timeouts of an [`Endpoint`](super::Endpoint).
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    pub(super) max_message_size: usize,
    pub(super) queue: QueueOptions,
    pub(super) dial: DialOptions,
    pub(super) params: ConnParams,
    pub(super) recv_pool: Option<BufferPool>,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            max_message_size: 4096,
            queue: QueueOptions::new(16, 16, 64),
            dial: DialOptions::default(),
            params: ConnParams::default(),
            recv_pool: None,
        }
    }
}

impl EndpointOptions {
    /// The defaults: 4 KiB messages, 16 sends and 16 receives in flight, 64 bytes inline,
    /// 10 µs busy-poll (as rsockets), 2 s address and route resolution timeouts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Largest message either way; the peer must accept messages this large.
    pub fn max_message_size(mut self, bytes: usize) -> Self {
        self.max_message_size = bytes.max(1);
        self
    }

    queue_setters! {
        /// Sends in flight before `send` waits for completions. Only some sends ask the device
        /// for a completion: every `n / 4`-th (every one below 8, at most every 16th), the one
        /// that takes the last free slot, and a `send_region`'s. Sends complete in order, so one
        /// completion gives back the slots of every send before it; a failed send is always
        /// reported.
        send_depth;
        /// Receive buffers kept posted: messages that can arrive before `recv` is called. A peer
        /// that sends more than this ahead of the receiver's `recv` calls is held back by the
        /// transport (an RNR NAK, then a resend after [`ConnParams::min_rnr_timer`]); a receiver
        /// that expects bursts keeps a deeper queue.
        recv_depth;
        /// Messages of up to `bytes` are copied into the work request itself when posted.
        max_inline;
        /// Adaptive, between `time` and 8 × `time`: a completion that arrives soon after a window
        /// ended empty stretches the window to catch the next one like it (a round trip longer
        /// than `time` is spun through, not slept through), and one later than 8 × `time` sets
        /// it back.
        busy_poll;
        /// The probes go out while a [`recv`](super::Endpoint::recv) waits, so a peer host that
        /// vanished ends the wait with `TimedOut` after about `interval` + the transport's
        /// retries instead of never.
        keepalive;
    }

    dial_setters!(conn_params);

    /// Receives land in buffers of `pool` and [`Endpoint::recv`](super::Endpoint::recv) hands
    /// them out as `Bytes` without a copy; dropping the `Bytes` returns the buffer to the pool.
    /// While the pool has no free buffer (the application holds them all), a receive is posted
    /// in the endpoint's own memory and copied out, as without a pool, so the peer never waits
    /// for the application to let go. The pool must be in the endpoint's device context and
    /// have a class of at least `max_message_size` bytes.
    pub fn recv_pool(mut self, pool: BufferPool) -> Self {
        self.recv_pool = Some(pool);
        self
    }

    pub(super) fn check(&self) -> io::Result<()> {
        if let Some(pool) = &self.recv_pool
            && pool
                .size_classes()
                .last()
                .is_none_or(|&largest| largest < self.max_message_size)
        {
            return Err(error::invalid_input(format!(
                "the receive pool's largest buffers ({:?}) are smaller than max_message_size \
                 ({})",
                pool.size_classes().last(),
                self.max_message_size
            )));
        }
        let slot_bytes = |depth: u32| self.max_message_size.checked_mul(depth as usize);
        if u32::try_from(self.max_message_size).is_err()
            || slot_bytes(self.queue.send_depth).is_none()
            || slot_bytes(self.queue.recv_depth).is_none()
        {
            return Err(error::invalid_input("endpoint buffer sizes overflow"));
        }
        Ok(())
    }
}
