//! Test hook (`--cfg rdma_async_hooks`): the failures a test armed on a live queue pair (its next
//! receive post, its next doorbell for deferred requests, its next batch), held here rather than in the queue
//! pair, so that no verbs type carries a field that exists only for the hooks.
//!
//! The registry is process-wide, not thread-local as the creation faults are
//! (`verbs::device::fault_injection`): a test arms a fault on its own thread and the post that
//! takes it runs on whichever thread the runtime polls the connection's driver on. It is keyed by
//! the queue pair's [`FaultKey`], the address of the rdma_cm id the queue pair holds (an `Arc`),
//! which no other live queue pair can have; queue pair numbers are not unique across devices. A
//! queue pair forgets its entries when it is dropped ([`forget`]), before it lets go of its id,
//! so a later queue pair whose id reuses the address starts with none. A fault armed before the
//! queue pair was destroyed (moved to the error state or closed, but not yet dropped) is still
//! taken by its next post, as when the flag lived in the queue pair.
//!
//! The device tests run with the hooks compiled in, so the posting paths ask [`take`] on every
//! post: it reads one counter and takes the lock only while some fault is armed.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

/// A failure a test can arm on a queue pair, each taken once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    /// The next receive post fails (`ENOMEM`, as a full receive queue would).
    PostRecv,
    /// The next doorbell for deferred requests fails (`ENOMEM`) and posts none of them.
    Ring,
    /// The provider refuses the first request of the next batch (`ENOMEM`): none is posted.
    BatchHead,
    /// The provider refuses the last request of the next batch (`ENOMEM`) after posting the
    /// others.
    BatchTail,
}

/// Which queue pair a fault is armed on: the address of the rdma_cm id it holds.
pub(super) type FaultKey = usize;

/// The armed faults (a handful at most: tests arm one and the next post takes it).
static ARMED: Mutex<Vec<(FaultKey, Fault)>> = Mutex::new(Vec::new());
/// How many entries [`ARMED`] holds, read without its lock.
static ARMED_COUNT: AtomicUsize = AtomicUsize::new(0);

/// Runs `change` on the armed faults and updates their count.
fn with_armed<R>(change: impl FnOnce(&mut Vec<(FaultKey, Fault)>) -> R) -> R {
    let mut armed = ARMED.lock().unwrap_or_else(PoisonError::into_inner);
    let result = change(&mut armed);
    ARMED_COUNT.store(armed.len(), Ordering::Release);
    result
}

/// Arms `fault` on the queue pair `key`; arming it again before it was taken changes nothing.
pub(super) fn arm(key: FaultKey, fault: Fault) {
    with_armed(|armed| {
        if !armed.contains(&(key, fault)) {
            armed.push((key, fault));
        }
    });
}

/// Whether `fault` was armed on the queue pair `key`, disarming it.
pub(super) fn take(key: FaultKey, fault: Fault) -> bool {
    if ARMED_COUNT.load(Ordering::Acquire) == 0 {
        return false;
    }
    with_armed(|armed| {
        let at = armed.iter().position(|entry| *entry == (key, fault));
        at.map(|at| armed.swap_remove(at)).is_some()
    })
}

/// Disarms every fault of the queue pair `key`, which is going away.
pub(super) fn forget(key: FaultKey) {
    if ARMED_COUNT.load(Ordering::Acquire) == 0 {
        return;
    }
    with_armed(|armed| armed.retain(|(armed_key, _)| *armed_key != key));
}
