//! [`QueueOptions`], the queue options (depths, inline size, busy-poll, keepalive) that
//! `EndpointOptions`, `RdmaOptions`, `RDatagramOptions` and `RStreamOptions` each embed, and
//! [`queue_setters!`], their builder methods, written once with their clamping and the part of
//! their documentation that holds for every transport (`RStreamOptions` keeps rsockets' names
//! and defaults for its setters instead).

use std::time::Duration;

/// The busy-poll window every transport starts with (rsockets' `polling_time` default).
pub(crate) const DEFAULT_BUSY_POLL: Duration = Duration::from_micros(10);

/// The options of a transport's queues and of waiting on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct QueueOptions {
    /// Send-queue work requests in flight.
    pub(crate) send_depth: u32,
    /// Receives kept posted.
    pub(crate) recv_depth: u32,
    /// Bytes a send copies into its work request (`IBV_SEND_INLINE`).
    pub(crate) max_inline: u32,
    /// How long an empty completion queue is polled before the task sleeps.
    pub(crate) busy_poll: Duration,
    /// How often the peer is probed; `None`: never.
    pub(crate) keepalive: Option<Duration>,
}

impl QueueOptions {
    /// Queues this deep, this much inline, the default busy-poll window, no keepalive.
    pub(crate) const fn new(send_depth: u32, recv_depth: u32, max_inline: u32) -> Self {
        QueueOptions {
            send_depth,
            recv_depth,
            max_inline,
            busy_poll: DEFAULT_BUSY_POLL,
            keepalive: None,
        }
    }
}

/// Builder methods for the queue options of a type that embeds [`QueueOptions`] as its field
/// `queue`, in the order listed.
///
/// Each setter is given as the doc lines that only hold for the invoking type, then its name and
/// a `;`; the macro adds the doc lines every transport shares and the body. A type names only
/// the setters it has:
///
/// ```text
/// queue_setters! {
///     /// Sends in flight before `send_to` waits for the device.
///     send_depth;
/// }
/// ```
macro_rules! queue_setters {
    () => {};
    ($(#[$doc:meta])* send_depth; $($rest:tt)*) => {
        $(#[$doc])*
        /// At least 1 (0 is taken as 1).
        pub fn send_depth(mut self, n: u32) -> Self {
            self.queue.send_depth = n.max(1);
            self
        }

        $crate::cm::queue_setters::queue_setters!($($rest)*);
    };
    ($(#[$doc:meta])* recv_depth; $($rest:tt)*) => {
        $(#[$doc])*
        /// At least 1 (0 is taken as 1).
        pub fn recv_depth(mut self, n: u32) -> Self {
            self.queue.recv_depth = n.max(1);
            self
        }

        $crate::cm::queue_setters::queue_setters!($($rest)*);
    };
    ($(#[$doc:meta])* max_inline; $($rest:tt)*) => {
        $(#[$doc])*
        /// Copying inline (`IBV_SEND_INLINE`) spares the device a DMA read of the data: lower
        /// latency for small messages. 0 turns it off.
        pub fn max_inline(mut self, bytes: u32) -> Self {
            self.queue.max_inline = bytes;
            self
        }

        $crate::cm::queue_setters::queue_setters!($($rest)*);
    };
    ($(#[$doc:meta])* busy_poll; $($rest:tt)*) => {
        /// How long an empty completion queue is polled before the task sleeps.
        ///
        $(#[$doc])*
        ///
        /// After two or more windows in a row ended empty, the next waits skip it (1, 3, 7, ...
        /// up to 63 of them), so many connections that each wait longer than the window do not
        /// spin the thread for nothing; a window that finds a completion restores it.
        pub fn busy_poll(mut self, time: std::time::Duration) -> Self {
            self.queue.busy_poll = time;
            self
        }

        $crate::cm::queue_setters::queue_setters!($($rest)*);
    };
    ($(#[$doc:meta])* keepalive; $($rest:tt)*) => {
        /// Probes the peer every `interval` with a 0-byte RDMA write its application never sees
        /// (as rsockets' keepalive).
        $(#[$doc])*
        /// Off by default, as TCP's keepalive is.
        pub fn keepalive(mut self, interval: std::time::Duration) -> Self {
            self.queue.keepalive = Some(interval);
            self
        }

        $crate::cm::queue_setters::queue_setters!($($rest)*);
    };
}
pub(crate) use queue_setters;
