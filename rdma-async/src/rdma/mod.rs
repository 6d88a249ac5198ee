//! Verbs-level RDMA on registered memory: [`RdmaConnection`] sends and receives messages, reads
//! and writes the peer's memory one-sidedly, and applies atomics to it.
//!
//! The safety model is ownership passing, as in `tokio-uring`:
//!
//! - Registered memory is an owned value: [`LocalRegion`] (no peer can reach it; derefs to
//!   `[u8]`) or [`SharedRegion`] (a peer may access it through its [`RemoteRegion`]; bytes move
//!   in and out by copying only, since the peer may write at any time).
//! - Every operation takes its region **by value** and returns it with the result, so the memory
//!   cannot be used while the device owns it (a compile error, not a data race).
//! - A posted operation's memory sits in a slot of the connection's table of outstanding work
//!   requests; the future only borrows the slot. Dropping the future leaves the memory there
//!   until the completion arrives, and dropping the connection flushes the queue pair and frees
//!   the memory only after the flush completions (or after destroying the queue pair).
//!
//! - A [`BoundWindow`] grants a peer part of a [`LocalRegion`] through a memory window until an
//!   invalidation revokes it; it holds the region meanwhile, and gives it back only once the
//!   peer can no longer reach it (never, when that cannot be known: see [`WindowError`]).
//!
//! The cost per operation over a raw `ibv_post_send`: a place in the queue (a counter of its depth), one
//! uncontended mutex for the slot table at post, completion and pick-up, and either a busy poll
//! of the completion queue by the operation itself (when it is the only one on its queue and its
//! completion comes within the window; now and then it first lets the tasks ready on its thread
//! run, in case they post beside it) or one wake-up from the connection's completion task.
//! Send-queue operations posted while others are outstanding share doorbells: those of one
//! scheduler pass go to the device with one `ibv_post_send`
//! ([`RdmaConnection::post_send_calls`]). Where one task has many writes ready at once,
//! [`RdmaConnection::write_batch`] posts them as one list with one signaled completion: the
//! future, the table slot, the completion and the wake-up are then the batch's, not each
//! write's (a 64 B write at depth 64 costs about half as many instructions in batches of 16).
//!
//! ```no_run
//! use rdma_async::cm::CmListener;
//! use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteAccess};
//!
//! # async fn demo() -> std::io::Result<()> {
//! // Server: a region the client may write, advertised in a message.
//! let listener = CmListener::bind("10.77.0.1:7471").await?;
//! let conn = RdmaConnection::accept(listener.accept_request().await?, &RdmaOptions::new()).await?;
//! let target = conn.reg_write(1 << 20)?;
//! let mut msg = conn.reg_msgs(16)?;
//! msg.copy_from_slice(&target.remote().to_bytes());
//! let (sent, _msg) = conn.send(msg, ..).await;
//! sent?;
//! // ... the client writes with immediate; its receive says when the data is there.
//! let done = conn.recv_imm().await?;
//! let data = target.to_vec();
//! # let _ = (done, data);
//! # Ok(()) }
//! ```

mod completion_task;
mod connection;
pub(crate) mod dialing;
mod options;
mod queue_slots;
mod reaping;
mod received;
mod srq;
mod window;
mod window_error;

pub use crate::memory::{
    LocalRegion, RegisteredBytes, RemoteAccess, RemoteRegion, RemoteSlice, SharedRegion,
};
pub use connection::RdmaConnection;
#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub use connection::hooks;
pub use options::RdmaOptions;
pub use received::{Received, ReceivedOp};
pub use srq::SharedReceiveQueue;
pub use window::BoundWindow;
pub use window_error::WindowError;
