//! What registers with Tokio's reactor: completion queues whose completions wake tasks
//! ([`AsyncCq`]), per-task registrations of channel descriptors ([`FdWaiter`]), the order of
//! sends that signal only some work requests ([`SendOrder`]), and the busy-poll and yield
//! policies of a wait.
//!
//! The verbs objects themselves (`crate::verbs`) know nothing of Tokio; this module turns their
//! channel descriptors into readiness that tasks can wait for. Waiting on a connection (its
//! completions and its rdma_cm events together) is `crate::cm`'s, one floor up.

mod arm_state;
mod completion_queue;
mod fd_waiter;
mod miss_backoff;
mod send_order;
mod spin_policy;
mod spin_window;
mod yield_policy;

pub(crate) use completion_queue::{AsyncCq, BeforeSleep, WaitHints};
pub(crate) use fd_waiter::FdWaiter;
pub(crate) use send_order::SendOrder;
pub(crate) use spin_policy::SpinPolicy;
pub(crate) use yield_policy::WaitYields;
