//! The stream's state lock, counting the threads blocked on it.
//!
//! A task that busy-polls the completion queue does so holding the stream's state. The other
//! half of a split stream, on another worker, may want that state meanwhile: it raises the count
//! before it blocks, and the spinning holder, which reads the count between looks at the queue,
//! stops spinning and lets go. The count is only a hint (a holder that misses it spins out its
//! window, which is bounded), so it needs no ordering beyond its own.
//!
//! Every write and read call takes it, so it is `parking_lot`'s mutex, not std's: no poisoning
//! (std's checks whether the thread is panicking when it locks and again when it unlocks, which
//! cost a streamed 64 B message as much as the lock's atomics), and an uncontended lock and
//! unlock of one atomic instruction each, inlined. A panic under the lock leaves the state as
//! std's poisoned lock was taken here anyway: its holders keep it consistent before anything
//! that could panic. Under loom the lock is loom's, so that the model checks cover it.

use std::sync::atomic::Ordering;

use crate::sync::AtomicU32;

#[cfg(all(test, rdma_async_loom))]
use loom::sync::Mutex;
#[cfg(not(all(test, rdma_async_loom)))]
use parking_lot::Mutex;

/// The guard of a [`CountedLock`]: its value, held until dropped.
#[cfg(not(all(test, rdma_async_loom)))]
pub(in crate::stream) type CountedGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
/// The guard of a [`CountedLock`]: its value, held until dropped.
#[cfg(all(test, rdma_async_loom))]
pub(in crate::stream) type CountedGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

/// A mutex whose blocked lockers are counted while they wait.
#[derive(Debug)]
pub(in crate::stream) struct CountedLock<T> {
    inner: Mutex<T>,
    /// Threads inside [`Self::lock`] that found the mutex held and block for it.
    waiters: AtomicU32,
}

impl<T> CountedLock<T> {
    pub(in crate::stream) fn new(value: T) -> Self {
        CountedLock {
            inner: Mutex::new(value),
            waiters: AtomicU32::new(0),
        }
    }

    /// The value, waiting for it if another thread holds it (counted meanwhile).
    #[inline]
    pub(in crate::stream) fn lock(&self) -> CountedGuard<'_, T> {
        match try_lock(&self.inner) {
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
        let guard = lock(&self.inner);
        self.waiters.fetch_sub(1, Ordering::Relaxed);
        guard
    }

    /// The count of blocked lockers, for a holder's spin to read.
    pub(in crate::stream) fn waiters(&self) -> &AtomicU32 {
        &self.waiters
    }
}

/// The value if no other thread holds it.
#[cfg(not(all(test, rdma_async_loom)))]
#[inline]
fn try_lock<T>(mutex: &Mutex<T>) -> Option<CountedGuard<'_, T>> {
    mutex.try_lock()
}

/// The value, waiting for it.
#[cfg(not(all(test, rdma_async_loom)))]
fn lock<T>(mutex: &Mutex<T>) -> CountedGuard<'_, T> {
    mutex.lock()
}

/// The value if no other thread holds it (a poisoned lock taken as it is, as above).
#[cfg(all(test, rdma_async_loom))]
fn try_lock<T>(mutex: &Mutex<T>) -> Option<CountedGuard<'_, T>> {
    match mutex.try_lock() {
        Ok(guard) => Some(guard),
        Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// The value, waiting for it (a poisoned lock taken as it is, as above).
#[cfg(all(test, rdma_async_loom))]
fn lock<T>(mutex: &Mutex<T>) -> CountedGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
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
