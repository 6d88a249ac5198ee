//! Test hook (feature `test-hooks`): makes this thread's next creation of a verbs object fail
//! with a chosen errno, as a device out of queue pairs, completion queues or memory regions
//! would, so tests can check the error and that the process goes on serving. Thread-local, so
//! tests running beside each other (on other threads) are not affected.

use std::cell::RefCell;

use super::resource_limits::Resource;

thread_local! {
    static PENDING: RefCell<Vec<(Resource, i32)>> = const { RefCell::new(Vec::new()) };
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
