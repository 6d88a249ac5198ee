//! What registers with Tokio's reactor: completion queues whose completions wake tasks
//! ([`AsyncCq`]), one registration per channel descriptor that any number of tasks wait on ([`SharedFd`],
//! [`FdWaiter`]), or one completion channel shared by many queues whose events a dispatcher
//! routes to each queue's waiters ([`routed_channel`]), the order of
//! sends that signal only some work requests ([`SendOrder`]), and the busy-poll and yield
//! heuristics of a wait, all here: how long to spin ([`SpinPolicy`]), when a waiting task lets
//! others run ([`WaitYields`]), when an operation alone on its queue does ([`LoneYield`], by
//! [`run_ready_tasks`]), and when a task that dispatches completions lets the operations it
//! woke run ([`DispatchYield`]).
//!
//! The verbs objects themselves (`crate::verbs`) know nothing of Tokio; this module turns their
//! channel descriptors into readiness that tasks can wait for. Waiting on a connection (its
//! completions and its rdma_cm events together) is `crate::cm`'s, one floor up.

mod arm_state;
mod async_cq;
mod cq_waiter;
mod dispatch_yield;
mod fd_waiter;
mod lone_yield;
mod miss_backoff;
mod routed_channel;
mod send_order;
mod spin_policy;
mod spin_window;
mod yield_policy;

pub(crate) use async_cq::{AsyncCq, BeforeSleep, WaitHints};
pub(crate) use cq_waiter::CqWaiter;
pub(crate) use dispatch_yield::DispatchYield;
pub(crate) use fd_waiter::{FdWaiter, SharedFd};
pub(crate) use lone_yield::{LoneYield, run_ready_tasks};
pub(crate) use send_order::SendOrder;
pub(crate) use spin_policy::SpinPolicy;
pub(crate) use yield_policy::WaitYields;
