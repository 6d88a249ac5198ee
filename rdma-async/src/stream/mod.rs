//! Byte streams over RDMA that speak rsockets' wire protocol: [`RStream`] and [`RListener`],
//! drop-ins for Tokio's `TcpStream` and `TcpListener`, whose peer may be a C program using
//! librdmacm's rsockets (`rstream`, or anything under `librspreload`).
//!
//! ```no_run
//! use rdma_async::stream::{RListener, RStream};
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let listener = RListener::bind("10.77.0.1:7471").await?;
//! tokio::spawn(async move {
//!     let (mut stream, _peer) = listener.accept().await?;
//!     let mut buf = vec![0; 4096];
//!     loop {
//!         let n = stream.read(&mut buf).await?;
//!         if n == 0 {
//!             break; // the peer shut down writing
//!         }
//!         stream.write_all(&buf[..n]).await?; // echo
//!     }
//!     stream.shutdown().await // rsockets SHUTDOWN: the peer reads EOF
//! });
//!
//! let mut client = RStream::connect("10.77.0.1:7471").await?;
//! client.write_all(b"ping").await?;
//! client.shutdown().await?; // half-close, as with TCP
//! let mut reply = Vec::new();
//! client.read_to_end(&mut reply).await?;
//! assert_eq!(reply, b"ping");
//! # Ok(()) }
//! ```
//!
//! # Without copies
//!
//! [`RStream::write_region`] sends a registered region's bytes by RDMA write straight into the
//! peer's ring. With [`RStreamOptions::zero_copy_reads`], [`RStream::read_lent`] and
//! [`RStream::read_lent_exact`] hand out received bytes where they landed, in the receive ring
//! ([`LentBytes`]): the peer's access to that half of the ring is revoked first, so nothing can
//! change the bytes while you hold them, and dropping them returns the space and the peer's
//! credits. The peer cannot tell either apart from ordinary rsockets traffic.
//!
//! ```no_run
//! use rdma_async::stream::{RStream, RStreamOptions};
//!
//! # async fn demo() -> std::io::Result<()> {
//! let options = RStreamOptions::new().zero_copy_reads(true);
//! let mut stream = RStream::connect_with("10.77.0.1:7471", &options).await?;
//! // A 1 MiB message: pieces end where a half of the ring ends.
//! let mut left = 1 << 20;
//! while left > 0 {
//!     let piece = stream.read_lent_exact(left).await?;
//!     left -= piece.len(); // use `&piece[..]` in place; dropping it gives the space back
//! }
//! # Ok(()) }
//! ```
//!
//! # Options, accepting, descriptors and errors
//!
//! [`RStreamOptions`] carries rsockets' knobs: ring sizes (`SO_SNDBUF`/`SO_RCVBUF`; rsockets' `n`
//! gives `2n`-byte rings), `RDMA_SQSIZE`, `RDMA_RQSIZE`, `RDMA_INLINE`, the busy-poll time, and
//! keepalive (rsockets' `SO_KEEPALIVE`: a 0-byte RDMA write every interval, so a dead peer surfaces
//! as an error). The defaults are rsockets' (128 KiB rings, 384-deep queues, 64 B inline, 10 µs),
//! overridden by the files rsockets reads under `/etc/rdma/rsocket` (`mem_default`, `wmem_default`,
//! `sqsize_default`, `rqsize_default`, `inline_default`, `polling_time`).
//!
//! Accepting is bounded the way a TCP server's is. `RListener` runs up to 64 handshakes at once,
//! each in a task of its own and each bounded by `accept_timeout` (on every options type, 10 s by
//! default; `Endpoint::accept` and `RdmaConnection::accept` have the same bound): a peer that sends
//! a connection request and never completes the handshake is rejected when it passes, so silent
//! peers cannot hold the slots. Without it the wait for the peer's last handshake packet is
//! rdma_cm's, whose length comes from the client's own request (its CM response timeout and retry
//! count), so a hostile client chooses it (with librdmacm clients it had not ended after 3 minutes
//! in the test guest); 10 s is many round trips even on emulated Soft-RoCE and lets a handshake
//! survive two lost packets (rdma_cm resends an unanswered accept every 4.3 s). A handshake pins
//! its stream's rings from its answer on, so one address may hold all but an eighth of the slots
//! and, under a locked-memory limit, handshakes in progress pin at most half of it; requests past
//! either bound are rejected at once with the reason (see `RListener`). `RListener::accept`
//! returns, like `TcpListener::accept`, the error of a request this host could not set up (out of
//! file descriptors, `EMFILE`; memory; queue pairs): that request is rejected and the listener
//! stays usable. Handshakes a peer broke (connection data that is not rsockets', no answer in time,
//! a peer that gave up) are logged at `warn` and skipped. `into_incoming()` (tonic's
//! `serve_with_incoming`) and the axum listener never end on one request's failure, only on the
//! listener's own (its device removed).
//!
//! Each `RStream` holds 2 file descriptors, as a C rsockets socket does: its rdma_cm event
//! channel and its completion channel, each registered once with Tokio's reactor (every task
//! that waits on one, the reading and the writing side among them, has a slot on that one
//! registration, and its wake-ups reach each). With
//! [`RStreamOptions::shared_channels`] a stream holds 1, its rdma_cm event channel: the
//! completion queues of all such streams on one device and runtime report to one shared
//! completion channel, read by a task of the runtime that wakes each event's stream (a
//! dispatch per event). A listener holds 1, and the process 1 per RDMA device it opened. Both
//! ends of a connection in one process take 4 (2 with shared channels), so 512 connections
//! (1,024 with them) need a descriptor limit above the common 1024 (`ulimit -n`).
//!
//! Errors are `io::Error`s with the kinds a `TcpStream` user expects: no listener or a rejection →
//! `ConnectionRefused` (with the peer's reject private data in a `cm::CmError` inside), an
//! unanswered peer → `TimedOut`, a peer that closed → EOF then `BrokenPipe` on write, a peer that
//! vanished → `ConnectionReset`/`TimedOut`, a peer speaking something other than rsockets v1 →
//! `InvalidData`, no RDMA device → `NotFound` "no RDMA device: ...". The table is in the
//! [`cm`](crate::cm) module docs.
//!
//! A peer that disconnects without closing its stream (rsockets' DISCONNECT or SHUTDOWN never
//! came: it was killed, exited without dropping the stream, or its connection failed) may have
//! written bytes that never arrived, so every byte that did arrive is read and then the read
//! fails with `ConnectionReset`, never a clean end-of-stream (C rsockets reads end-of-stream
//! there). More in [`RStream`]'s "Closing" section and the repository's
//! `docs/failure-behaviour.md`.
//!
//! # TLS
//!
//! TLS runs on `RStream` as on `TcpStream`: wrap the stream in tokio-rustls
//! (`TlsConnector::connect(name, stream)`, `TlsAcceptor::accept(stream)`; `examples/tls_echo.rs`),
//! or give tonic its `ServerTlsConfig` / `ClientTlsConfig` and an `https://` URI with
//! `connect_with_connector(RConnector::new())`. HTTP/2 goes with prior knowledge
//! (`.http2_only(true)`): rdma_cm has no ALPN, though TLS's own ALPN works as over TCP. Examples:
//! `examples/http_server.rs`, `http_client.rs`, `axum_app.rs`, `greeter_server.rs` and
//! `greeter_client.rs` (tonic; unary and server-streaming, generated from
//! `examples/proto/greeter.proto` with a vendored protoc, so no system protoc is needed).

mod admission;
mod deadline_timer;
mod driver;
mod gather;
#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub mod hooks;
mod lending_ring;
mod lent_bytes;
mod linger;
mod listener;
mod options;
mod region_write;
mod rstream;
mod side_wakers;
mod split;
mod stats;

/// Two drivers over the in-process fake device, for the fuzz harness (`crate::fuzzing`).
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use driver::{FakeStreams, SPARE_RECVS};
pub use lent_bytes::LentBytes;
pub use listener::{Incoming, RListener};
pub use options::RStreamOptions;
pub use rstream::RStream;
pub use split::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, ReuniteError, WriteHalf};
pub use stats::StreamStats;
