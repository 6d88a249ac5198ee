//! Ending an [`RdmaConnection`]: disconnecting, closing (draining its queue pair), waiting for
//! the close, and what dropping it does. The shape is `Endpoint`'s: `disconnect(&self)` is
//! async (like `AsyncWriteExt::shutdown`), `close(self)` is async and returns once everything is
//! released, and dropping closes in the background.

use std::io;

use super::RdmaConnection;

impl RdmaConnection {
    /// Disconnects: operations still outstanding complete as flushed (`BrokenPipe` /
    /// `ConnectionReset`), later ones fail with `BrokenPipe`, and the peer's operations fail.
    /// Like closing a socket, this does not wait for the peer ([`Self::closed`] does). Memory
    /// stays registered until the connection is dropped.
    ///
    /// Async, as [`Endpoint::disconnect`](crate::endpoint::Endpoint::disconnect) is, but with
    /// nothing to wait for: an endpoint's `send` returns once the message is posted, so its
    /// disconnect lets posted messages complete first; every operation here returns only once
    /// it completed, so one still outstanding is one whose caller is still waiting (or gave up),
    /// and no result already returned is lost.
    ///
    /// # Errors
    ///
    /// The OS error of `rdma_disconnect`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the disconnect happens on the first poll.
    pub async fn disconnect(&self) -> io::Result<()> {
        self.shared.link.disconnect()
    }

    /// Disconnects, waits until every outstanding operation completed or was flushed, and frees
    /// the queue pair and the memory of those operations. (Dropping the connection does the same
    /// in the background.) A failure to disconnect is not reported, as on drop: call
    /// [`Self::disconnect`] first to see it.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the rest of the close happens in the background.
    pub async fn close(mut self) {
        let _ = self.shared.link.disconnect();
        self.shared.begin_close();
        if let Some(completion_task) = self.completion_task.take() {
            // The task only ends; a panic in it would be a bug reported by the runtime.
            let _ = completion_task.await;
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
        self.shared.link.closed().await
    }
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        let _ = self.shared.link.disconnect();
        self.shared.begin_close();
    }
}
