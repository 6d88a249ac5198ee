//! What registers with Tokio's reactor: completion queues whose completions wake tasks
//! ([`AsyncCq`]) and per-task registrations of channel descriptors ([`FdWaiter`]).
//!
//! The verbs objects themselves (`crate::verbs`) know nothing of Tokio; this module turns their
//! channel descriptors into readiness that tasks can wait for.

mod completion_queue;
mod fd_waiter;

pub(crate) use completion_queue::{AsyncCq, wc_error};
pub(crate) use fd_waiter::FdWaiter;
