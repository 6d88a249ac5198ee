//! The atomics and locks of the types that the loom model checks cover: std's (and, for the
//! waker lists, `parking_lot`'s: [`WakerLock`]), or, in the host tests built with
//! `--cfg rdma_async_loom`, loom's, so that those checks run the real code through every
//! interleaving of their threads (`docs/testing.md`, "Model checking").
//!
//! Re-exports, but for [`WakerLock`], whose normal build is `parking_lot`'s mutex with nothing
//! in between but an inlined call. `Arc` stays std's: the types hand themselves to
//! `Waker::from`, which takes only std's.

#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};

/// The lock of a list of wakers that every sleep and every wake-up takes (a completion
/// channel's fan-out, a stream side's wakers, an rdma_cm watch's relay): `parking_lot`'s mutex,
/// whose lock and unlock are one atomic instruction each, inlined, with no poisoning to check
/// (std's checks whether the thread is panicking on each, which cost as much as its atomics);
/// loom's under the model checks. A waker list has nothing a panic could leave half-updated.
#[derive(Debug)]
pub(crate) struct WakerLock<T> {
    #[cfg(not(all(test, rdma_async_loom)))]
    inner: parking_lot::Mutex<T>,
    #[cfg(all(test, rdma_async_loom))]
    inner: loom::sync::Mutex<T>,
}

/// The guard of a [`WakerLock`].
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) type WakerGuard<'a, T> = parking_lot::MutexGuard<'a, T>;
/// The guard of a [`WakerLock`].
#[cfg(all(test, rdma_async_loom))]
pub(crate) type WakerGuard<'a, T> = loom::sync::MutexGuard<'a, T>;

impl<T> WakerLock<T> {
    pub(crate) fn new(value: T) -> Self {
        WakerLock {
            #[cfg(not(all(test, rdma_async_loom)))]
            inner: parking_lot::Mutex::new(value),
            #[cfg(all(test, rdma_async_loom))]
            inner: loom::sync::Mutex::new(value),
        }
    }

    /// The value, waiting for it if another thread holds it.
    #[inline]
    pub(crate) fn lock(&self) -> WakerGuard<'_, T> {
        #[cfg(not(all(test, rdma_async_loom)))]
        return self.inner.lock();
        #[cfg(all(test, rdma_async_loom))]
        return self
            .inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
    }
}

impl<T: Default> Default for WakerLock<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}
