//! The event channel of one rdma_cm id (or of a listener) on Tokio's reactor.

use std::io;
use std::sync::Arc;

use crate::reactor::{FdWaiter, SharedFd};
use crate::verbs::{ChannelFd, CmEvent, EventChannel};

/// Reads the events of one rdma_cm event channel as a future.
///
/// Any number of tasks may wait at once: the reactor wakes all of them, each tries to take an
/// event, and those that find none go back to waiting.
#[derive(Debug)]
pub(crate) struct CmEvents {
    channel: Arc<EventChannel>,
    fd: Arc<SharedFd>,
}

impl CmEvents {
    pub(crate) fn new(channel: Arc<EventChannel>) -> io::Result<Self> {
        Ok(CmEvents {
            fd: SharedFd::register(ChannelFd::new(channel.clone()))?,
            channel,
        })
    }

    pub(crate) fn channel(&self) -> &Arc<EventChannel> {
        &self.channel
    }

    /// A slot for one more task that waits with `poll_*` calls (see [`FdWaiter`]).
    pub(crate) fn waiter(&self) -> FdWaiter {
        self.fd.waiter()
    }

    /// Takes an event if one is queued.
    pub(crate) fn try_next(&self) -> io::Result<Option<CmEvent>> {
        match self.channel.get_event() {
            Ok(event) => Ok(Some(event)),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Waits until the channel's descriptor is readable.
    pub(crate) async fn readable(
        &self,
    ) -> io::Result<tokio::io::unix::AsyncFdReadyGuard<'_, ChannelFd>> {
        self.fd.readable().await
    }

    /// Waits for the next event.
    ///
    /// Cancel safety: an event is only taken from the channel when this returns it.
    pub(crate) async fn next(&self) -> io::Result<CmEvent> {
        loop {
            let mut guard = self.fd.readable().await?;
            match guard.try_io(|_| self.channel.get_event()) {
                Ok(result) => return result,
                Err(_would_block) => continue,
            }
        }
    }
}
