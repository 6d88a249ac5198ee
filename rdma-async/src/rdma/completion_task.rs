//! The connection's completion task: it polls the completion queue, hands each completion to
//! the slot of its work request (waking the operation that waits, or freeing the buffers of one
//! that was dropped), and on close drains the queue pair before anything is freed.
//!
//! Operations wait only on the task, so a task that ends early (polling failed, no waiter could
//! be registered, or its runtime was shut down, which drops the task) must not leave them
//! waiting: its [`TaskExit`] guard then ends the connection ([`ConnShared::fail`]).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tokio::sync::{Notify, Semaphore};

use super::srq::SharedReceiveQueue;
use crate::cm::link::CmLink;
use crate::error::{StickyError, wc_error};
use crate::reactor::{AsyncCq, ConnWaiter, Woken};
use crate::verbs::{
    CallerMemoryQueuePair, CompletionBatch, Held, IdDevice, InFlightTable, ProtectionDomain,
    Ticket, WcStatus, WorkCompletion, WorkQueue,
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
    /// failed); returns the completion and the buffers.
    pub(super) async fn execute(
        &self,
        queue: WorkQueue,
        held: Held,
        post: impl FnOnce(Held) -> Result<Ticket, (io::Error, Held)>,
    ) -> (io::Result<WorkCompletion>, Held) {
        let sending = queue == WorkQueue::Send;
        let guarded = |held: Held| {
            if let Some(err) = self.refusal(queue) {
                return Err((err, held));
            }
            let mut held = Some(held);
            match self
                .link
                .while_open(|| post(held.take().unwrap_or_default()))
            {
                Some(posted) => posted,
                None => Err((self.link.closed_error(sending), held.unwrap_or_default())),
            }
        };
        post_and_wait(&self.table, self.slots(queue), held, guarded).await
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
        tracing::warn!(parent: self.link.span(), error = %cause, "the connection's completion task ended; failing the connection");
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
            drop(held);
            self.slots(queue).add_permits(1);
        }
    }

    /// Dispatches what the completion queue holds, without waiting; stops at a poll failure.
    fn dispatch_queued(&self) {
        let mut batch = CompletionBatch::<32>::new();
        while let Ok(wcs @ [_, ..]) = self.cq.try_poll_batch(&mut batch) {
            self.dispatch(wcs);
        }
    }

    fn dispatch(&self, wcs: &[WorkCompletion]) {
        for wc in wcs {
            if !wc.status.is_success() && wc.status != WcStatus::FLUSH {
                self.record_failure(wc);
            }
            if self.table.owns(wc.wr_id) {
                if let Some((queue, held)) = self.table.complete(wc) {
                    // A dropped operation's slot: the device is done with its buffers now.
                    drop(held);
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

/// Waits for one of `slots`, posts with `post`, and waits for the completion in `table`; returns
/// it with the buffers. The slot is given back by whoever frees the table slot.
pub(super) async fn post_and_wait(
    table: &InFlightTable,
    slots: &Semaphore,
    held: Held,
    post: impl FnOnce(Held) -> Result<Ticket, (io::Error, Held)>,
) -> (io::Result<WorkCompletion>, Held) {
    match slots.acquire().await {
        // The slot comes back when the table slot is freed (see `Claim`).
        Ok(permit) => permit.forget(),
        Err(_) => {
            let err = io::Error::new(io::ErrorKind::BrokenPipe, "the queue is closed");
            return (Err(err), held);
        }
    }
    let ticket = match post(held) {
        Ok(ticket) => ticket,
        Err((e, held)) => {
            slots.add_permits(1);
            return (Err(e), held);
        }
    };
    let (wc, held) = Claim::new(table, slots, ticket).completion().await;
    (Ok(wc), held)
}

/// A posted work request's claim on its slot; dropping it before the completion leaves the
/// buffers in the slot until the completion task polls that completion. Whoever frees the slot
/// gives its queue slot (`slots`) back.
struct Claim<'a> {
    table: &'a InFlightTable,
    slots: &'a Semaphore,
    ticket: Ticket,
    done: bool,
}

impl<'a> Claim<'a> {
    fn new(table: &'a InFlightTable, slots: &'a Semaphore, ticket: Ticket) -> Self {
        Claim {
            table,
            slots,
            ticket,
            done: false,
        }
    }

    async fn completion(mut self) -> (WorkCompletion, Held) {
        let (wc, held, _) = std::future::poll_fn(|cx| self.table.poll(&self.ticket, cx)).await;
        self.done = true;
        self.slots.add_permits(1);
        (wc, held)
    }
}

impl Drop for Claim<'_> {
    fn drop(&mut self) {
        if !self.done
            && let Some((_, held)) = self.table.abandon(&self.ticket)
        {
            drop(held);
            self.slots.add_permits(1);
        }
    }
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
    // Armed when closing starts.
    let drain_deadline = tokio::time::sleep(DRAIN_LIMIT);
    tokio::pin!(drain_deadline);
    loop {
        if closing && shared.table.outstanding() == 0 {
            exit.cause = None;
            break;
        }
        tokio::select! {
            biased;
            // Once its close was seen, the link is no longer watched.
            woken = waiter.wait(&shared.cq, link_open.then_some(&shared.link), &mut batch) => {
                match woken {
                    Woken::Completions(Ok(_)) => shared.dispatch(batch.as_slice()),
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
