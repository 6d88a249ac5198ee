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
                // Events are read from the channel itself; any waiter's registration reports
                // them. One arm raises one event, and the next arm comes after this read, so
                // the channel holds at most one.
                let take = || {
                    cq.channel().get_event()?;
                    cq.count_event();
                    Ok(())
                };
                Poll::Ready(Ok(match ready!(waiter.poll_take(cx, take))? {
                    Ok(true) => ChannelRead::Event,
                    Ok(false) => ChannelRead::Empty,
                    Err(e) => ChannelRead::Failed(e),
                }))
            }
            CqWaiter::Routed(waiter) => waiter.poll_event(cx),
        }
    }
}
