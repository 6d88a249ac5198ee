//! An operation's post and its wait for the completion ([`post_and_wait`]): the queue slot,
//! when the doorbell rings ([`Ring`]), polling for its own completion while it is alone on its
//! queue, and the claim on its table slot that a dropped operation leaves behind.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use tokio::task::coop;

use super::conn_shared::ConnShared;
use crate::rdma::queue_slots::QueueSlots;
use crate::reactor::run_ready_tasks;
use crate::verbs::{Held, InFlightTable, Ticket, WorkCompletion, WorkQueue};

/// For the arm that cannot be reached: [`post_and_wait`] gives back exactly the buffers it was
/// given (the in-flight table returns a slot's own contents), so no peer, device or input can
/// make an operation lose its buffer.
pub(in crate::rdma) fn lost_buffer<T>() -> T {
    unreachable!("the in-flight table gave back other buffers than it was given")
}

/// A connection's operation, which polls for its own completion while it is alone on its queue
/// and otherwise counts as unattended while it waits ([`crate::rdma::reaping`]).
#[derive(Clone, Copy)]
pub(in crate::rdma) struct Reaper<'a> {
    pub(super) shared: &'a ConnShared,
    pub(super) queue: WorkQueue,
}

/// When a posted request's doorbell rings (`ibv_post_send`), which hands it to the device.
///
/// An operation alone on the send queue posts at once. One posted while others are outstanding
/// leaves its request in the queue pair's deferred chain, and the first of a chain lets the
/// tasks ready on its thread run before it rings: those (the operations the completion task
/// just woke, posting their next requests) add theirs, and one `ibv_post_send` posts them all. The
/// completion task also rings before it polls, so that it never spins for completions of
/// requests that were not posted. A first operation dropped before it rang rings as it is
/// dropped ([`Claim`]'s `Drop`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::rdma) enum Ring {
    /// Posted with its own doorbell.
    Rung,
    /// Deferred behind others waiting: ring before waiting.
    Now,
    /// First of a chain: ring after letting the other operations run.
    AfterOthers,
    /// Another operation (or the completion task) rings.
    ByAnother,
}

/// Waits for `held`'s places in `slots` ([`Held::places`]: one, or a batch's), posts with `post` (given the task's waker, which it may put in the
/// table slot with the buffers), and waits for the completion in `table`; returns it with the
/// buffers. The slot is given back by whoever frees the table slot. With a `reaper`
/// (a connection's own queue pair), the operation may poll for its completion itself and rings
/// the doorbell of a deferred post ([`Ring`]); without one (a shared receive queue's), the
/// completion tasks of its connections hand it over.
///
/// The future is one hand-written state machine ([`PostAndWait`]) rather than nested `async`
/// functions: every operation of a connection runs through it, and each level of nesting cost
/// its polls and the moves of the buffers through its state.
pub(in crate::rdma) fn post_and_wait<'a, P>(
    table: &'a InFlightTable,
    slots: &'a QueueSlots,
    held: Held,
    post: P,
    reaper: Option<Reaper<'a>>,
) -> PostAndWait<'a, P>
where
    P: FnOnce(Held, &Waker) -> Posting,
{
    PostAndWait {
        table,
        slots,
        places: held.places(),
        reaper,
        unposted: Some((held, post)),
        acquire: None,
        posted: None,
    }
}

/// What an operation's post returns: its ticket and when its doorbell rings, or why it was not
/// posted, with its buffers.
pub(in crate::rdma) type Posting = Result<(Ticket, Ring), (io::Error, Held)>;

/// A queue slot being waited for (only when none is free).
type Acquire<'a> = Pin<Box<dyn Future<Output = ()> + Send + Sync + 'a>>;

/// The future of [`post_and_wait`].
///
/// Its parts are fields of their own rather than the variants of one state enum: posting then
/// moves only the buffers and the post out, and completing moves and drops nothing (replacing
/// a whole state went through a `memcpy` and a call to its drop glue each time).
pub(in crate::rdma) struct PostAndWait<'a, P> {
    table: &'a InFlightTable,
    slots: &'a QueueSlots,
    /// The places of the work queue the operation takes.
    places: usize,
    reaper: Option<Reaper<'a>>,
    /// Not posted yet: the buffers are the operation's own (dropping it drops them).
    unposted: Option<(Held, P)>,
    /// A queue slot being waited for (only when none was free).
    acquire: Option<Acquire<'a>>,
    /// Posted: the buffers are in the table, and the claim on their slot waits (it is `done`
    /// once the output was returned).
    posted: Option<(Claim<'a>, Wait)>,
}

/// Where a posted operation's wait is ([`Claim`]'s steps).
enum Wait {
    /// Just posted: it may let the ready tasks run first.
    Posted,
    /// It let the ready tasks run (the poll after its yield comes back here).
    Yielded { probed: bool },
    /// It polls the table for its completion; `missed` when its own spin ended empty.
    Polling { missed: bool },
}

impl<P> Unpin for PostAndWait<'_, P> {}

impl<P> Future for PostAndWait<'_, P>
where
    P: FnOnce(Held, &Waker) -> Posting,
{
    type Output = (io::Result<WorkCompletion>, Held);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (claim, wait) = match &mut this.posted {
            Some(posted) => posted,
            None => {
                if this.acquire.is_none() {
                    // `acquire` was the operation's cooperative yield point (an operation whose
                    // completion is found at once never returns `Pending`): keep one.
                    let Poll::Ready(restore) = coop::poll_proceed(cx) else {
                        return Poll::Pending;
                    };
                    restore.made_progress();
                }
                // The slot comes back when the table slot is freed (see `Claim`). A free slot is
                // taken without building `take`'s future.
                match &mut this.acquire {
                    Some(waiting) => {
                        std::task::ready!(waiting.as_mut().poll(cx));
                        this.acquire = None;
                    }
                    None if this.slots.try_take(this.places) => {}
                    None => {
                        let mut waiting: Acquire<'_> = Box::pin(this.slots.take(this.places));
                        if waiting.as_mut().poll(cx).is_pending() {
                            this.acquire = Some(waiting);
                            return Poll::Pending;
                        }
                    }
                }
                let Some((held, post)) = this.unposted.take() else {
                    panic!("`PostAndWait` polled after it completed");
                };
                let (ticket, ring) = match post(held, cx.waker()) {
                    Ok(posted) => posted,
                    Err((e, held)) => {
                        this.slots.give_back(this.places);
                        return Poll::Ready((Err(e), held));
                    }
                };
                let claim = Claim::new(
                    this.table,
                    this.slots,
                    this.places,
                    ticket,
                    this.reaper,
                    ring == Ring::AfterOthers,
                );
                if ring == Ring::Now
                    && let Some(r) = &claim.reaper
                {
                    r.shared.ring();
                }
                this.posted.insert((claim, Wait::Posted))
            }
        };
        assert!(!claim.done, "`PostAndWait` polled after it completed");
        let (wc, held) = std::task::ready!(claim.poll_wait(wait, cx));
        Poll::Ready((Ok(wc), held))
    }
}

/// A posted work request's claim on its slot; dropping it before the completion leaves the
/// buffers in the slot until the completion task polls that completion. Whoever frees the slot
/// gives its queue slot (`slots`) back.
struct Claim<'a> {
    table: &'a InFlightTable,
    slots: &'a QueueSlots,
    places: usize,
    ticket: Ticket,
    reaper: Option<Reaper<'a>>,
    /// Counted as unattended
    /// ([`Reaping::leave`](crate::rdma::reaping::Reaping::leave)) while it waits.
    parked: bool,
    /// It rings the doorbell of its deferred chain ([`Ring::AfterOthers`]), once.
    rings: bool,
    done: bool,
}

impl<'a> Claim<'a> {
    fn new(
        table: &'a InFlightTable,
        slots: &'a QueueSlots,
        places: usize,
        ticket: Ticket,
        reaper: Option<Reaper<'a>>,
        rings: bool,
    ) -> Self {
        Claim {
            table,
            slots,
            places,
            ticket,
            reaper,
            parked: false,
            rings,
            done: false,
        }
    }

    /// Rings the doorbell of its deferred chain if it is the one to.
    fn ring(&mut self) {
        if std::mem::take(&mut self.rings)
            && let Some(r) = &self.reaper
        {
            r.shared.ring();
        }
    }

    /// Whether the operation is the only one outstanding on its queue.
    fn alone(&self) -> bool {
        self.reaper
            .as_ref()
            .is_some_and(|r| r.shared.alone_on(r.queue))
    }

    /// Waits for the completion, from `wait` on; `Ready` once it was taken from the table.
    /// Inlined into the operation's poll: returned through a call, the completion and the
    /// buffers were copied out once more on every operation. Always: with a batch's places
    /// in the claim, LLVM kept it out of line (a 64 B write at depth 64: 1438 instructions
    /// against 1290).
    #[inline(always)]
    fn poll_wait(&mut self, wait: &mut Wait, cx: &mut Context<'_>) -> Poll<(WorkCompletion, Held)> {
        loop {
            match *wait {
                Wait::Posted => {
                    // A lone operation in a spawned task may let the tasks ready on its thread
                    // run first (`LoneYield` decides): they may post theirs beside it, and it
                    // then parks instead of spinning. Outside a task (a `block_on` future) the
                    // yield could cost the runtime a wake-up through its driver, and it spins
                    // at once. The first of a chain was posted beside others: not alone, and it
                    // also lets them add their requests to its chain first.
                    let alone_at_post = !self.rings && self.alone();
                    let probed = match &self.reaper {
                        Some(r) if alone_at_post => {
                            r.shared.reaping.lone_yield(r.queue).should_yield()
                                && tokio::task::try_id().is_some()
                        }
                        _ => false,
                    };
                    if self.rings || probed {
                        *wait = Wait::Yielded { probed };
                        return run_ready_tasks(cx);
                    }
                    if !alone_at_post && self.ticket.waker_set() {
                        // Its slot has this poll's waker since the post, and nothing has
                        // polled the queue since: its completion wakes it, with no look at
                        // the table first.
                        *wait = Wait::Polling { missed: false };
                        self.park();
                        return Poll::Pending;
                    }
                    *wait = self.start_polling(alone_at_post);
                }
                Wait::Yielded { probed } => {
                    self.ring();
                    // Still alone on its queue, the operation first polls for its completion
                    // itself.
                    let alone = self.alone();
                    if probed && let Some(r) = &self.reaper {
                        r.shared.reaping.lone_yield(r.queue).yielded(!alone);
                    }
                    *wait = self.start_polling(alone);
                }
                Wait::Polling { missed } => {
                    let (wc, held, _) = std::task::ready!(self.poll_completion(cx));
                    if missed && let Some(r) = &self.reaper {
                        // A completion soon after the window grows the window.
                        r.shared.reaping.spin(r.queue).record_late();
                    }
                    self.done = true;
                    self.unpark();
                    self.slots.give_back(self.places);
                    return Poll::Ready((wc, held));
                }
            }
        }
    }

    /// Spins for the completion first when `alone`; the wait then polls the table.
    fn start_polling(&self, alone: bool) -> Wait {
        let missed = match &self.reaper {
            Some(r) if alone => r.shared.spin_for(r.queue, &self.ticket),
            _ => false,
        };
        Wait::Polling { missed }
    }

    /// Always inlined, as [`Self::poll_wait`], its one caller.
    #[inline(always)]
    fn poll_completion(&mut self, cx: &mut Context<'_>) -> Poll<(WorkCompletion, Held, WorkQueue)> {
        let polled = self.table.poll(&self.ticket, cx);
        if polled.is_pending() {
            self.park();
        }
        polled
    }

    /// The waker is in the slot: whoever dispatches the completion wakes this task, and the
    /// completion task polls until somebody has.
    fn park(&mut self) {
        if !self.parked
            && let Some(r) = &self.reaper
        {
            self.parked = true;
            r.shared.reaping.leave();
        }
    }

    /// The operation no longer waits unattended (its completion was handed out or freed).
    fn unpark(&mut self) {
        if std::mem::take(&mut self.parked)
            && let Some(r) = &self.reaper
        {
            r.shared.reaping.handed_out();
        }
    }
}

impl Drop for Claim<'_> {
    /// Inlined: a claim whose operation returned (every one that was not dropped) has nothing
    /// to do, and the call to find that out was its own.
    #[inline]
    fn drop(&mut self) {
        if !self.done {
            self.abandon();
        }
    }
}

impl Claim<'_> {
    /// The operation was dropped before it took its completion.
    #[cold]
    fn abandon(&mut self) {
        // Its chain waits for this doorbell (its own request too, which stays outstanding).
        self.ring();
        match self.table.abandon(&self.ticket) {
            Some((_, held)) => {
                drop(held);
                self.unpark();
                self.slots.give_back(self.places);
            }
            // Still outstanding: the slot waits, unattended, for the completion that frees it
            // (`ConnShared::dispatch` counts it off then).
            None => {
                if !self.parked
                    && let Some(r) = &self.reaper
                {
                    r.shared.reaping.leave();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use super::*;

    /// An operation whose completion is already there never waits; the loop that runs such
    /// operations must still let the runtime's other tasks run (Tokio's cooperative budget).
    #[tokio::test(flavor = "current_thread")]
    async fn operations_that_complete_at_once_still_yield_to_other_tasks() {
        let table = InFlightTable::new(1, false);
        let slots = QueueSlots::new(1);
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = other_ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::Release) });
        let mut operations = 0;
        while !other_ran.load(Ordering::Acquire) && operations < 10_000 {
            let post = |held: Held, _: &Waker| {
                let (ticket, wr_id) = table.insert(held, WorkQueue::Send)?;
                // Completed before anyone waits, as a busy-polled completion is.
                assert!(
                    table
                        .complete(&WorkCompletion {
                            wr_id,
                            ..WorkCompletion::EMPTY
                        })
                        .is_none()
                );
                Ok((ticket, Ring::Rung))
            };
            let (wc, _) = post_and_wait(&table, &slots, Held::Nothing, post, None).await;
            wc.expect("the completion");
            operations += 1;
        }
        assert!(
            other_ran.load(Ordering::Acquire),
            "{operations} operations ran without letting the other task run"
        );
        assert_eq!(slots.available(), 1, "every slot came back");
    }

    /// An operation whose post put its waker in the table slot waits without polling the
    /// table first, and its completion wakes it with the result.
    #[test]
    fn an_operation_whose_waker_went_in_with_its_post_is_woken_by_its_completion() {
        let table = InFlightTable::new(1, false);
        let slots = QueueSlots::new(1);
        let id = std::cell::Cell::new(None);
        let post = |held: Held, waker: &Waker| {
            let (ticket, wr_id) = table.insert_waiting(held, WorkQueue::Send, waker)?;
            id.set(Some(wr_id));
            Ok((ticket, Ring::Rung))
        };
        let mut operation = post_and_wait(&table, &slots, Held::Nothing, post, None);
        let (woken, waker) = crate::wake_count::counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(Pin::new(&mut operation).poll(&mut cx).is_pending());
        let wr_id = id.get().expect("posted");
        assert_eq!(woken.get(), 0);
        assert!(
            table
                .complete(&WorkCompletion {
                    wr_id,
                    ..WorkCompletion::EMPTY
                })
                .is_none(),
            "the operation still waits for its slot"
        );
        assert_eq!(woken.get(), 1, "the completion woke it");
        match Pin::new(&mut operation).poll(&mut cx) {
            Poll::Ready((Ok(wc), Held::Nothing)) => assert_eq!(wc.wr_id, wr_id),
            Poll::Ready((result, _)) => panic!("not its completion: {result:?}"),
            Poll::Pending => panic!("woken but still pending"),
        }
        assert_eq!(slots.available(), 1, "its slot came back");
    }
}
