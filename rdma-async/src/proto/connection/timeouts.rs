//! Time as an input to the connection (see `proto::timers`): the driver arms one timer for
//! [`Connection::poll_timeout`] and calls [`Connection::handle_timeout`] when it fires.

use std::time::{Duration, Instant};

use super::Connection;
use crate::proto::timers::Expired;

impl Connection {
    /// A writer is about to wait, at `now` (for credits, ring space or an attached buffer). Returns
    /// whether this starts a wait (a writer polled again with no progress in between is still
    /// in the same one); the write probe then runs until the writer makes progress.
    pub(crate) fn writer_blocked(&mut self, now: Instant) -> bool {
        self.timers.writer_blocked(now)
    }

    /// The writer can go on (the driver found the connection writable): no probe until it
    /// waits again. Planning a chunk does this too.
    pub(crate) fn writer_unblocked(&mut self) {
        self.timers.writer_unblocked();
    }

    /// Sends rsockets' keepalive every `interval` from `now` on.
    pub(crate) fn set_keepalive(&mut self, interval: Duration, now: Instant) {
        self.timers.set_keepalive(interval, now);
    }

    /// When [`Self::handle_timeout`] is next due; `None` once nothing will be (the connection
    /// is not connected, or nothing waits and no keepalive is set).
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if !self.state.connected {
            return None;
        }
        self.timers.next()
    }

    /// Handles the deadlines due at `now`: a probe of a blocked writer, or the keepalive, each
    /// queues rsockets' keepalive write (then `poll_control` has it). Returns what fired.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Expired {
        let expired = self.timers.expire(now);
        if expired.any() {
            self.queue_keepalive();
        }
        expired
    }
}
