//! One waiting task's registration for a completion queue's events, whether the queue has a
//! channel of its own ([`FdWaiter`]) or reports to a shared one ([`RoutedWaiter`]).

use std::io;
use std::task::{Context, Poll, ready};

use super::fd_waiter::FdWaiter;
use super::routed_channel::RoutedWaiter;
use crate::verbs::CompletionQueue;

/// A task's registration for a queue's events.
#[derive(Debug)]
pub(crate) enum CqWaiter {
    /// On the queue's own channel: the task reads the channel itself.
    Own(FdWaiter),
    /// On a shared channel, whose dispatcher routes the queue's events here.
    Routed(RoutedWaiter),
}

/// What a waiter found when it looked for its queue's event.
#[derive(Debug)]
pub(crate) enum ChannelRead {
    /// The event of the outstanding arm was taken (and counted for acking).
    Event,
    /// None is there (another waiter took it).
    Empty,
    /// Reading the channel failed.
    Failed(io::Error),
}

impl CqWaiter {
    /// Waits until an event of `cq` may be there and takes it.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` when the runtime the registration was made on is gone.
    pub(crate) fn poll_event(
        &self,
        cq: &CompletionQueue,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<ChannelRead>> {
        match self {
            CqWaiter::Own(waiter) => {
                let mut guard = ready!(waiter.poll_readable(cx))?;
                // Events are read from the channel itself; any waiter's registration reports
                // them.
                Poll::Ready(Ok(
                    match guard.try_io(|_| cq.channel().get_event().map(|_| ())) {
                        Ok(Ok(())) => {
                            // One arm raises one event, and the next arm comes after this
                            // read, so the channel is now empty; a later event is a new edge
                            // for the reactor.
                            cq.count_event();
                            guard.clear_ready();
                            ChannelRead::Event
                        }
                        Ok(Err(e)) => ChannelRead::Failed(e),
                        // try_io cleared this waiter's readiness: another waiter read the event.
                        Err(_would_block) => ChannelRead::Empty,
                    },
                ))
            }
            CqWaiter::Routed(waiter) => waiter.poll_event(cx),
        }
    }
}
