//! Waiting for "a completion or a disconnect", the one wait every connected transport makes.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll};

use super::CmWatch;
use super::link::CmLink;
use crate::reactor::{AsyncCq, BeforeSleep, CqWaiter, WaitHints};
use crate::verbs::CompletionBatch;

/// What ended a wait.
#[derive(Debug)]
pub(crate) enum Woken {
    /// Completions were copied out (how many, or why polling failed).
    Completions(io::Result<usize>),
    /// rdma_cm reported the connection closed (or reading its channel failed).
    Closed(io::Result<()>),
}

/// One waiting task's registrations: on a completion queue's channel and, for a connection, on
/// its rdma_cm channel. Each task that may wait needs its own (see [`CqWaiter`]).
#[derive(Debug)]
pub(crate) struct ConnWaiter {
    cq: CqWaiter,
    cm: Option<CmWatch>,
}

impl ConnWaiter {
    /// Registers for `cq`'s completions and, with `link`, for its disconnect.
    pub(crate) fn new(cq: &AsyncCq, link: Option<&CmLink>) -> io::Result<Self> {
        Ok(ConnWaiter {
            cq: cq.waiter()?,
            cm: link.map(CmWatch::new).transpose()?,
        })
    }

    /// The watch on the rdma_cm channel, if this waiter watches a connection.
    pub(crate) fn cm(&self) -> Option<&CmWatch> {
        self.cm.as_ref()
    }

    /// Waits until `cq` has completions (copied into `out`) or, when `link` is given, rdma_cm
    /// reports it closed. Completions come first: what completed before a disconnect is
    /// handled before the disconnect is. `link` must be the connection this waiter was made for;
    /// passing `None` stops watching it (once its close was handled).
    ///
    /// `hints` say what the caller knows ([`WaitHints`]).
    ///
    /// Cancel safety: completions are taken only when returned; CM events read are recorded.
    pub(crate) fn poll_wait<const N: usize>(
        &self,
        cq: &AsyncCq,
        link: Option<&CmLink>,
        cx: &mut Context<'_>,
        out: &mut CompletionBatch<N>,
        hints: WaitHints<'_>,
    ) -> Poll<Woken> {
        // A wait that returns `Pending` without sleeping (a yield, Tokio's budget spent) is
        // polled again at once: only one that sleeps needs rdma_cm to wake it.
        let slept = Cell::new(false);
        let register = || {
            slept.set(true);
            if let Some(BeforeSleep(register)) = hints.before_sleep {
                register();
            }
        };
        let hints = WaitHints {
            before_sleep: Some(BeforeSleep(&register)),
            ..hints
        };
        if let Poll::Ready(polled) = cq.poll_completions(&self.cq, cx, out, hints) {
            return Poll::Ready(Woken::Completions(polled));
        }
        if !slept.get() {
            return Poll::Pending;
        }
        match (link, &self.cm) {
            (Some(link), Some(cm)) => cm.poll_disconnected(link, cx).map(Woken::Closed),
            _ => Poll::Pending,
        }
    }

    /// Takes the event that woke a wait, before the first look after it; whether it did:
    /// [`AsyncCq::take_wake_event`].
    ///
    /// # Errors
    ///
    /// Reading the completion channel failed.
    pub(crate) fn take_wake_event(&self, cq: &AsyncCq) -> io::Result<bool> {
        cq.take_wake_event(&self.cq)
    }

    /// Waits as [`Self::poll_wait`].
    pub(crate) async fn wait<const N: usize>(
        &self,
        cq: &AsyncCq,
        link: Option<&CmLink>,
        out: &mut CompletionBatch<N>,
    ) -> Woken {
        poll_fn(|cx| self.poll_wait(cq, link, cx, out, WaitHints::default())).await
    }
}
