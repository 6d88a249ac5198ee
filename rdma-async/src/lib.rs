//! # rdma-async
//!
//! Async, Tokio-native RDMA. librdmacm's event channels and libibverbs' completion channels are
//! registered with Tokio's reactor, so connection management (address and route resolution,
//! connect, listen, accept, reject, disconnect) is a set of futures and completions wake the
//! tasks waiting for them.
//!
//! - [`cm`]: connection management: [`cm::CmListener`], [`cm::ConnectRequest`],
//!   [`cm::ConnParams`] (private data, retry counts, initiator depth, responder resources).
//! - [`endpoint`]: [`endpoint::Endpoint`], messages over a reliable connected queue pair.
//! - [`datagram`]: [`datagram::RDatagram`], unreliable datagrams and multicast, used like
//!   `tokio::net::UdpSocket`.
//! - [`rdma`]: [`rdma::RdmaConnection`], verbs-level operations on registered memory: sends and
//!   receives, one-sided RDMA reads and writes, atomics, with ownership-passing buffers.
//! - [`device`]: the RDMA devices of this machine.
//! - [`error`]: what the `io::Error`s carry: [`error::CompletionError`], a connection's
//!   reported-again [`error::EarlierFailure`], and [`error::cause`] to find either.
//! - [`stream`]: [`stream::RStream`] and [`stream::RListener`], byte streams that speak
//!   rsockets' wire protocol.
//! - `integration` (features `hyper`, `axum`, `tonic`, off by default): hyper-util's pooled
//!   client, `axum::serve` and tonic's server and channel over [`stream::RStream`] /
//!   [`stream::RListener`].
//! - [`test`] and [`main`]: attributes that run async tests and programs on a Tokio runtime,
//!   with `#[tokio::test]`'s and `#[tokio::main]`'s defaults; `#[rdma_async::test]` skips, or
//!   with `RDMA_ASYNC_REQUIRE_DEVICE=1` fails, where the machine has no RDMA device. Tokio's
//!   multi-thread runtime comes with the `rt-multi-thread` feature (on by default); without it
//!   the library runs on current-thread runtimes only, and the attributes say so.
//!
//! ```no_run
//! use rdma_async::cm::{CmListener, ConnParams};
//! use rdma_async::endpoint::{Endpoint, EndpointOptions};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let listener = CmListener::bind("10.77.0.1:7471").await?;
//! tokio::spawn(async move {
//!     let request = listener.accept_request().await?;
//!     let server = Endpoint::accept(request, &EndpointOptions::new()).await?;
//!     let msg = server.recv().await?;
//!     server.send(&msg).await?; // echo
//!     server.closed().await
//! });
//! let opts = EndpointOptions::new().conn_params(ConnParams::new().private_data(*b"hello"));
//! let client = Endpoint::connect_with("10.77.0.1:7471", &opts).await?;
//! client.send(b"ping").await?;
//! assert_eq!(&client.recv().await?[..], b"ping");
//! client.disconnect().await?;
//! # Ok(()) }
//! ```
//!
//! # Options
//!
//! Every type has a plain constructor with the defaults (`connect(addr)`, `bind(addr)`) and a
//! `*_with` one (`connect_with(addr, &options)`, `bind_with(addr, &options)`, `accept(request,
//! &options)`) that takes its options struct by reference. The same options usually serve many
//! connections (a client that dials many peers, a listener whose every accepted connection
//! copies them), so a reference keeps them with the caller, reusable, without a `clone()` at
//! each call; the types that keep them copy what they need.
//!
//! # Tracing
//!
//! With a `tracing` subscriber at `debug` you see what the transport does, each event inside its
//! connection's span (peer, local address, queue pair number):
//!
//! ```text
//! DEBUG rdma_listener{local=10.77.0.1:38423}: rdma_async::cm::listener: listening
//! DEBUG rdma_listener{local=10.77.0.1:38423}: rdma_async::cm::request: connection request peer=10.77.0.1:43076 local=10.77.0.1:38423
//! DEBUG rdma_conn{peer=10.77.0.1:38423 local=10.77.0.1:43076 qp=17}: rdma_async::cm::handshake: connected
//! DEBUG rdma_conn{peer=10.77.0.1:43076 local=10.77.0.1:38423 qp=18}: rdma_async::cm::request: accepted
//! DEBUG rdma_conn{peer=10.77.0.1:38423 local=10.77.0.1:43076 qp=17}: rdma_async::cm::link: disconnecting
//! DEBUG rdma_conn{peer=10.77.0.1:38423 local=10.77.0.1:43076 qp=17}: rdma_async::cm::link: connection released
//!  WARN rdma_listener{local=10.77.0.1:38423}: rdma_async::stream::listener: rsocket handshake failed peer=10.77.0.1:36708 error=10.77.0.1:36708 sent invalid rsockets connection data (rejected): ...
//! ```
//!
//! Levels: `debug` for the life of connections and listeners (listen, connect, accept, reject,
//! disconnect, release, failed connects); `warn` for what a peer did wrong or what broke a
//! connection (failed handshakes, transport failures, protocol violations); `error` for a listener
//! whose device went away. Device asynchronous events (see [`device::events()`]) are logged with
//! target `rdma_async::device::events` and fields `device`, `event`, `port`, `qp`: `error` for
//! fatal queue pair, completion queue and device events, `warn` for a port going down, `info` for
//! a port coming up, `debug` for the rest.
//!
//! All `unsafe` code lives in `rdma-async-sys` and in this crate's private `verbs` module.
//!
//! # Floors
//!
//! The modules stand on floors, lowest first; a module uses only modules on lower floors (a
//! test, `tests/module_floors.rs`, reads the sources and holds them to this list):
//!
//! 1. `sync`: the atomics and locks that the loom model checks replace (`--cfg rdma_async_loom`).
//! 2. `wake_count`: a waker that counts its wake-ups, for the host tests (test builds only).
//! 3. `error`: what the crate's `io::Error`s carry, and the helpers that build them.
//! 4. `verbs`: RAII owners of the C objects of libibverbs and librdmacm; all the `unsafe`.
//! 5. `proto`: rsockets' wire protocol as a state machine, without I/O (sans-IO).
//! 6. `reactor`: completion queues registered with Tokio, and the busy-poll and yield policies.
//! 7. `memory`: registered memory as owned values (`LocalRegion`, `SharedRegion`,
//!    `RemoteRegion`) and the range checks on it.
//! 8. `device`: the machine's devices, their contexts, pools and events.
//! 9. `cm`: connection management: resolving, connecting, listening, and waiting on a
//!    connection's completions and rdma_cm events together.
//! 10. `rdma`: `RdmaConnection`, verbs-level operations on registered memory.
//! 11. `endpoint`: `Endpoint`, messages over a reliable connection.
//! 12. `stream`: `RStream` and `RListener`, the rsockets byte stream.
//! 13. `datagram`: `RDatagram`, unreliable datagrams and multicast.
//! 14. `integration`: hyper, axum and tonic over `RStream`.
//! 15. `fuzzing`: the fuzz harnesses of the decoders of peer input.
//!
//! # Words for memory that changes hands
//!
//! Each way memory passes between the application, the device and the peer has its own word:
//!
//! - **lend**: a stream lends received bytes to the reader where they landed, in its receive
//!   ring, without a copy (`RStream::read_lent` → `LentBytes`; in `proto`, `Connection::lend`
//!   → `LendStep`, from `Receiver::lend`). Dropping the lent bytes gives the space back.
//! - **view**: what the verbs floor hands out for a lend: `OwnedBufferQueuePair::view` opens a
//!   `BufferView` of bytes that no key a peer holds and no work request can write
//!   (`RemoteGrants::open_view`), and no memory window is bound over them until it closes.
//! - **grant** and **revoke**: a peer is granted write access to ring bytes by sending it a
//!   registration's or a memory window's key; revoking (deregistering, invalidating) takes it
//!   back before those bytes are lent.
//! - **attach**: a caller's registered buffer is attached to an `OwnedBufferQueuePair`
//!   (`attach` returns its attach id, which work requests name as `Payload::Attached`) so the
//!   device sends from it or receives into it without a copy (`RStream::write_region`, an
//!   `Endpoint`'s sends from regions and receives into pool buffers); `reclaim` takes it back
//!   once the completion of the last request that named it was polled.
//! - **hold**: a `CallerMemoryQueuePair` holds the buffers of `rdma::RdmaConnection`'s
//!   operations in its in-flight table (`Held`) from the post until the completion is polled.

#![warn(missing_docs)]
// docs.rs: mark items that need a cargo feature.
#![cfg_attr(docsrs, feature(doc_cfg))]
// `unsafe` is confined to `verbs`; everything else is safe code over its owners.
#![deny(unsafe_code)]

pub mod cm;
pub mod datagram;
pub mod device;
pub mod endpoint;
pub mod error;
#[cfg(any(feature = "hyper", feature = "axum"))]
pub mod integration;
mod memory;
pub(crate) mod proto;
pub mod rdma;
mod reactor;
pub mod stream;
mod sync;
#[allow(unsafe_code)]
mod verbs;
#[cfg(test)]
mod wake_count;

#[cfg(feature = "rt-multi-thread")]
pub use rdma_async_macros::{main, test};
// Without Tokio's multi-thread runtime, the attributes that refuse it by name.
#[cfg(not(feature = "rt-multi-thread"))]
pub use rdma_async_macros::{main_rt as main, test_rt as test};

#[cfg(any(test, rdma_async_fuzzing))]
mod fuzzing;

#[cfg(rdma_async_fuzzing)]
#[doc(hidden)]
pub mod __fuzz {
    //! The harnesses of the fuzz targets in `fuzz/`, compiled only under `--cfg
    //! rdma_async_fuzzing` (which `scripts/fuzz` sets): each drives one of the crate's decoders
    //! or the stream driver with the fuzzer's bytes and panics when an invariant breaks. A cfg,
    //! not a cargo feature, so that no crate depending on this one can switch it on.
    pub use crate::fuzzing::*;
}

#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub mod __test_hooks {
    //! Internal types that the compile-fail cases in `tests/ui/test_hooks` name (their methods
    //! stay crate-private), and the failure injection of the resource-limit tests. Never needed
    //! by users. Like each transport's `hooks` module (`stream::hooks`, `endpoint::hooks`,
    //! `rdma::hooks`, `datagram::hooks`), it exists only under `--cfg rdma_async_hooks`, which
    //! this repository's `.cargo/config.toml` sets for its own builds and no dependency can.
    pub use crate::device::events::inject_event;
    pub use crate::verbs::fault_injection::{Teardown, fail_next, fail_next_teardown};
    pub use crate::verbs::{CallerMemoryQueuePair, OwnedBufferQueuePair, Resource};
}

#[doc(hidden)]
pub mod __private {
    //! Used by the code `#[rdma_async::test]` and `#[rdma_async::main]` expand to.
    pub use tokio;

    /// `Ok` when this machine has a usable RDMA device, otherwise why not.
    pub fn rdma_device_check() -> Result<(), String> {
        crate::device::check()
    }

    /// Whether `RDMA_ASYNC_REQUIRE_DEVICE=1` asks device tests to fail rather than skip.
    pub fn device_required_by_env() -> bool {
        std::env::var_os("RDMA_ASYNC_REQUIRE_DEVICE").is_some_and(|v| v == "1")
    }
}

/// The crate's README (its page on crates.io), compiled as doc examples so its snippet builds.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
