//! Closing an [`Endpoint`]: the orderly disconnect that lets posted sends complete first,
//! closing, and waiting for the close. The shape is `RdmaConnection`'s: `disconnect(&self)` is
//! async (an orderly close of the sending side, like `AsyncWriteExt::shutdown`), `close(self)`
//! is async and returns once everything is released, and dropping disconnects at once.

use std::io;

use super::sending::empty_write;
use super::{Endpoint, SendSlots};
use crate::verbs::WorkCompletion;

impl Endpoint {
    /// Waits for posted sends to complete, then disconnects: the peer's receives end with
    /// `ConnectionReset` after the messages sent before. Like closing a socket, this does not wait
    /// for the peer: rdma_cm confirms the disconnect only once the peer's application handles
    /// it, which [`Self::closed`] waits for. Further sends fail with `BrokenPipe`; messages
    /// already received can still be read.
    ///
    /// # Errors
    ///
    /// The OS error of `rdma_disconnect`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped while sends are still completing, no disconnect was started (and
    /// dropping the endpoint disconnects at once).
    pub async fn disconnect(&self) -> io::Result<()> {
        self.flush_sends().await;
        self.link.disconnect()
    }

    /// Waits until every posted send completed (or failed), so an orderly disconnect does not
    /// flush messages the peer was about to receive. Sends posted after the last signaled one
    /// complete with no word: a signaled empty write behind them ([`empty_write`]) reports them.
    async fn flush_sends(&self) {
        let mut slots = self.send.lock().await;
        while slots.free.len() < slots.depth() && !self.send.error().is_set() {
            if self.link.is_disconnected() {
                return;
            }
            // With no slot free the last send took the last one, and was signaled.
            if slots.order.ends_unsignaled()
                && let Some(slot) = slots.free.pop()
                && self
                    .post_send(&mut slots, slot, empty_write(slot), true)
                    .is_err()
            {
                return;
            }
            let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
            if self
                .send
                .reap_next(&mut slots, Some(&self.link), reap)
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Disconnects in order ([`Self::disconnect`]), then frees the queue pair and the memory of
    /// the endpoint. A failure to disconnect is not reported, as on drop: call
    /// [`Self::disconnect`] first to see it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the endpoint, which disconnects at once.
    pub async fn close(self) {
        if let Err(e) = self.disconnect().await {
            tracing::debug!(error = %e, "disconnect failed while closing");
        }
    }

    /// Waits until the connection is closed by either side.
    ///
    /// # Errors
    ///
    /// The OS error of reading the event channel.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn closed(&self) -> io::Result<()> {
        self.link.closed().await
    }
}
