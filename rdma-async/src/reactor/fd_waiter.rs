//! Waiting for a channel descriptor to become readable, once per waiting side.
//!
//! Tokio's `AsyncFd::poll_read_ready` keeps only the most recent waker, so two tasks that wait
//! on one descriptor (a stream's reader and writer) would steal each other's wake-ups; a
//! cancelled write future could then leave the reader asleep for ever. Each side therefore gets
//! its own registration, on a duplicate of the descriptor: epoll reports readiness to both.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::task::{Context, Poll};

use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use crate::verbs;

/// One side's registration of a channel descriptor with the reactor.
#[derive(Debug)]
pub(crate) struct FdWaiter {
    fd: AsyncFd<OwnedFd>,
}

impl FdWaiter {
    /// Registers a duplicate of `channel`'s descriptor.
    pub(crate) fn new(channel: &impl AsFd) -> io::Result<Self> {
        let dup = channel.as_fd().try_clone_to_owned()?;
        Ok(FdWaiter {
            fd: verbs::register_readable(dup)?,
        })
    }

    /// Waits until the descriptor is readable. Callers drain the channel through its owner
    /// and clear the readiness with the guard once the channel reports `WouldBlock`.
    ///
    /// The registration belongs to the runtime it was made on: once that runtime is shut
    /// down, this fails (`ConnectionAborted`, saying so) on any runtime.
    pub(crate) fn poll_readable(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<AsyncFdReadyGuard<'_, OwnedFd>>> {
        // The reactor's only error: its driver is gone (Tokio's own message does not say
        // which runtime, or what to do).
        self.fd.poll_read_ready(cx).map_err(|e| {
            io::Error::new(
                io::ErrorKind::ConnectionAborted,
                format!(
                    "the Tokio runtime this object was created on was shut down, and with it the \
                     reactor that watches its completions; create connections and sockets on a \
                     runtime that outlives them ({e})"
                ),
            )
        })
    }
}
