//! [`ConnShared`]: everything a connection owns, which its operations and its completion task
//! share: posting under the connection's rules, polling for a lone operation's completion,
//! handing completions to their slots, and ending the connection when its task cannot go on.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::Waker;
use std::time::Duration;

use tokio::sync::Notify;

use super::operation::{PostAndWait, Posting, Reaper, Ring, post_and_wait};
use crate::cm::link::CmLink;
use crate::error::StickyError;
use crate::rdma::queue_slots::QueueSlots;
use crate::rdma::reaping::Reaping;
use crate::rdma::srq::SharedReceiveQueue;
use crate::reactor::AsyncCq;
use crate::verbs::wc_error;
use crate::verbs::{
    BatchRefused, CallerMemoryQueuePair, CompletionBatch, Doorbell, Held, IdDevice, InFlightTable,
    Opcode, PolledCompletion, Posted, ProtectionDomain, Segment, Ticket, WcStatus, WorkCompletion,
    WorkQueue,
};

/// What is created between route resolution and connect/accept.
#[derive(Debug)]
pub(in crate::rdma) struct ConnParts {
    pub(in crate::rdma) qp: CallerMemoryQueuePair,
    pub(in crate::rdma) cq: AsyncCq,
    pub(in crate::rdma) table: Arc<InFlightTable>,
    pub(in crate::rdma) pd: Arc<ProtectionDomain>,
    pub(in crate::rdma) device: IdDevice,
}

/// Everything a connection owns; the completion task holds it too.
#[derive(Debug)]
pub(in crate::rdma) struct ConnShared {
    // Drop order: disconnect, destroy the queue pair, then the table's buffers and the rest.
    pub(in crate::rdma) link: CmLink,
    pub(in crate::rdma) qp: CallerMemoryQueuePair,
    pub(in crate::rdma) cq: AsyncCq,
    pub(in crate::rdma) table: Arc<InFlightTable>,
    pub(in crate::rdma) pd: Arc<ProtectionDomain>,
    pub(in crate::rdma) device: IdDevice,
    pub(in crate::rdma) srq: Option<SharedReceiveQueue>,
    pub(in crate::rdma) send_slots: QueueSlots,
    pub(in crate::rdma) recv_slots: QueueSlots,
    /// The queue depths: the slots' permits when nothing is outstanding.
    depths: (u32, u32),
    /// Who polls the completion queue: operations alone on their queue, or this task.
    pub(super) reaping: Reaping,
    /// The first failed work completion: later flushes report it.
    failure: StickyError,
    pub(super) close: Notify,
    closing: AtomicBool,
}

impl ConnShared {
    pub(in crate::rdma) fn new(
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
            send_slots: QueueSlots::new(depths.0 as usize),
            recv_slots: QueueSlots::new(depths.1 as usize),
            depths,
            reaping: Reaping::new(busy_poll),
            failure: StickyError::default(),
            close: Notify::new(),
            closing: AtomicBool::new(false),
        }
    }

    fn slots(&self, queue: WorkQueue) -> &QueueSlots {
        match queue {
            WorkQueue::Send => &self.send_slots,
            WorkQueue::Recv => &self.recv_slots,
        }
    }

    /// Waits for room in `queue`, then posts with `post` (unless the connection is closed or
    /// failed); returns the completion and the buffers. `post` is told whether to defer the
    /// doorbell (on the send queue while other requests are outstanding, for a `chained`
    /// request: [`Ring`]), and given the operation's waker for the table slot. A deferring
    /// `post` only adds its request to the queue pair's chain, outside the link's lock (the
    /// chain is posted under it); every other post runs under it
    /// ([`CmLink::while_open`]).
    pub(in crate::rdma) fn execute<'a>(
        &'a self,
        queue: WorkQueue,
        chained: bool,
        held: Held,
        post: impl FnOnce(Held, bool, &Waker) -> Result<Posted, (io::Error, Held)> + 'a,
    ) -> PostAndWait<'a, impl FnOnce(Held, &Waker) -> Posting + 'a> {
        let sending = queue == WorkQueue::Send;
        let guarded = move |held: Held, waker: &Waker| {
            if let Some(err) = self.refusal(queue) {
                return Err((err, held));
            }
            let defer = chained && sending && !self.alone_on(queue);
            if defer {
                // Deferred, the request only joins the chain: the link's lock is taken where
                // the chain is posted ([`Self::ring`]), which flushes it instead once the link
                // closed. A request joining after the close is flushed there too.
                return post(held, true, waker).map(|posted| {
                    let ring = match posted.doorbell {
                        Doorbell::Rung => Ring::Rung,
                        Doorbell::Deferred { first: true } => Ring::AfterOthers,
                        Doorbell::Deferred { first: false } => Ring::ByAnother,
                    };
                    (posted.ticket, ring)
                });
            }
            let mut held = Some(held);
            match self
                .link
                .while_open(|| post(held.take().unwrap_or_default(), false, waker))
            {
                Some(Ok(posted)) => {
                    let ring = match posted.doorbell {
                        Doorbell::Rung => Ring::Rung,
                        Doorbell::Deferred { .. } => Ring::Now,
                    };
                    Ok((posted.ticket, ring))
                }
                Some(Err(refused)) => Err(refused),
                None => Err((self.closed_refusal(sending), held.unwrap_or_default())),
            }
        };
        let reaper = Reaper {
            shared: self,
            queue,
        };
        post_and_wait(&self.table, self.slots(queue), held, guarded, Some(reaper))
    }

    /// The send queue's depth: the most places an operation may take.
    pub(in crate::rdma) fn send_depth(&self) -> usize {
        self.depths.0 as usize
    }

    /// Waits for `held`'s places on the send queue (a [`Held::Batch`]: one per member), then
    /// posts `members` as one list whose last request alone is signaled
    /// ([`CallerMemoryQueuePair::post_batch`]), unless the connection is closed or failed;
    /// returns the completion (of the last request, or the first member's error) and the
    /// buffers. Requests left for one doorbell are posted first, so that they keep their
    /// order before the batch. If the provider takes only part of the list, the connection
    /// ends ([`Self::fail`]): the members it took complete unsignaled, so only destroying the
    /// queue pair settles their slot, which then hands the buffers back with the cause.
    pub(in crate::rdma) fn execute_batch<'a>(
        &'a self,
        held: Held,
        members: Vec<(Segment, Opcode)>,
    ) -> PostAndWait<'a, impl FnOnce(Held, &Waker) -> Posting + 'a> {
        let guarded = move |held: Held, waker: &Waker| {
            if let Some(err) = self.refusal(WorkQueue::Send) {
                return Err((err, held));
            }
            self.ring();
            let mut held = Some(held);
            let posted = self.link.while_open(|| {
                self.qp
                    .post_batch(held.take().unwrap_or_default(), &members, waker)
            });
            match posted {
                Some(Ok(ticket)) => Ok((ticket, Ring::Rung)),
                Some(Err(BatchRefused::Unposted(e, held))) => Err((e, held)),
                Some(Err(BatchRefused::Partly(e, ticket))) => {
                    self.fail(io::Error::new(
                        e.kind(),
                        format!(
                            "posting a batch of {} work requests to the connection to {} failed \
                             after part of it was posted: {e}",
                            members.len(),
                            self.link.peer_addr()
                        ),
                    ));
                    Ok((ticket, Ring::Rung))
                }
                None => Err((self.closed_refusal(true), held.unwrap_or_default())),
            }
        };
        let reaper = Reaper {
            shared: self,
            queue: WorkQueue::Send,
        };
        post_and_wait(&self.table, &self.send_slots, held, guarded, Some(reaper))
    }

    /// Posts the send-queue requests operations left for one doorbell ([`Ring`]), if any. Once
    /// the connection closed they are not posted: each completes here as flushed (the device
    /// never saw them), as a post after the close is refused. If the post fails, some of them
    /// may not have reached the device, and which is not known: the connection ends
    /// ([`Self::fail`]), which flushes every outstanding request with the cause. Never called
    /// with the reaping lock held (this takes it, as `fail` does).
    pub(in crate::rdma) fn ring(&self) {
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
                    self.dispatch(&[PolledCompletion::from(WorkCompletion {
                        wr_id,
                        status: WcStatus::FLUSH,
                        ..WorkCompletion::EMPTY
                    })]);
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
    pub(super) fn needs_attending(&self) -> bool {
        self.reaping.unattended() || self.srq.is_some() || self.closing.load(Ordering::Acquire)
    }

    /// Whether an operation on `queue` is the only one outstanding there (it holds one slot).
    pub(super) fn alone_on(&self, queue: WorkQueue) -> bool {
        let (slots, depth) = match queue {
            WorkQueue::Send => (&self.send_slots, self.depths.0),
            WorkQueue::Recv => (&self.recv_slots, self.depths.1),
        };
        slots.available() + 1 >= depth as usize
    }

    /// Polls the completion queue for `ticket`'s completion for at most the busy-poll window of
    /// `queue`'s operations, dispatching whatever it finds. Returns early when the completion
    /// was dispatched, when someone else polls (the completion task: it dispatches), or when
    /// polling fails (the task reports that); whether the window ended empty.
    pub(super) fn spin_for(&self, queue: WorkQueue, ticket: &Ticket) -> bool {
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
    /// the error state, where some providers never complete new receives). Every post asks:
    /// the look is inlined into it, the error built out of line ([`Self::refused`]).
    #[inline]
    fn refusal(&self, queue: WorkQueue) -> Option<io::Error> {
        if !self.failure.is_set() {
            return None;
        }
        self.refused(queue)
    }

    /// [`Self::refusal`]'s error, once a failure is recorded: cold and out of line, so that a
    /// post of a healthy connection carries only the look.
    #[cold]
    #[inline(never)]
    fn refused(&self, queue: WorkQueue) -> Option<io::Error> {
        self.failure.report_as(match queue {
            WorkQueue::Send => "send-queue operation refused",
            WorkQueue::Recv => "receive refused",
        })
    }

    /// The error for a post refused because the link closed. Cold and out of line, for the
    /// same reason as [`Self::refused`].
    #[cold]
    #[inline(never)]
    fn closed_refusal(&self, sending: bool) -> io::Error {
        self.link.closed_error(sending)
    }

    /// Asks the completion task to drain and release the connection.
    pub(in crate::rdma) fn begin_close(&self) {
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
    pub(in crate::rdma) fn flush_error(&self, what: &str, sending: bool) -> io::Error {
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
    /// it: the queue pair is destroyed first. If destroying it fails, the device may still
    /// use (and the peer still reach) every outstanding request's buffers: they stay in the
    /// table, which the queue pair keeps with it (leaked), and their operations stay pending
    /// (each returns its buffer with its result, and has none to return); dropping one is
    /// safe.
    pub(super) fn fail(&self, cause: io::Error) {
        tracing::warn!(parent: self.link.span(), error = %cause, "failing the connection");
        self.failure.set(cause);
        // Posts happen only while the link is open (`while_open`, under its lock), so none
        // is in progress or follows once this returns; the peer learns the connection ended.
        let _ = self.link.disconnect();
        // What already completed is handed over as usual (if the queue can still be polled),
        // so a finished operation keeps its result.
        self.dispatch_queued();
        let destroyed = self.qp.destroy();
        // Providers may leave a destroyed queue pair's last completions in the queue (and a
        // completion polled says the device is done with its request either way).
        self.dispatch_queued();
        if !destroyed {
            return;
        }
        for (queue, held) in self.table.flush_all() {
            // Only dropped operations' slots come back here.
            let places = held.places();
            drop(held);
            self.reaping.handed_out();
            self.slots(queue).give_back(places);
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
    ///
    /// Failures are recorded first, so a flushed request behind a failed one reports the
    /// failure. The connection's own completions are then handed over under one lock of its
    /// table (a batch at depth 64 holds about 30); the buffers of dropped operations are
    /// dropped after that lock (deregistering takes a system call).
    pub(super) fn dispatch(&self, wcs: &[PolledCompletion]) {
        for wc in wcs {
            let status = wc.status();
            if !status.is_success() && status != WcStatus::FLUSH {
                self.record_failure(&wc.to_work_completion());
            }
        }
        let mut freed = Vec::new();
        let mut shared_queue = false;
        {
            let mut completing = self.table.completing();
            for wc in wcs {
                if !self.table.owns(wc.wr_id()) {
                    shared_queue = true;
                } else if let Some(slot) = completing.complete_polled(wc) {
                    freed.push(slot);
                }
            }
        }
        for (queue, held) in freed {
            // A dropped operation's slot: the device is done with its buffers now.
            let places = held.places();
            drop(held);
            self.reaping.handed_out();
            self.slots(queue).give_back(places);
        }
        if shared_queue && let Some(srq) = &self.srq {
            for wc in wcs.iter().filter(|wc| !self.table.owns(wc.wr_id())) {
                if let Some((_, held)) = srq.inner.srq.table().complete(&wc.to_work_completion()) {
                    drop(held);
                    srq.inner.slots.give_back(1);
                }
            }
        }
    }
}
