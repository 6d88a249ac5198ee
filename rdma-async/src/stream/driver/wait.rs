//! Waiting: sleeping until a completion or a CM event may have changed the state, and
//! readiness for either side.

use std::cell::Cell;
use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, ready};

use tokio::task::coop;

use crate::cm::Woken;
use crate::proto::{ReadStatus, WriteBlocked, WriteError};
use crate::reactor::{BeforeSleep, WaitHints};
use crate::stream::deadline_timer;
use crate::stream::side_wakers::{Polling, Reading, Waiter};
use crate::verbs::CompletionBatch;

use super::device::SideWait;
use super::{BATCH, CoreState, Side, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Sleeps until a completion or a CM event may have changed the state (`Ready(Ok)`: look
    /// again), or registers `cx` as `waiter` on `side` to be woken (`Pending`).
    pub(super) fn wait(
        &self,
        state: &mut CoreState,
        side: Side,
        cx: &mut Context<'_>,
        waiter: Waiter<'_, '_>,
    ) -> Poll<io::Result<()>> {
        self.wait_as(state, side, cx, waiter, false)
    }

    /// [`Self::wait`] for a poll function on the reading side with nothing readable: a sleep
    /// marks the side blocked, so that the next call returns `Pending` at once unless something
    /// woke the side since ([`Self::still_unreadable`]).
    pub(super) fn wait_unreadable(
        &self,
        state: &mut CoreState,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        debug_assert_eq!(state.conn.read_status(), ReadStatus::Blocked);
        self.wait_as(state, Side::Read, cx, Waiter::Poll, true)
    }

    /// Whether nothing has become readable since a poll function's wait for it went to sleep,
    /// nor anything woken the reading side: the poll function called again with `cx` then
    /// returns `Pending` without a look (registered to be woken as its sleep was).
    ///
    /// No completion can have been missed: that sleep left the queue armed (or slept under an
    /// outstanding arm) and registered the side with the channel's readiness (and rdma_cm's), and
    /// everything that changes the reading side (completions handled by either side, the arm's
    /// event, a disconnect, a failure) wakes it, which clears the mark. A sleep marks the side
    /// before it arms and registers
    /// ([`SideWakers::register_blocked`](crate::stream::side_wakers::SideWakers::register_blocked)).
    pub(super) fn still_unreadable(&self, cx: &Context<'_>) -> bool {
        self.wakers[Side::Read as usize].still_blocked(cx.waker())
    }

    /// [`Self::wait`]; with `mark_blocked`, a sleep marks the side blocked (a poll function
    /// on the reading side, with nothing readable).
    fn wait_as(
        &self,
        state: &mut CoreState,
        side: Side,
        cx: &mut Context<'_>,
        waiter: Waiter<'_, '_>,
        mark_blocked: bool,
    ) -> Poll<io::Result<()>> {
        let reading = waiter.reading_on(side);
        let task = cx.waker();
        let wakers = &self.wakers[side as usize];
        // Registered only once the wait is about to sleep: a wait that finds completions or
        // yields is polled again without it.
        let waiter = Cell::new(Some(waiter));
        let register = || {
            if let Some(waiter) = waiter.take() {
                if mark_blocked {
                    wakers.register_blocked(task);
                } else {
                    wakers.register(waiter, task);
                }
            }
        };
        // The registration wakes every waiter of the side, not only this task.
        let mut side_cx = Context::from_waker(&self.side_wakers[side as usize]);
        let mut batch = CompletionBatch::<BATCH>::new();
        // Every caller looks at the queue (`pump`, or the batch of an earlier wait) before it
        // waits, so the wait need not look again before spinning or arming; both sides wait
        // under this lock, so neither needs to look again under an arm made earlier after a
        // look that found the queue empty.
        let hints = WaitHints {
            lock_waiters: Some(self.state.waiters()),
            just_polled: true,
            exclusive: state.queue_empty,
            yields: Some(&state.yields),
            task: Some(task),
            before_sleep: Some(BeforeSleep(&register)),
        };
        let wait = SideWait {
            side,
            cx: &mut side_cx,
            hints,
        };
        let polled = self.device.poll_wait(wait, &mut batch);
        // A wait that returns nothing ended with a look that found nothing, or needed none
        // (or ran out of budget before looking: this hold of the lock ends here).
        state.queue_empty = match &polled {
            Poll::Pending => true,
            Poll::Ready(Woken::Completions(Ok(n))) => *n < BATCH,
            Poll::Ready(_) => false,
        };
        let registered = waiter.take().is_none();
        let polled = match polled {
            // Slept (a wait that yields or runs out of budget registers nothing).
            Poll::Pending => {
                if registered {
                    state.slept = true;
                    if side == Side::Read && std::mem::take(&mut state.took_bytes) {
                        state.reads_until_empty = true;
                    }
                }
                return Poll::Pending;
            }
            Poll::Ready(woken) => woken,
        };
        if mark_blocked && registered {
            // Woke before sleeping (found completions after registering, or the connection
            // closed): the side is not as the mark says.
            wakers.unmark_blocked();
        }
        match polled {
            Woken::Completions(Ok(_)) => {
                let reader = (reading != Reading::No).then_some(Polling {
                    waker: task,
                    reading,
                });
                Poll::Ready(self.handle(state, batch.as_slice(), reader))
            }
            Woken::Completions(Err(e)) | Woken::Closed(Err(e)) => Poll::Ready(Err(e)),
            // Not an orderly close: readers get the removal, never EOF.
            Woken::Closed(Ok(())) if self.device.is_device_removed() => {
                let err = self.fatal(state, self.device.closed_error(false));
                self.wake_all();
                Poll::Ready(Err(err))
            }
            Woken::Closed(Ok(())) if !state.conn.is_disconnected() => {
                tracing::debug!(parent: self.device.span(), "stream disconnected by rdma_cm");
                // Whatever the peer sent before it disconnected is in the queue by now: handle
                // all of it first, or a read could see end-of-stream ahead of the last bytes.
                self.drain(state)?;
                state.conn.handle_disconnected();
                self.wake_all();
                Poll::Ready(Ok(()))
            }
            // Already disconnected and still blocked: nothing more will arrive.
            Woken::Closed(Ok(())) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("connection closed by {}", self.device.peer_addr()),
            ))),
        }
    }

    /// [`Self::wait`] for a writer blocked on the peer's credits or ring space, probing the
    /// peer meanwhile (the protocol's write probe, `proto::timers`): a dead peer then fails the
    /// probe and the writer. `blocked`: why nothing can be written, counted in the stats once
    /// per wait (`None`: the writer waits for something else, an attached buffer's return).
    pub(super) fn wait_to_write(
        &self,
        state: &mut CoreState,
        cx: &mut Context<'_>,
        waiter: Waiter<'_, '_>,
        blocked: Option<WriteBlocked>,
    ) -> Poll<io::Result<()>> {
        // A wait yields and is polled again; only its first poll counts.
        if state.conn.writer_blocked(deadline_timer::now())
            && let Some(reason) = blocked
        {
            state.stats.count_writer_wait(reason);
        }
        // The timer wakes every writer, so whichever polls next handles the deadline.
        let mut side_cx = Context::from_waker(&self.side_wakers[Side::Write as usize]);
        self.handle_timeouts(state, Some(&mut side_cx))?;
        self.wait(state, Side::Write, cx, waiter)
    }

    /// Waits until a read would not block (data, EOF or an error). Only the waker of the most
    /// recent call on the reading side (this or `poll_read`) is woken.
    pub(in crate::stream) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Side::Read, cx, Waiter::Poll)
    }

    /// Waits until a write would not block (room to send, or an error to report). Only the
    /// waker of the most recent call on the writing side is woken.
    pub(in crate::stream) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Side::Write, cx, Waiter::Poll)
    }

    /// Waits until `side` would not block; every task awaiting this at once is woken.
    pub(in crate::stream) async fn ready(&self, side: Side) -> io::Result<()> {
        let mut registration = self.wakers[side as usize].registration();
        poll_fn(|cx| {
            let coop = ready!(coop::poll_proceed(cx));
            let result = ready!(self.poll_ready(side, cx, Waiter::Future(&mut registration)));
            coop.made_progress();
            Poll::Ready(result)
        })
        .await
    }

    pub(super) fn poll_ready(
        &self,
        side: Side,
        cx: &mut Context<'_>,
        mut waiter: Waiter<'_, '_>,
    ) -> Poll<io::Result<()>> {
        if side == Side::Read && matches!(waiter, Waiter::Poll) && self.still_unreadable(cx) {
            return Poll::Pending;
        }
        let mut state = self.lock();
        loop {
            ready!(self.pump(&mut state, Some(&mut *cx), waiter.reading_on(side)))?;
            let waiter = waiter.reborrow();
            match side {
                Side::Read if state.conn.read_status() == ReadStatus::Blocked => {
                    if matches!(waiter, Waiter::Poll) {
                        ready!(self.wait_unreadable(&mut state, cx))?;
                    } else {
                        ready!(self.wait(&mut state, side, cx, waiter))?;
                    }
                }
                Side::Write => match state.conn.write_readiness() {
                    Err(WriteError::Blocked(reason)) => {
                        ready!(self.wait_to_write(&mut state, cx, waiter, Some(reason)))?;
                    }
                    _ => {
                        state.conn.writer_unblocked();
                        return Poll::Ready(Ok(()));
                    }
                },
                Side::Read => return Poll::Ready(Ok(())),
            }
        }
    }
}
