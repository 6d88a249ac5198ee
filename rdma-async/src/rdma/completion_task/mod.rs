//! The connection's completion task: it polls the completion queue, hands each completion to
//! the slot of its work request (waking the operation that waits, or freeing the buffers of one
//! that was dropped), and on close drains the queue pair before anything is freed. It attends
//! the queue only while some work request has nobody else polling for it: an operation alone on
//! its queue polls for its own completion first ([`super::reaping`]).
//!
//! Operations wait only on the task, so a task that ends early (polling failed, no waiter could
//! be registered, or its runtime was shut down, which drops the task) must not leave them
//! waiting: its [`TaskExit`] guard then ends the connection ([`ConnShared::fail`]).
//!
//! This file holds the task itself; [`ConnShared`] (what the connection and its task share,
//! and the dispatch of completions) and [`post_and_wait`] (an operation's post and its wait
//! for the completion) are in the sibling files.

use std::io;
use std::sync::Arc;
use std::task::{Poll, ready};
use std::time::Duration;

use crate::cm::{ConnWaiter, Woken};
use crate::reactor::{DispatchYield, WaitHints};
use crate::verbs::CompletionBatch;

mod conn_shared;
mod operation;

pub(super) use conn_shared::{ConnParts, ConnShared};
pub(super) use operation::{Ring, lost_buffer, post_and_wait};

/// How long a dropped connection waits for its flushed work requests before freeing everything
/// anyway (destroying the queue pair first makes that safe too).
const DRAIN_LIMIT: Duration = Duration::from_secs(10);

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
    let mut dispatch_yield = DispatchYield::default();
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
                    // `reap` dispatched them, waking their operations, which may have to run
                    // on this thread (`DispatchYield` decides when they get their turn).
                    Woken::Completions(Ok(n)) => {
                        if dispatch_yield.dispatched(n, shared.table.outstanding()) {
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
