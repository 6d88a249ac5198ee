//! A waker that counts its wake-ups, for the host tests of the types that hold and wake wakers.
//! (The loom checks keep their own, on loom's atomics.)

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Wake, Waker};

/// How many times the waker of [`counting_waker`] was woken.
#[derive(Debug, Default)]
pub(crate) struct WakeCount(AtomicUsize);

impl WakeCount {
    pub(crate) fn get(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }
}

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// A waker and the count of its wake-ups.
pub(crate) fn counting_waker() -> (Arc<WakeCount>, Waker) {
    let count = Arc::new(WakeCount::default());
    (count.clone(), Waker::from(count))
}
