//! Who polls a connection's completion queue, and when.
//!
//! An operation that is alone on its work queue polls the queue itself for a busy-poll window
//! after posting, rather than waiting for the completion task to poll and wake it: at queue
//! depth 1 that saves a task switch per operation. In a spawned task it may first let the tasks
//! ready on its thread run once, and spins only if it is still alone then: many tasks doing one
//! operation each would otherwise run one at a time, each spinning while the others could not
//! post ([`LoneYield`] decides when that yield is worth its cost). With others outstanding it
//! parks at once: spinning would hold the thread while the operations whose completions come
//! first cannot post their next requests.
//!
//! The completion task attends the queue (arms it and waits for its events) only while some
//! posted work request has nobody polling for it: an operation that parked, or one dropped
//! before its completion ([`Reaping::unattended`]). An operation that finds its completion while
//! spinning wakes no task: unless the task attends for others, no arm was made for it. Once
//! half of what is in flight has completed and waits for its operation to run, the task yields
//! before it spins for more: the operations it woke may share its thread (always, on a
//! current-thread runtime), and cannot post their next requests while it spins.
//!
//! Whoever polls holds [`Reaping::lock`] from the poll to the end of the dispatch, so
//! completions are handed out in queue order: a failed request's error is recorded before the
//! flushes behind it reach their operations (which report it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, MutexGuard, PoisonError, TryLockError};
use std::time::Duration;

use tokio::sync::Notify;

use crate::reactor::{LoneYield, SpinPolicy};
use crate::verbs::WorkQueue;

/// The polling state a connection's operations and its completion task share.
#[derive(Debug)]
pub(super) struct Reaping {
    lock: Mutex<()>,
    /// The busy-poll window of operations on the send queue, and on the receive queue: a
    /// receive waits for the peer, so its misses must not make sends skip spinning.
    send_spin: SpinPolicy,
    recv_spin: SpinPolicy,
    /// Whether a lone operation yields before it spins, per queue as the windows.
    send_yield: LoneYield,
    recv_yield: LoneYield,
    /// Posted work requests nobody polls for: parked operations, and dropped ones whose
    /// completions have not come yet.
    unattended: AtomicUsize,
    /// Wakes the completion task when `unattended` leaves 0.
    wanted: Notify,
}

impl Reaping {
    /// Operations spin for `busy_poll` (growing with late completions: [`SpinPolicy::new`]).
    pub(super) fn new(busy_poll: Duration) -> Self {
        Reaping {
            lock: Mutex::new(()),
            send_spin: SpinPolicy::new(busy_poll),
            recv_spin: SpinPolicy::new(busy_poll),
            send_yield: LoneYield::default(),
            recv_yield: LoneYield::default(),
            unattended: AtomicUsize::new(0),
            wanted: Notify::new(),
        }
    }

    /// The right to poll and dispatch, waiting for it (held only for a poll and a dispatch, or
    /// for the completion task's wait, which never blocks).
    pub(super) fn lock(&self) -> MutexGuard<'_, ()> {
        // The guard protects no data, only the order of polls.
        self.lock.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The right to poll and dispatch, if nobody polls now.
    pub(super) fn try_lock(&self) -> Option<MutexGuard<'_, ()>> {
        match self.lock.try_lock() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The busy-poll policy of `queue`'s operations.
    pub(super) fn spin(&self, queue: WorkQueue) -> &SpinPolicy {
        match queue {
            WorkQueue::Send => &self.send_spin,
            WorkQueue::Recv => &self.recv_spin,
        }
    }

    /// The yield probe of `queue`'s lone operations.
    pub(super) fn lone_yield(&self, queue: WorkQueue) -> &LoneYield {
        match queue {
            WorkQueue::Send => &self.send_yield,
            WorkQueue::Recv => &self.recv_yield,
        }
    }

    /// Whether some posted work request has nobody polling for it.
    pub(super) fn unattended(&self) -> bool {
        self.unattended.load(Ordering::Acquire) > 0
    }

    /// One more work request has nobody polling for it: the completion task attends.
    pub(super) fn leave(&self) {
        // Only the first needs the task woken: a task that read 0 and waits sees the count
        // leave 0 through this notify; while it is above 0, the task attends anyway (it reads
        // the count before each wait). At queue depth 64 that saves a notify per operation.
        if self.unattended.fetch_add(1, Ordering::AcqRel) == 0 {
            // Stores a permit if the task is not waiting yet: it looks at the count again after.
            self.wanted.notify_one();
        }
    }

    /// A work request counted by [`Self::leave`] was handed out (or freed).
    pub(super) fn handed_out(&self) {
        self.unattended.fetch_sub(1, Ordering::AcqRel);
    }

    /// Waits until [`Self::leave`] was called (at once if it was since the last wait).
    pub(super) async fn wanted(&self) {
        self.wanted.notified().await;
    }
}
