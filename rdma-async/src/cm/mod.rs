//! Connection management (librdmacm) as futures.
//!
//! Every rdma_cm id gets its own event channel, registered with Tokio's reactor; a listener's
//! channel reports connection requests, and each request's id is moved onto a channel of its
//! own as soon as it is read (as rsockets does), so one reader per channel demultiplexes events
//! to the id they belong to. Address and route resolution, connect, accept, reject and
//! disconnect are futures; their failures map onto the `io::ErrorKind`s a `TcpStream` user
//! expects, with a [`CmError`] inside that names the event.
//!
//! | rdma_cm outcome | `io::ErrorKind` |
//! |---|---|
//! | no `/dev/infiniband/rdma_cm`, no device | `NotFound` ("no RDMA device: ...") |
//! | `REJECTED` (no listener, or the peer rejected) | `ConnectionRefused` |
//! | `UNREACHABLE` (no answer to the request) | `TimedOut` |
//! | `ADDR_ERROR` / `ROUTE_ERROR` | the errno's kind (`TimedOut`, `HostUnreachable`, `NetworkUnreachable`, `AddrNotAvailable`) |
//! | `CONNECT_ERROR`, `DISCONNECTED` during the handshake | `ConnectionAborted` |
//! | `DISCONNECTED` on an established connection | reads: `ConnectionReset`; writes: `BrokenPipe` |

// Besides the futures: the wait on an established connection. `ConnWaiter` sleeps until its
// completion queue or its rdma_cm channel (`CmWatch`) has something; `SlotQueue` is a work queue
// of registered slots built on it (`Endpoint`'s and `RDatagram`'s queues).
pub(crate) mod accept_failure;
mod conn_waiter;
mod error;
pub(crate) mod event_steps;
mod events;
pub(crate) mod handshake;
mod id_options;
pub(crate) mod link;
pub(crate) mod listener;
mod listener_options;
mod params;
#[cfg(rdma_async_hooks)]
mod parked;
pub(crate) mod peer_warnings;
pub(crate) mod queue_setters;
pub(crate) mod reject_reason;
mod request;
pub(crate) mod resolve;
mod slot_queue;
mod watch;

pub(crate) use conn_waiter::{ConnWaiter, Woken};
pub use error::CmError;
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use error::event_error;
pub(crate) use events::CmEvents;
pub use id_options::IdOptions;
pub use listener::CmListener;
pub use listener_options::ListenerOptions;
pub use params::{
    ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA,
};
#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub use parked::{ParkedConnect, ParkedOutcome};
pub use request::ConnectRequest;
#[cfg(rdma_async_hooks)]
pub(crate) use slot_queue::REAP_LIMIT;
pub(crate) use slot_queue::{SlotQueue, Slots};
pub(crate) use watch::CmWatch;
