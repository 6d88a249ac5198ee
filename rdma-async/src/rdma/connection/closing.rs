//! Ending an [`RdmaConnection`]: disconnecting, closing (draining its queue pair), waiting for
//! the close, and what dropping it does.

use std::io;

use super::RdmaConnection;

impl RdmaConnection {
    /// Disconnects: outstanding operations complete as flushed (`BrokenPipe`/`ConnectionReset`)
    /// and the peer's operations fail. Memory stays registered until dropped.
    ///
    /// # Errors
    ///
    /// The OS error of `rdma_disconnect`.
    pub fn disconnect(&self) -> io::Result<()> {
        self.shared.link.disconnect()
    }

    /// Disconnects, waits until every outstanding operation completed or was flushed, and frees
    /// the queue pair and the memory of those operations. (Dropping the connection does the same
    /// in the background.)
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
