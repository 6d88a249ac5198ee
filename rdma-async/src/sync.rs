//! The atomics and locks of the types that the loom model checks cover: std's, or, in the host
//! tests built with `--cfg rdma_async_loom`, loom's, so that those checks run the real code
//! through every interleaving of their threads (`docs/testing.md`, "Model checking").
//!
//! Only re-exports: the normal build uses std's types themselves, with nothing in between.
//! `Arc` stays std's: the types hand themselves to `Waker::from`, which takes only std's.

#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(all(test, rdma_async_loom))]
pub(crate) use loom::sync::{Mutex, MutexGuard};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64};
#[cfg(not(all(test, rdma_async_loom)))]
pub(crate) use std::sync::{Mutex, MutexGuard};
