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
                let take = || take_event(cq);
                Poll::Ready(Ok(ChannelRead::from(ready!(waiter.poll_take(cx, take))?)))
            }
            CqWaiter::Routed(waiter) => waiter.poll_event(cx),
        }
    }

    /// Takes an event of `cq` if the reactor has seen one come (or, on a shared channel, its
    /// dispatcher routed one here), without registering a task: a look outside a wait.
    pub(crate) fn try_event(&self, cq: &CompletionQueue) -> ChannelRead {
        match self {
            CqWaiter::Own(waiter) => ChannelRead::from(waiter.try_take(|| take_event(cq))),
            CqWaiter::Routed(waiter) => waiter.try_event(),
        }
    }
}

/// Reads one event of `cq` from its own channel (non-blocking) and counts it for acking.
fn take_event(cq: &CompletionQueue) -> io::Result<()> {
    cq.channel().get_event()?;
    cq.count_event();
    Ok(())
}

impl From<io::Result<bool>> for ChannelRead {
    /// What a take from the channel ([`FdWaiter::try_take`]) found.
    fn from(took: io::Result<bool>) -> Self {
        match took {
            Ok(true) => ChannelRead::Event,
            Ok(false) => ChannelRead::Empty,
            Err(e) => ChannelRead::Failed(e),
        }
    }
}
