//! The connection's completion task: it polls the completion queue, hands each completion to
//! the slot of its work request (waking the operation that waits, or freeing the buffers of one
//! that was dropped), and on close drains the queue pair before anything is freed. It attends
//! the queue only while some work request has nobody else polling for it: an operation alone on
//! its queue polls for its own completion first ([`super::reaping`]).
//!
//! Operations wait only on the task, so a task that ends early (polling failed, no waiter could
//! be registered, or its runtime was shut down, which drops the task) must not leave them
//! waiting: its [`TaskExit`] guard then ends the connection ([`ConnShared::fail`]).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore, TryAcquireError};
use tokio::task::coop;

use super::reaping::Reaping;
use super::srq::SharedReceiveQueue;
use crate::cm::link::CmLink;
use crate::cm::{ConnWaiter, Woken};
use crate::error::{StickyError, wc_error};
use crate::reactor::{AsyncCq, WaitHints};
use crate::verbs::{
    CallerMemoryQueuePair, CompletionBatch, Doorbell, Held, IdDevice, InFlightTable, Posted,
    ProtectionDomain, Ticket, WcStatus, WorkCompletion, WorkQueue,
};

/// How long a dropped connection waits for its flushed work requests before freeing everything
/// anyway (destroying the queue pair first makes that safe too).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

/// What is created between route resolution and connect/accept.
#[derive(Debug)]
pub(super) struct ConnParts {
    pub(super) qp: CallerMemoryQueuePair,
    pub(super) cq: AsyncCq,
    pub(super) table: Arc<InFlightTable>,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) device: IdDevice,
}

/// Everything a connection owns; the completion task holds it too.
#[derive(Debug)]
pub(super) struct ConnShared {
    // Drop order: disconnect, destroy the queue pair, then the table's buffers and the rest.
    pub(super) link: CmLink,
    pub(super) qp: CallerMemoryQueuePair,
    pub(super) cq: AsyncCq,
    pub(super) table: Arc<InFlightTable>,
    pub(super) pd: Arc<ProtectionDomain>,
    pub(super) device: IdDevice,
    pub(super) srq: Option<SharedReceiveQueue>,
    pub(super) send_slots: Semaphore,
    pub(super) recv_slots: Semaphore,
    /// The queue depths: the slots' permits when nothing is outstanding.
    depths: (u32, u32),
    /// Who polls the completion queue: operations alone on their queue, or this task.
    reaping: Reaping,
    /// The first failed work completion: later flushes report it.
    failure: StickyError,
    close: Notify,
    closing: AtomicBool,
}

impl ConnShared {
    pub(super) fn new(
        link: CmLink,
        parts: ConnParts,
        srq: Option<SharedReceiveQueue>,
        depths: (u32, u32),
        busy_poll: Duration,
    ) -> Self {
        ConnShared {
            link,
            qp: parts.qp,
            cq: parts.cq,
            table: parts.table,
            pd: parts.pd,
            device: parts.device,
            srq,
            send_slots: Semaphore::new(depths.0 as usize),
            recv_slots: Semaphore::new(depths.1 as usize),
            depths,
            reaping: Reaping::new(busy_poll),
            failure: StickyError::default(),
            close: Notify::new(),
            closing: AtomicBool::new(false),
        }
    }

    fn slots(&self, queue: WorkQueue) -> &Semaphore {
        match queue {
            WorkQueue::Send => &self.send_slots,
            WorkQueue::Recv => &self.recv_slots,
        }
    }

    /// Waits for room in `queue`, then posts with `post` (unless the connection is closed or
    /// failed); returns the completion and the buffers. `post` is told whether to defer the
    /// doorbell: on the send queue while other requests are outstanding ([`Ring`]).
    pub(super) async fn execute(
        &self,
        queue: WorkQueue,
        held: Held,
        post: impl FnOnce(Held, bool) -> Result<Posted, (io::Error, Held)>,
    ) -> (io::Result<WorkCompletion>, Held) {
        let sending = queue == WorkQueue::Send;
        let guarded = |held: Held| {
            if let Some(err) = self.refusal(queue) {
                return Err((err, held));
            }
            let defer = sending && !self.alone_on(queue);
            let mut held = Some(held);
            match self
                .link
                .while_open(|| post(held.take().unwrap_or_default(), defer))
            {
                Some(Ok(posted)) => {
                    let ring = match posted.doorbell {
                        Doorbell::Rung => Ring::Rung,
                        Doorbell::Deferred { .. } if !defer => Ring::Now,
                        Doorbell::Deferred { first: true } => Ring::AfterOthers,
                        Doorbell::Deferred { first: false } => Ring::ByAnother,
                    };
                    Ok((posted.ticket, ring))
                }
                Some(Err(refused)) => Err(refused),
                None => Err((self.link.closed_error(sending), held.unwrap_or_default())),
            }
        };
        let reaper = Reaper {
            shared: self,
            queue,
        };
        post_and_wait(&self.table, self.slots(queue), held, guarded, Some(reaper)).await
    }

    /// Posts the send-queue requests operations left for one doorbell ([`Ring`]), if any. Once
    /// the connection closed they are not posted: each completes here as flushed (the device
    /// never saw them), as a post after the close is refused. If the post fails, some of them
    /// may not have reached the device, and which is not known: the connection ends
    /// ([`Self::fail`]), which flushes every outstanding request with the cause. Never called
    /// with the reaping lock held (this takes it, as `fail` does).
    pub(super) fn ring(&self) {
        if !self.qp.has_deferred() {
            return;
        }
        let e = match self.link.while_open(|| self.qp.ring()) {
            Some(Ok(())) => return,
            Some(Err(e)) => e,
            None => {
                // Closed: nothing posts any more (posts happen only while open), so these stay
                // unposted and their buffers may go back now.
                let unposted = self.qp.forget_deferred();
                let _polling = self.reaping.lock();
                for wr_id in unposted {
                    self.dispatch(&[WorkCompletion {
                        wr_id,
                        status: WcStatus::FLUSH,
                        ..WorkCompletion::EMPTY
                    }]);
                }
                return;
            }
        };
        self.fail(io::Error::new(
            e.kind(),
            format!(
                "posting queued work requests to the connection to {} failed: {e}",
                self.link.peer_addr()
            ),
        ));
    }

    /// Whether the completion task must attend the queue: some work request has nobody else
    /// polling for it, the connection is closing, or receives of a shared receive queue (whose
    /// waiters do not poll) may complete here.
    fn needs_attending(&self) -> bool {
        self.reaping.unattended() || self.srq.is_some() || self.closing.load(Ordering::Acquire)
    }

    /// Whether an operation on `queue` is the only one outstanding there (it holds one slot).
    fn alone_on(&self, queue: WorkQueue) -> bool {
        let (slots, depth) = match queue {
            WorkQueue::Send => (&self.send_slots, self.depths.0),
            WorkQueue::Recv => (&self.recv_slots, self.depths.1),
        };
        slots.available_permits() + 1 >= depth as usize
    }

    /// Polls the completion queue for `ticket`'s completion for at most the busy-poll window of
    /// `queue`'s operations, dispatching whatever it finds. Returns early when the completion
    /// was dispatched, when someone else polls (the completion task: it dispatches), or when
    /// polling fails (the task reports that); whether the window ended empty.
    fn spin_for(&self, queue: WorkQueue, ticket: &Ticket) -> bool {
        let Some(mut window) = self.reaping.spin(queue).start() else {
            return false;
        };
        let mut batch = CompletionBatch::<32>::new();
        loop {
            let Some(_polling) = self.reaping.try_lock() else {
                return false;
            };
            match self.cq.try_poll_batch(&mut batch) {
                Ok([]) => {}
                Ok(wcs) => {
                    self.dispatch(wcs);
                    if self.table.is_done(ticket) {
                        window.found();
                        return false;
                    }
                }
                Err(_) => return false,
            }
            if window.ended_empty() {
                return true;
            }
            std::hint::spin_loop();
        }
    }

    /// Why nothing may be posted any more: an earlier work request failed (the queue pair is in
    /// the error state, where some providers never complete new receives).
    fn refusal(&self, queue: WorkQueue) -> Option<io::Error> {
        self.failure.report_as(match queue {
            WorkQueue::Send => "send-queue operation refused",
            WorkQueue::Recv => "receive refused",
        })
    }

    /// Asks the completion task to drain and release the connection.
    pub(super) fn begin_close(&self) {
        self.closing.store(true, Ordering::Release);
        self.close.notify_one();
    }

    fn record_failure(&self, wc: &WorkCompletion) {
        if !self.failure.is_set() {
            let err = wc_error(wc, self.link.peer_addr(), true);
            tracing::debug!(error = %err, "work request failed; the queue pair is in the error state");
            self.failure.set(err);
        }
    }

    /// The error for a flushed work request: what failed first, or the closed connection.
    pub(super) fn flush_error(&self, what: &str, sending: bool) -> io::Error {
        if let Some(e) = self.failure.report_as(format!("{what} was flushed")) {
            return e;
        }
        if self.link.is_disconnected() || self.closing.load(Ordering::Acquire) {
            return self.link.closed_error(sending);
        }
        io::Error::new(
            if sending {
                io::ErrorKind::BrokenPipe
            } else {
                io::ErrorKind::ConnectionReset
            },
            format!(
                "{what} was flushed: the connection to {} is closing",
                self.link.peer_addr()
            ),
        )
    }

    /// Ends the connection for good after its completion task ended early with `cause`: later
    /// operations are refused with it, and every outstanding one ends with it (as flushed)
    /// and gets its buffers back. No buffer is handed back while the device could still touch
    /// it: the queue pair is destroyed first.
    fn fail(&self, cause: io::Error) {
        tracing::warn!(parent: self.link.span(), error = %cause, "failing the connection");
        self.failure.set(cause);
        // Posts happen only while the link is open (`while_open`, under its lock), so none
        // is in progress or follows once this returns; the peer learns the connection ended.
        let _ = self.link.disconnect();
        // What already completed is handed over as usual (if the queue can still be polled),
        // so a finished operation keeps its result.
        self.dispatch_queued();
        self.qp.destroy();
        // Providers may leave a destroyed queue pair's last completions in the queue.
        self.dispatch_queued();
        for (queue, held) in self.table.flush_all() {
            // Only dropped operations' slots come back here.
            drop(held);
            self.reaping.handed_out();
            self.slots(queue).add_permits(1);
        }
    }

    /// Dispatches what the completion queue holds, without waiting; stops at a poll failure.
    fn dispatch_queued(&self) {
        let _polling = self.reaping.lock();
        let mut batch = CompletionBatch::<32>::new();
        while let Ok(wcs @ [_, ..]) = self.cq.try_poll_batch(&mut batch) {
            self.dispatch(wcs);
        }
    }

    /// Hands each completion to its slot. The caller holds the reaping lock since its poll.
    fn dispatch(&self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            if !wc.status.is_success() && wc.status != WcStatus::FLUSH {
                self.record_failure(wc);
            }
            if self.table.owns(wc.wr_id) {
                if let Some((queue, held)) = self.table.complete(wc) {
                    // A dropped operation's slot: the device is done with its buffers now.
                    drop(held);
                    self.reaping.handed_out();
                    self.slots(queue).add_permits(1);
                }
            } else if let Some(srq) = &self.srq
                && let Some((_, held)) = srq.inner.srq.table().complete(wc)
            {
                drop(held);
                srq.inner.slots.add_permits(1);
            }
        }
    }
}

/// For the arm that cannot be reached: [`post_and_wait`] gives back exactly the buffers it was
/// given (the in-flight table returns a slot's own contents), so no peer, device or input can
/// make an operation lose its buffer.
pub(super) fn lost_buffer<T>() -> T {
    unreachable!("the in-flight table gave back other buffers than it was given")
}

/// A connection's operation, which polls for its own completion while it is alone on its queue
/// and otherwise counts as unattended while it waits ([`super::reaping`]).
pub(super) struct Reaper<'a> {
    shared: &'a ConnShared,
    queue: WorkQueue,
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
pub(super) enum Ring {
    /// Posted with its own doorbell.
    Rung,
    /// Deferred behind others waiting: ring before waiting.
    Now,
    /// First of a chain: ring after letting the other operations run.
    AfterOthers,
    /// Another operation (or the completion task) rings.
    ByAnother,
}

/// Waits for one of `slots`, posts with `post`, and waits for the completion in `table`; returns
/// it with the buffers. The slot is given back by whoever frees the table slot. With a `reaper`
/// (a connection's own queue pair), the operation may poll for its completion itself and rings
/// the doorbell of a deferred post ([`Ring`]); without one (a shared receive queue's), the
/// completion tasks of its connections hand it over.
pub(super) async fn post_and_wait(
    table: &InFlightTable,
    slots: &Semaphore,
    held: Held,
    post: impl FnOnce(Held) -> Result<(Ticket, Ring), (io::Error, Held)>,
    reaper: Option<Reaper<'_>>,
) -> (io::Result<WorkCompletion>, Held) {
    // `acquire` was the operation's cooperative yield point (an operation whose completion is
    // found at once never returns `Pending`): keep one.
    coop::consume_budget().await;
    // The slot comes back when the table slot is freed (see `Claim`). A free slot is taken
    // without building `acquire`'s future: about 110 instructions less per operation.
    let acquired = match slots.try_acquire() {
        Ok(permit) => Ok(permit),
        Err(TryAcquireError::NoPermits) => slots.acquire().await.map_err(drop),
        Err(TryAcquireError::Closed) => Err(()),
    };
    match acquired {
        Ok(permit) => permit.forget(),
        Err(()) => {
            let err = io::Error::new(io::ErrorKind::BrokenPipe, "the queue is closed");
            return (Err(err), held);
        }
    }
    let (ticket, ring) = match post(held) {
        Ok(posted) => posted,
        Err((e, held)) => {
            slots.add_permits(1);
            return (Err(e), held);
        }
    };
    let claim = Claim::new(table, slots, ticket, reaper, ring == Ring::AfterOthers);
    if ring == Ring::Now
        && let Some(r) = &claim.reaper
    {
        r.shared.ring();
    }
    let (wc, held) = claim.completion().await;
    (Ok(wc), held)
}

/// A posted work request's claim on its slot; dropping it before the completion leaves the
/// buffers in the slot until the completion task polls that completion. Whoever frees the slot
/// gives its queue slot (`slots`) back.
struct Claim<'a> {
    table: &'a InFlightTable,
    slots: &'a Semaphore,
    ticket: Ticket,
    reaper: Option<Reaper<'a>>,
    /// Counted as unattended ([`Reaping::leave`]) while it waits.
    parked: bool,
    /// It rings the doorbell of its deferred chain ([`Ring::AfterOthers`]), once.
    rings: bool,
    done: bool,
}

impl<'a> Claim<'a> {
    fn new(
        table: &'a InFlightTable,
        slots: &'a Semaphore,
        ticket: Ticket,
        reaper: Option<Reaper<'a>>,
        rings: bool,
    ) -> Self {
        Claim {
            table,
            slots,
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

    async fn completion(mut self) -> (WorkCompletion, Held) {
        // A lone operation in a spawned task may let the tasks ready on its thread run first
        // (`LoneYield` decides): they may post theirs beside it, and it then parks instead of
        // spinning. Outside a task (a `block_on` future) the yield could cost the runtime a
        // wake-up through its driver, and it spins at once.
        let shared = self.reaper.as_ref().map(|r| (r.shared, r.queue));
        let alone_on = || shared.is_some_and(|(shared, queue)| shared.alone_on(queue));
        // The first of a chain was posted beside others: not alone.
        let alone_at_post = !self.rings && alone_on();
        let probe = match shared {
            Some((shared, queue)) if alone_at_post => {
                let probe = shared.reaping.lone_yield(queue);
                (probe.should_yield() && tokio::task::try_id().is_some()).then_some(probe)
            }
            _ => None,
        };
        let yields = self.rings || probe.is_some();
        if yields {
            // The chain's first also lets them add their requests to its chain first.
            run_ready_tasks().await;
            self.ring();
        }
        // Still alone on its queue, the operation first polls for its completion itself.
        let alone = if yields { alone_on() } else { alone_at_post };
        if let Some(probe) = probe {
            probe.yielded(!alone);
        }
        let missed = match shared {
            Some((shared, queue)) if alone => shared.spin_for(queue, &self.ticket),
            _ => false,
        };
        let (wc, held, _) = std::future::poll_fn(|cx| self.poll_completion(cx)).await;
        if missed && let Some(r) = &self.reaper {
            // A completion soon after the window grows the window.
            r.shared.reaping.spin(r.queue).record_late();
        }
        self.done = true;
        self.unpark();
        self.slots.add_permits(1);
        (wc, held)
    }

    fn poll_completion(&mut self, cx: &mut Context<'_>) -> Poll<(WorkCompletion, Held, WorkQueue)> {
        let polled = self.table.poll(&self.ticket, cx);
        if polled.is_pending()
            && !self.parked
            && let Some(r) = &self.reaper
        {
            // The waker is in the slot now: whoever dispatches the completion wakes this task,
            // and the completion task polls until somebody has.
            self.parked = true;
            r.shared.reaping.leave();
        }
        polled
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
    fn drop(&mut self) {
        if self.done {
            return;
        }
        // Its chain waits for this doorbell (its own request too, which stays outstanding).
        self.ring();
        match self.table.abandon(&self.ticket) {
            Some((_, held)) => {
                drop(held);
                self.unpark();
                self.slots.add_permits(1);
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

/// Lets the tasks that are ready to run on this thread run, once: the task wakes itself and
/// returns `Pending`, which Tokio's schedulers treat as a yield (a task goes to the back of its
/// worker's run queue, and wakes no other worker while it is the only one there). Unlike
/// `tokio::task::yield_now`, it does not wait for the I/O driver to be polled first, which
/// costs a system call where no other task is ready.
async fn run_ready_tasks() {
    let mut yielded = false;
    std::future::poll_fn(|cx| {
        if std::mem::replace(&mut yielded, true) {
            Poll::Ready(())
        } else {
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await;
}

/// Ends the connection ([`ConnShared::fail`]) when the completion task ends without finishing
/// a close: on a polling failure, and when the task is dropped (its runtime was shut down).
struct TaskExit {
    shared: Arc<ConnShared>,
    /// Why the task ends if it ends now; `None` once a close finished.
    cause: Option<io::Error>,
}

impl Drop for TaskExit {
    fn drop(&mut self) {
        if let Some(cause) = self.cause.take() {
            self.shared.fail(cause);
        }
    }
}

/// The completion task of one connection. It ends when the connection was dropped and every
/// outstanding work request completed (or flushed), or after [`DRAIN_LIMIT`]; if it ends any
/// other way, its [`TaskExit`] fails the connection.
///
/// The [`TaskExit`] is made here, before the task is spawned, not at its first poll: a task
/// dropped before it ever ran (its runtime shut down at once) still fails the connection.
pub(super) fn run_completion_task(
    shared: Arc<ConnShared>,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    let peer = shared.link.peer_addr();
    let exit = TaskExit {
        shared,
        cause: Some(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "the connection to {peer} ended: the Tokio runtime that ran it (where it was \
                 created) was shut down; create connections on a runtime that outlives them"
            ),
        )),
    };
    completion_loop(exit, peer)
}

async fn completion_loop(mut exit: TaskExit, peer: std::net::SocketAddr) {
    let shared = exit.shared.clone();
    let waiter = match ConnWaiter::new(&shared.cq, Some(&shared.link)) {
        Ok(waiter) => waiter,
        Err(e) => {
            exit.cause = Some(io::Error::new(
                e.kind(),
                format!("cannot wait for the completions of the connection to {peer}: {e}"),
            ));
            return;
        }
    };
    let mut batch = CompletionBatch::<32>::new();
    let mut link_open = true;
    let mut closing = false;
    // Completions dispatched since this task last let other tasks run.
    let mut woken_unrun = 0;
    // Armed when closing starts.
    let drain_deadline = tokio::time::sleep(DRAIN_LIMIT);
    tokio::pin!(drain_deadline);
    loop {
        // What the operations that just ran left for one doorbell goes out before this task
        // spins for completions.
        shared.ring();
        if closing && shared.table.outstanding() == 0 {
            exit.cause = None;
            break;
        }
        let attending = shared.needs_attending();
        tokio::select! {
            biased;
            // Once its close was seen, the link is no longer watched.
            woken = reap(&shared, &waiter, attending, link_open, &mut batch) => {
                match woken {
                    // `reap` dispatched them, waking their operations. Those may run on this
                    // thread (a current-thread runtime, or this worker's queue): once half of
                    // what is in flight waits for its operation to run, let them post their
                    // next requests before this task spins for more, or it holds the thread
                    // for its busy-poll windows while the queue it watches runs dry.
                    Woken::Completions(Ok(n)) => {
                        woken_unrun += n;
                        if woken_unrun * 2 >= shared.table.outstanding() {
                            woken_unrun = 0;
                            tokio::task::yield_now().await;
                        }
                    }
                    Woken::Completions(Err(e)) => {
                        // Nothing can be reaped any more: `exit` fails the connection.
                        exit.cause = Some(io::Error::new(
                            e.kind(),
                            format!("polling the completion queue of the connection to {peer} failed: {e}"),
                        ));
                        break;
                    }
                    Woken::Closed(closed) => {
                        link_open = false;
                        if let Err(e) = closed {
                            tracing::debug!(error = %e, "reading the connection's rdma_cm events");
                        }
                    }
                }
            }
            // Some work request has nobody polling for it now: attend.
            () = shared.reaping.wanted(), if !attending => {}
            () = shared.close.notified(), if !closing => {
                closing = true;
                // Flush everything outstanding; its completions free the slots.
                if let Err(e) = shared.qp.set_error() {
                    tracing::debug!(error = %e, "moving the queue pair to the error state");
                }
                drain_deadline
                    .as_mut()
                    .reset(tokio::time::Instant::now() + DRAIN_LIMIT);
            }
            () = &mut drain_deadline, if closing => {
                tracing::warn!(
                    outstanding = shared.table.outstanding(),
                    "flushed work requests did not all complete; destroying the queue pair first"
                );
                // Nothing waits any more (the connection was dropped): `fail` destroys the queue
                // pair, then frees what is left.
                exit.cause = Some(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the connection to {peer} was closed; its flushed work requests did not complete within {DRAIN_LIMIT:?}"),
                ));
                break;
            }
        }
    }
}

/// One wait of the completion task. Attending, it waits for completions (dispatching them under
/// the reaping lock, held from the poll on) or the link's close; otherwise for the close only,
/// and the queue is left to the operations polling it.
fn reap<'a, const N: usize>(
    shared: &'a ConnShared,
    waiter: &'a ConnWaiter,
    attending: bool,
    link_open: bool,
    batch: &'a mut CompletionBatch<N>,
) -> impl std::future::Future<Output = Woken> + 'a {
    let link = link_open.then_some(&shared.link);
    std::future::poll_fn(move |cx| {
        if !attending {
            return match (link, waiter.cm()) {
                (Some(link), Some(cm)) => cm.poll_disconnected(link, cx).map(Woken::Closed),
                _ => Poll::Pending,
            };
        }
        // Held through the task's busy-poll window (operations then park rather than spin), never
        // across a Pending: the poll returns that once the queue is armed and looked at.
        let _polling = shared.reaping.lock();
        let woken = ready!(waiter.poll_wait(&shared.cq, link, cx, batch, WaitHints::default()));
        if let Woken::Completions(Ok(_)) = woken {
            shared.dispatch(batch.as_slice());
        }
        Poll::Ready(woken)
    })
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::*;

    /// An operation whose completion is already there never waits; the loop that runs such
    /// operations must still let the runtime's other tasks run (Tokio's cooperative budget).
    #[tokio::test(flavor = "current_thread")]
    async fn operations_that_complete_at_once_still_yield_to_other_tasks() {
        let table = InFlightTable::new(1, false);
        let slots = Semaphore::new(1);
        let other_ran = Arc::new(AtomicBool::new(false));
        let flag = other_ran.clone();
        tokio::spawn(async move { flag.store(true, Ordering::Release) });
        let mut operations = 0;
        while !other_ran.load(Ordering::Acquire) && operations < 10_000 {
            let post = |held: Held| {
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
        assert_eq!(slots.available_permits(), 1, "every slot came back");
    }
}
