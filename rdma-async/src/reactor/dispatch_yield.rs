//! When a task that dispatches completions to the operations waiting for them (an
//! `RdmaConnection`'s completion task) lets those operations run.
//!
//! The operations it wakes may run on its own thread (a current-thread runtime, or this
//! worker's queue). Once half of what is in flight waits for its operation to run, the task
//! yields so that they post their next requests before it spins for more; otherwise it holds
//! the thread for its busy-poll windows while the queue it watches runs dry.

/// The completions a dispatching task handed out since it last let other tasks run.
#[derive(Debug, Default)]
pub(crate) struct DispatchYield {
    woken_unrun: usize,
}

impl DispatchYield {
    /// `woken` more operations were woken, with `outstanding` work requests in flight: whether
    /// the task yields now.
    pub(crate) fn dispatched(&mut self, woken: usize, outstanding: usize) -> bool {
        self.woken_unrun += woken;
        if self.woken_unrun * 2 >= outstanding {
            self.woken_unrun = 0;
            true
        } else {
            false
        }
    }
}
