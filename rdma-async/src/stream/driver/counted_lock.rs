//! The stream's state lock, counting the threads blocked on it.
//!
//! A task that busy-polls the completion queue does so holding the stream's state. The other
//! half of a split stream, on another worker, may want that state meanwhile: it raises the count
//! before it blocks, and the spinning holder, which reads the count between looks at the queue,
//! stops spinning and lets go. The count is only a hint (a holder that misses it spins out its
//! window, which is bounded), so it needs no ordering beyond its own.
//!
//! Every write and read call takes it, so it is the crate's mutex without poisoning
//! ([`Lock`]: `parking_lot`'s, loom's under the model checks): std's checks for a panicking
//! thread cost a streamed 64 B message as much as the lock's atomics.

use std::sync::atomic::Ordering;

use crate::sync::{AtomicU32, Lock, LockGuard};

/// The guard of a [`CountedLock`]: its value, held until dropped.
pub(in crate::stream) type CountedGuard<'a, T> = LockGuard<'a, T>;

/// A mutex whose blocked lockers are counted while they wait.
#[derive(Debug)]
pub(in crate::stream) struct CountedLock<T> {
    inner: Lock<T>,
    /// Threads inside [`Self::lock`] that found the mutex held and block for it.
    waiters: AtomicU32,
}

impl<T> CountedLock<T> {
    pub(in crate::stream) fn new(value: T) -> Self {
        CountedLock {
            inner: Lock::new(value),
            waiters: AtomicU32::new(0),
        }
    }

    /// The value, waiting for it if another thread holds it (counted meanwhile).
    #[inline]
    pub(in crate::stream) fn lock(&self) -> CountedGuard<'_, T> {
        match self.inner.try_lock() {
            Some(guard) => guard,
            None => self.lock_contended(),
        }
    }

    /// [`Self::lock`] once the mutex was found held: out of line, as it is rare.
    #[cold]
    #[inline(never)]
    fn lock_contended(&self) -> CountedGuard<'_, T> {
        // Raised before blocking, so that a holder spinning under the lock sees it.
        self.waiters.fetch_add(1, Ordering::Relaxed);
        let guard = self.inner.lock();
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        guard
    }

    /// The count of blocked lockers, for a holder's spin to read.
    pub(in crate::stream) fn waiters(&self) -> &AtomicU32 {
        &self.waiters
    }
}

#[cfg(all(test, rdma_async_loom))]
mod loom_tests {
    //! Under loom, the hand-off of a busy-poll: a holder that spins until it sees a blocked
    //! locker (as the stream's wait does, its window aside) and a thread that locks meanwhile.

    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use loom::thread;

    use super::*;

    /// The holder spins with no window: only the count can end its spin, so in an interleaving
    /// where a blocked locker were not counted (the count raised after the lock is taken, or
    /// never), the spin would never end and loom would fail the run.
    #[test]
    fn loom_a_holder_spinning_under_the_lock_sees_the_thread_blocked_on_it() {
        loom::model(|| {
            let lock = Arc::new(CountedLock::new(0u32));
            let mut held = lock.lock();
            let locker = {
                let lock = lock.clone();
                thread::spawn(move || {
                    let mut value = lock.lock();
                    *value += 1;
                })
            };
            while lock.waiters().load(Ordering::Relaxed) == 0 {
                thread::yield_now();
            }
            *held += 1;
            drop(held);
            locker.join().unwrap();
            assert_eq!(*lock.lock(), 2, "an update under the lock was lost");
            assert_eq!(
                lock.waiters().load(Ordering::Relaxed),
                0,
                "a locker stayed counted after it got the lock"
            );
        });
    }
}
