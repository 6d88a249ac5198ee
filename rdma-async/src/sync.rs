//! The atomics and locks of the types that the loom model checks cover: std's (and, for the
//! locks on the data and sleep paths, `parking_lot`'s: [`Lock`]), or, in the host tests built
//! with `--cfg rdma_async_loom`, loom's, so that those checks run the real code through every
//! interleaving of their threads (`docs/testing.md`, "Model checking").
//!
//! Re-exports, but for [`Lock`], whose normal build is `parking_lot`'s mutex with nothing in
//! between but an inlined call. `Arc` stays std's: the types hand themselves to
//! `Waker::from`, which takes only std's.

#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// A mutex without poisoning, for the locks that every message or every sleep takes (the
/// stream's state, a completion channel's fan-out, a stream side's wakers, an rdma_cm watch's
/// relay, a connection's record of its rdma_cm events): `parking_lot`'s, whose lock and unlock
/// are one atomic instruction each, inlined (std's checks whether the thread is panicking on
/// each, which cost as much as its atomics);
/// loom's under the model checks, a poisoned one taken as it is. Its holders keep what it
/// guards consistent before anything that could panic, so there is nothing to poison.
#[derive(Debug)]
pub(crate) struct Lock<T> {
    #[cfg(not(all(test, rdma_async_loom)))]
    inner: parking_lot::Mutex<T>,
    #[cfg(all(test, rdma_async_loom))]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`Lock`]: its value, held until dropped.
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) type LockGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
/// The guard of a [`Lock`]: its value, held until dropped.
#[cfg(all(test, rdma_async_loom))]
pub(crate) type LockGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> Lock<T> {
    pub(crate) fn new(value: T) -> Self {
        Lock {
            #[cfg(not(all(test, rdma_async_loom)))]
            inner: parking_lot::Mutex::new(value),
            #[cfg(all(test, rdma_async_loom))]
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// The value, waiting for it if another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> LockGuard<'_, T> {
        #[cfg(not(all(test, rdma_async_loom)))]
        return self.inner.lock();
        #[cfg(all(test, rdma_async_loom))]
        return self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }

    /// The value if no other thread holds it.
    #[inline]
    pub(crate) fn try_lock(&self) -> Option<LockGuard<'_, T>> {
        #[cfg(not(all(test, rdma_async_loom)))]
        return self.inner.try_lock();
        #[cfg(all(test, rdma_async_loom))]
        return match self.inner.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        };
    }
}

impl<T: Default> Default for Lock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}
