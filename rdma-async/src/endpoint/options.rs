//! [`EndpointOptions`]: message size, queue depths, inline size, busy-poll, dialing and
//! connection parameters of an [`Endpoint`](super::Endpoint).

use std::io;
use std::time::Duration;

use crate::cm::ConnParams;
use crate::cm::handshake::{DialOptions, dial_setters};
use crate::device::BufferPool;
use crate::error;

/// Sizes and timeouts of an [`Endpoint`](super::Endpoint).
#[derive(Debug, Clone)]
pub struct EndpointOptions {
    pub(super) max_message_size: usize,
    pub(super) send_depth: u32,
    pub(super) recv_depth: u32,
    pub(super) max_inline: u32,
    pub(super) busy_poll: Duration,
    pub(super) keepalive: Option<Duration>,
    pub(super) dial: DialOptions,
    pub(super) params: ConnParams,
    pub(super) recv_pool: Option<BufferPool>,
}

impl Default for EndpointOptions {
    fn default() -> Self {
        EndpointOptions {
            max_message_size: 4096,
            send_depth: 16,
            recv_depth: 16,
            max_inline: 64,
            busy_poll: Duration::from_micros(10),
            keepalive: None,
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

    /// Sends in flight before `send` waits for completions. Only some sends ask the device for
    /// a completion: every `n / 4`-th (every one below 8, at most every 16th), the one that takes
    /// the last free slot, and a `send_region`'s. Sends complete in order, so one completion
    /// gives back the slots of every send before it; a failed send is always reported.
    pub fn send_depth(mut self, n: u32) -> Self {
        self.send_depth = n.max(1);
        self
    }

    /// Receive buffers kept posted: messages that can arrive before `recv` is called. A peer
    /// that sends more than this ahead of the receiver's `recv` calls is held back by the
    /// transport (an RNR NAK, then a resend after [`ConnParams::min_rnr_timer`]); a receiver
    /// that expects bursts keeps a deeper queue.
    pub fn recv_depth(mut self, n: u32) -> Self {
        self.recv_depth = n.max(1);
        self
    }

    /// Messages up to this size are copied into the work request itself.
    pub fn max_inline(mut self, bytes: u32) -> Self {
        self.max_inline = bytes;
        self
    }

    /// How long an empty completion queue is polled before the task sleeps.
    ///
    /// Adaptive, between `time` and 8 × `time`: a completion that arrives soon after a window
    /// ended empty stretches the window to catch the next one like it (a round trip longer than
    /// `time` is spun through, not slept through), and one later than 8 × `time` sets it back.
    /// After two or more windows in a row ended empty, the next waits skip it (1, 3, 7, ... up
    /// to 63 of them), so many connections that each wait longer than the window do not spin
    /// the thread for nothing; a window that finds a completion restores it.
    pub fn busy_poll(mut self, time: Duration) -> Self {
        self.busy_poll = time;
        self
    }

    /// While a [`recv`](super::Endpoint::recv) waits, probes the peer every `interval` with a
    /// 0-byte RDMA write its application never sees (as rsockets' keepalive), so a peer host
    /// that vanished ends the wait with `TimedOut` after about `interval` + the transport's
    /// retries instead of never. Off by default, as TCP's keepalive is.
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.keepalive = Some(interval);
        self
    }

    dial_setters!();

    /// Connection parameters (private data, retry counts, ...) for connect or accept.
    pub fn conn_params(mut self, params: ConnParams) -> Self {
        self.params = params;
        self
    }

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
            || slot_bytes(self.send_depth).is_none()
            || slot_bytes(self.recv_depth).is_none()
        {
            return Err(error::invalid_input("endpoint buffer sizes overflow"));
        }
        Ok(())
    }
}
