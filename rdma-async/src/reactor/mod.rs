//! What registers with Tokio's reactor: completion queues whose completions wake tasks
//! ([`AsyncCq`]), per-task registrations of channel descriptors ([`FdWaiter`]; [`CmWatch`] for
//! a connection's rdma_cm channel), the wait for a completion or a disconnect ([`ConnWaiter`]),
//! and work queues of registered slots built on them ([`SlotQueue`], with [`SendOrder`] for sends
//! that signal only some work requests).
//!
//! The verbs objects themselves (`crate::verbs`) know nothing of Tokio; this module turns their
//! channel descriptors into readiness that tasks can wait for.

mod arm_state;
mod cm_watch;
mod completion_queue;
mod conn_waiter;
mod fd_waiter;
mod miss_backoff;
mod send_order;
mod slot_queue;
mod spin_policy;
mod spin_window;
mod yield_policy;

pub(crate) use cm_watch::CmWatch;
pub(crate) use completion_queue::{AsyncCq, BeforeSleep, WaitHints};
pub(crate) use conn_waiter::{ConnWaiter, Woken};
pub(crate) use fd_waiter::FdWaiter;
pub(crate) use send_order::SendOrder;
pub(crate) use slot_queue::{SlotQueue, Slots};
pub(crate) use spin_policy::SpinPolicy;
pub(crate) use yield_policy::WaitYields;
