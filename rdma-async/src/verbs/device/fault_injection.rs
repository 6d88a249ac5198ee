//! Test hook (`--cfg rdma_async_hooks`): makes this thread's next creation of a verbs object fail
//! with a chosen errno, as a device out of queue pairs, completion queues or memory regions
//! would, so tests can check the error and that the process goes on serving; and its next
//! teardown of one fail, leaving the object in place, as a failed `ibv_dereg_mr`,
//! `ibv_dealloc_mw` or `ibv_destroy_qp` does, so tests can check that nothing trusts a teardown
//! that did not happen.
//! Thread-local, so tests running beside each other (on other threads) are not affected.

use std::cell::RefCell;

use super::resource::Resource;

/// A teardown a test can make fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Teardown {
    /// A memory deregistration (`ibv_dereg_mr`).
    DeregisterMemory,
    /// A memory window deallocation (`ibv_dealloc_mw`).
    DeallocWindow,
    /// A queue pair's destruction (`ibv_destroy_qp`).
    DestroyQueuePair,
}

thread_local! {
    static PENDING: RefCell<Vec<(Resource, i32)>> = const { RefCell::new(Vec::new()) };
    static PENDING_TEARDOWNS: RefCell<Vec<(Teardown, i32)>> = const { RefCell::new(Vec::new()) };
}

/// Makes the next `teardown` on this thread fail with `errno` (once), leaving the object.
pub fn fail_next_teardown(teardown: Teardown, errno: i32) {
    PENDING_TEARDOWNS.with(|p| p.borrow_mut().push((teardown, errno)));
}

/// The errno to fail this `teardown` with, if a test asked for one.
pub(crate) fn injected_teardown(teardown: Teardown) -> Option<i32> {
    PENDING_TEARDOWNS.with(|p| {
        let mut pending = p.borrow_mut();
        let at = pending.iter().position(|(t, _)| *t == teardown)?;
        Some(pending.remove(at).1)
    })
}

/// Makes the next creation of `resource` on this thread fail with `errno` (once).
pub fn fail_next(resource: Resource, errno: i32) {
    PENDING.with(|p| p.borrow_mut().push((resource, errno)));
}

/// The errno to fail this creation of `resource` with, if a test asked for one.
pub(crate) fn injected(resource: Resource) -> Option<i32> {
    PENDING.with(|p| {
        let mut pending = p.borrow_mut();
        let at = pending.iter().position(|(r, _)| *r == resource)?;
        Some(pending.remove(at).1)
    })
}
