//! `RStream`: a byte stream over RDMA that speaks rsockets' wire protocol.

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};
use tokio::net::ToSocketAddrs;
use tracing::Instrument;

use super::driver::{self, Side, StreamCore};
use super::lent_bytes::LentBytes;
use super::linger;
use super::options::RStreamOptions;
use super::split::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf};
use super::stats::StreamStats;
use crate::cm::handshake;
use crate::cm::link::CmLink;
use crate::cm::{ConnParams, ConnectRequest};

/// Runs the protocol's deadlines (the keepalive every `interval`, and a blocked writer's
/// probe) while the stream lives and is connected. The task holds only a weak reference, so it
/// ends with the stream.
fn spawn_keepalive(core: &Arc<StreamCore>, interval: Duration) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return;
    };
    core.set_keepalive(interval);
    let span = core.link().span().clone();
    let core = Arc::downgrade(core);
    let task = async move {
        loop {
            let Some(at) = core.upgrade().and_then(|core| core.next_timeout()) else {
                return;
            };
            tokio::time::sleep_until(tokio::time::Instant::from_std(at)).await;
            let Some(core) = core.upgrade() else {
                return;
            };
            if let Err(e) = core.handle_due_timeouts() {
                tracing::debug!(error = %e, "keepalive stopped");
                return;
            }
        }
    };
    runtime.spawn(task.instrument(span));
}

/// rsockets' connection parameters (no RDMA reads, infinite RNR retries) with the crate's
/// transport retry count ([`ConnParams`] says why it is 6, not rsockets' 7). The peer cannot
/// tell: the count only governs our own queue pair's retransmissions.
fn rsocket_params() -> ConnParams {
    ConnParams::new()
        .responder_resources(0)
        .initiator_depth(0)
        .rnr_retry_count(7)
}

/// A reliable, ordered byte stream over RDMA: a drop-in for `tokio::net::TcpStream`.
///
/// It implements [`AsyncRead`] and [`AsyncWrite`] over two registered ring buffers, moving
/// data with RDMA writes with immediate, and speaks rsockets' wire protocol (version 1), so its
/// peer may be a C program using librdmacm's rsockets (`rstream`, or any program under
/// `librspreload`). Writes are posted at once (there is no Nagle-like delay);
/// shutting down ([`AsyncWrite::poll_shutdown`], `AsyncWriteExt::shutdown`) sends rsockets' SHUTDOWN,
/// so the peer reads EOF and may still write back; dropping the stream sends DISCONNECT after
/// the data written before it and tears the connection down once the peer has it.
///
/// # Closing: what `Ok` from a write promises
///
/// Bytes that `write` or `write_all` accepted either reach the peer, or the peer's read fails:
/// a reader never sees a clean end of stream with bytes missing.
///
/// - Dropping the stream (its last handle) keeps the queue pair and rings until every accepted
///   byte and the DISCONNECT after them are acknowledged, for up to 10 s
///   ([`RStreamOptions::linger`]; past it this side warns). A task on the
///   runtime waits for that. Where no task can (the stream is dropped outside any runtime, or
///   the runtime shuts down first, as when a `#[tokio::main]` returns right after writing), the
///   thread that drops the stream or the runtime waits instead, polling the completion queue
///   (rsockets' `rclose` blocks the same way).
/// - A reader sees end of stream only after the peer's rsockets SHUTDOWN or DISCONNECT, which
///   the peer sends after its last byte. A peer that disconnects without one (its process was
///   killed, or exited without dropping its streams, or its close ran out of time) may have
///   written bytes that never arrived: the reader gets the bytes that did arrive, then
///   `ConnectionReset`. C rsockets closes the same way (`rclose` sends DISCONNECT), so a C
///   peer's orderly close reads as end of stream too.
///
/// Errors follow `TcpStream`: a read after the peer closed returns EOF (`Ok(0)`), a write then
/// fails with `BrokenPipe`, a dead peer ends both with an error (`TimedOut` or
/// `ConnectionReset`). A writer waiting for the peer's credits probes it once a second (as TCP's
/// persist timer does), so a peer host that vanished fails the write after the transport's
/// retries; a reader learns of it only with [`RStreamOptions::keepalive`], as with TCP. The
/// repository's `docs/failure-behaviour.md` gives the bounds.
///
/// A peer cannot monopolise the runtime: the stream handles its completions within Tokio's
/// cooperative budget, at most 32 per unit (so at most 4096 before its task yields), and
/// `try_read` and `try_write` handle at most 128 per call; what is left stays queued
/// and is handled in order by the next call. A flood of valid messages that carry nothing
/// therefore leaves other tasks, even on a `current_thread` runtime, their turns.
///
/// # Cancel safety
///
/// As with `TcpStream`, `read` and `write` (and `peek`, `ready`, `readable`, `writable`) are cancel
/// safe: a read takes bytes from the ring only when it returns them, and a write posts exactly
/// the bytes it reports, so dropping a pending future loses nothing. `read_exact` and
/// `write_all` are not (they are several calls). The rings belong to the stream, never to a
/// future, and are freed only after the queue pair is destroyed.
#[derive(Debug)]
pub struct RStream {
    pub(super) inner: Arc<Inner>,
}

/// What a stream and its owned halves share; the connection closes when the last is dropped.
#[derive(Debug)]
pub(super) struct Inner {
    core: Arc<StreamCore>,
    /// How long the close waits for the peer to take what was written.
    linger: Duration,
}

impl Inner {
    pub(super) fn core(&self) -> &StreamCore {
        &self.core
    }

    pub(super) async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        std::future::poll_fn(|cx| self.poll_peek(cx, &mut buf)).await
    }

    /// Peeks into `buf` (after what it holds): the number of bytes added.
    pub(super) fn poll_peek(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<usize>> {
        let before = buf.filled().len();
        std::task::ready!(self.core.poll_read(cx, buf, true))?;
        Poll::Ready(Ok(buf.filled().len() - before))
    }

    pub(super) async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        self.core.ready_for(interest).await
    }

    pub(super) async fn readable(&self) -> io::Result<()> {
        self.core.ready(Side::Read).await
    }

    pub(super) async fn writable(&self) -> io::Result<()> {
        self.core.ready(Side::Write).await
    }

    pub(super) fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut buf = ReadBuf::new(buf);
        self.core.try_read(&mut buf)?;
        Ok(buf.filled().len())
    }

    pub(super) fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.core.link().peer_addr())
    }

    pub(super) fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.core.link().local_addr())
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        linger::close(&self.core, self.linger);
    }
}

impl RStream {
    /// Connects to `addr` with the default options, trying each resolved address in turn.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::stream::RStream;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     // An address of the peer's RDMA device (the IP of a RoCE or IPoIB interface).
    ///     let mut stream = RStream::connect("10.77.0.1:7471").await?;
    ///     stream.write_all(b"hello world!").await?;
    ///     let mut reply = [0; 12];
    ///     stream.read_exact(&mut reply).await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Self::connect_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the half-built connection.
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<RStream> {
        Self::connect_with(addr, &RStreamOptions::default()).await
    }

    /// Connects to `addr` with `options`.
    ///
    /// # Errors
    ///
    /// `NotFound` when this machine has no RDMA device, `ConnectionRefused` when nothing
    /// listens (or the server could not set up the connection: the message says why),
    /// `TimedOut` when the peer does not answer, `InvalidData` when the peer's connection data
    /// is not rsockets version 1, `OutOfMemory` when registering the rings or creating the
    /// queues hits a limit (the locked-memory limit, or the device's: the message names it),
    /// and the resolver's error for a bad name.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the half-built connection.
    pub async fn connect_with<A: ToSocketAddrs>(
        addr: A,
        options: &RStreamOptions,
    ) -> io::Result<RStream> {
        handshake::connect(
            addr,
            &options.dial,
            &rsocket_params(),
            |id| driver::build(id, options),
            |mut parts, link| {
                driver::apply_peer_conn_data(
                    &mut parts,
                    link.peer_private_data(),
                    link.peer_addr(),
                )?;
                Self::assemble(parts, link, options)
            },
        )
        .await
    }

    /// Accepts a connection request as a stream.
    ///
    /// # Errors
    ///
    /// `InvalidData` when the request does not carry rsockets version 1 connection data (the
    /// request is then rejected), `TimedOut` (the request rejected) when the peer does not
    /// complete the handshake within the options' `accept_timeout`, `OutOfMemory` when
    /// registering the rings or creating the queues hits a limit (the request is then rejected
    /// with the reason, which the client's error shows), or the handshake's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything created for the connection.
    pub async fn accept(request: ConnectRequest, options: &RStreamOptions) -> io::Result<RStream> {
        let peer = request.peer();
        let peer_data = request.private_data().to_vec();
        if let Err(e) = crate::proto::ConnData::decode(&peer_data) {
            let _ = request.reject(&[]);
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{peer} sent invalid rsockets connection data (rejected): {e}"),
            ));
        }
        // The peer's rings are known from its request: applying them before accepting rejects a
        // request whose connection data does not fit.
        handshake::accept(
            request,
            &options.dial,
            &rsocket_params(),
            |id| {
                let (mut parts, data) = driver::build(id, options)?;
                driver::apply_peer_conn_data(&mut parts, &peer_data, peer)?;
                Ok((parts, data))
            },
            |parts, link| Self::assemble(parts, link, options),
        )
        .await
    }

    fn assemble(
        parts: driver::StreamParts,
        link: CmLink,
        options: &RStreamOptions,
    ) -> io::Result<RStream> {
        let core = Arc::new(StreamCore::new(parts, link)?);
        if let Some(interval) = options.queue.keepalive {
            spawn_keepalive(&core, interval);
        }
        Ok(RStream {
            inner: Arc::new(Inner {
                core,
                linger: options.linger,
            }),
        })
    }

    pub(super) fn from_inner(inner: Arc<Inner>) -> RStream {
        RStream { inner }
    }

    /// The peer's address.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// The local address of the connection.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The local queue pair number (what device events about the stream name).
    pub fn qp_num(&self) -> u32 {
        self.inner.core.link().qp_num()
    }

    /// Accepted for `TcpStream` compatibility: every write is posted at once, as with
    /// `TCP_NODELAY`.
    ///
    /// # Errors
    ///
    /// Never fails.
    pub fn set_nodelay(&self, _nodelay: bool) -> io::Result<()> {
        Ok(())
    }

    /// Always `true`: writes are never delayed.
    ///
    /// # Errors
    ///
    /// Never fails.
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(true)
    }

    /// Receives data without removing it: the next read returns the same bytes. Returns 0 at
    /// EOF. Waits, as a read does, while nothing has arrived.
    ///
    /// Takes `&self`, as `TcpStream::peek` does: any number of tasks may peek at once (each
    /// gets a copy of the same bytes); a read through another handle may take the bytes
    /// between a peek and the read that follows it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::stream::RStream;
    /// use tokio::io::AsyncReadExt;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let mut stream = RStream::connect("10.77.0.1:7471").await?;
    ///     let mut b1 = [0; 10];
    ///     let mut b2 = [0; 10];
    ///     // Peek at the data, then read the same bytes.
    ///     let n = stream.peek(&mut b1).await?;
    ///     stream.read_exact(&mut b2[..n]).await?;
    ///     assert_eq!(b1[..n], b2[..n]);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// The connection's error, as for a read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is consumed.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.peek(buf).await
    }

    /// Polls to receive data without removing it: `Ready(Ok(n))` once `n` bytes were copied
    /// into `buf` after what it holds (0 at EOF), else `Pending` with the waker of `cx` stored.
    /// The next read returns the same bytes.
    ///
    /// As with `TcpStream::poll_peek`, on multiple calls to `poll_peek`, `poll_read` or
    /// `poll_read_ready` only the waker from the `Context` passed to the most recent call is
    /// woken.
    ///
    /// # Errors
    ///
    /// The connection's error, as for a read.
    pub fn poll_peek(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<usize>> {
        self.inner.poll_peek(cx, buf)
    }

    /// Reads up to `max` bytes without copying where the bytes allow it: waits for received
    /// bytes and lends them to you in the stream's receive ring ([`LentBytes::is_lent`]);
    /// dropping the [`LentBytes`] gives the space, and the peer's credits, back. Empty at end
    /// of stream. A lent piece ends at the end of its half of the ring.
    ///
    /// Needs [`RStreamOptions::zero_copy_reads`](super::RStreamOptions::zero_copy_reads);
    /// without it, and for bytes in a half of the ring the peer is still filling (half the
    /// receive buffer), the bytes are copied out instead, so a reader keeping up with a slow
    /// writer mostly copies, and one that falls behind by half a ring mostly borrows. Before the first bytes of a half are lent, the peer's access to
    /// that half is revoked (a local invalidation on the send queue, or, the first time, a
    /// deregistration), so no peer can write what you are reading.
    ///
    /// # Errors
    ///
    /// The connection's error, as for a read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is consumed until a returned [`LentBytes`] is dropped (or, for
    /// copied bytes, returned).
    pub async fn read_lent(&mut self, max: usize) -> io::Result<LentBytes<'_>> {
        self.inner.core().read_lent(max.max(1), false).await
    }

    /// Reads the next `len` bytes, or as many of them as lie before the end of their half of
    /// the receive ring (call again for the rest), waiting for all of them as
    /// `read_exact` does; lends them without a copy when the ring allows (see
    /// [`Self::read_lent`]). A reader that knows how much it wants (a framed protocol, a
    /// transfer of known size) borrows nearly every byte this way even when it keeps up with
    /// the writer: it waits for the bytes it would wait for anyway, and a half it asks to the
    /// end of is one the writer has filled.
    ///
    /// # Errors
    ///
    /// `UnexpectedEof` when the stream ends first; otherwise the connection's error, as for a
    /// read.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is consumed until a returned [`LentBytes`] is dropped (or, for
    /// copied bytes, returned).
    pub async fn read_lent_exact(&mut self, len: usize) -> io::Result<LentBytes<'_>> {
        self.inner.core().read_lent(len.max(1), true).await
    }

    /// Waits until a read would not block (data, EOF or an error); usually paired with
    /// [`Self::try_read`].
    ///
    /// Any number of tasks may await this at once (through `&RStream` or an `Arc`): all of
    /// them are woken when the stream becomes readable, as with `TcpStream::readable`.
    ///
    /// # Errors
    ///
    /// Errors reading the completion or event channels.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is consumed, and a dropped future leaves the other waiters' wake-ups
    /// intact. Once readable, it returns at once until a read takes what is buffered.
    pub async fn readable(&self) -> io::Result<()> {
        self.inner.readable().await
    }

    /// Waits until a write would not block (room in the ring, credits, or an error to report);
    /// usually paired with [`Self::try_write`].
    ///
    /// Any number of tasks may await this at once: all of them are woken, as with
    /// `TcpStream::writable`.
    ///
    /// # Errors
    ///
    /// Errors reading the completion or event channels.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is sent, and a dropped future leaves the other waiters' wake-ups
    /// intact.
    pub async fn writable(&self) -> io::Result<()> {
        self.inner.writable().await
    }

    /// Waits until the stream is ready for any of `interest` (`READABLE`, `WRITABLE`, or
    /// both) and returns what it is ready for, as `TcpStream::ready` does; usually paired with
    /// [`Self::try_read`] and [`Self::try_write`].
    ///
    /// The [`Ready`] set holds `READABLE` when a read would not block (data, EOF or an error)
    /// and `WRITABLE` when a write would not block (room and credits, or an error to report).
    /// `READ_CLOSED` says that no more data will arrive: the peer shut down writing or
    /// disconnected, or the connection failed (bytes that arrived before may still be unread).
    /// `WRITE_CLOSED` says that the connection is disconnected or failed. A shutdown of this
    /// side's writing leaves the stream writable (the write then fails with `BrokenPipe`), as
    /// it does a TCP socket. Like a socket's, readiness can be stale by the time it is used: a
    /// `try_read` or `try_write` may still return `WouldBlock`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::stream::RStream;
    /// use tokio::io::Interest;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let stream = RStream::connect("10.77.0.1:7471").await?;
    ///     loop {
    ///         let ready = stream.ready(Interest::READABLE | Interest::WRITABLE).await?;
    ///         if ready.is_readable() {
    ///             let mut data = vec![0; 1024];
    ///             match stream.try_read(&mut data) {
    ///                 Ok(0) => return Ok(()),
    ///                 Ok(n) => println!("read {n} bytes"),
    ///                 Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///                 Err(e) => return Err(e),
    ///             }
    ///         }
    ///         if ready.is_writable() {
    ///             match stream.try_write(b"hello world") {
    ///                 Ok(n) => println!("wrote {n} bytes"),
    ///                 Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
    ///                 Err(e) => return Err(e),
    ///             }
    ///         }
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` for an interest with neither `READABLE` nor `WRITABLE` (a stream has no
    /// priority data, and reports errors as readiness); otherwise errors reading the completion
    /// or event channels.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::readable`] and [`Self::writable`].
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        self.inner.ready(interest).await
    }

    /// The failure that broke the connection, if one did (`Ok(None)` otherwise), as
    /// `TcpStream::take_error` reports `SO_ERROR`.
    ///
    /// Unlike `SO_ERROR`, the error is not cleared: a stream's failure is sticky by design
    /// (every later read and write reports it again, with its cause), so this reports it on
    /// every call. It tells what the stream has learnt so far: a failure that no operation
    /// has seen yet (a completion or event still queued) shows here once a read, a write or a
    /// readiness wait has handled it.
    ///
    /// # Errors
    ///
    /// Never fails; the `Result` mirrors `TcpStream::take_error`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(self.inner.core.error())
    }

    /// Polls for read readiness: `Ready(Ok(()))` once a read would not block (data, EOF or an
    /// error), else `Pending` with the waker of `cx` stored.
    ///
    /// As with `TcpStream::poll_read_ready`, on multiple calls to `poll_read_ready` or
    /// `poll_read` only the waker from the `Context` passed to the most recent call is woken
    /// (the writing side keeps a second, independent waker). Where several tasks wait, use
    /// [`Self::readable`], which wakes them all.
    ///
    /// # Errors
    ///
    /// Errors reading the completion or event channels (never `WouldBlock`).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.core.poll_read_ready(cx)
    }

    /// Polls for write readiness: `Ready(Ok(()))` once a write would not block (room and
    /// credits, or an error to report), else `Pending` with the waker of `cx` stored.
    ///
    /// As with `TcpStream::poll_write_ready`, on multiple calls to `poll_write_ready` or
    /// `poll_write` only the waker from the `Context` passed to the most recent call is woken.
    /// Where several tasks wait, use [`Self::writable`].
    ///
    /// # Errors
    ///
    /// Errors reading the completion or event channels (never `WouldBlock`).
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.core.poll_write_ready(cx)
    }

    /// Reads what is buffered without waiting: `WouldBlock` when nothing is; `Ok(0)` at EOF.
    ///
    /// # Errors
    ///
    /// `WouldBlock`, or the connection's error.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.inner.try_read(buf)
    }

    /// Writes what fits now without waiting: `WouldBlock` when nothing does.
    ///
    /// # Errors
    ///
    /// `WouldBlock`, `BrokenPipe` once writing is shut down, or the connection's error.
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        self.inner.core.try_write(&[io::IoSlice::new(buf)])
    }

    /// As [`Self::try_write`], gathering from several buffers.
    ///
    /// # Errors
    ///
    /// As [`Self::try_write`].
    pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.inner.core().try_write(bufs)
    }

    /// The device context the stream works in: regions registered through it can be written
    /// with [`Self::write_region`].
    pub fn context(&self) -> crate::device::DeviceContext {
        self.inner.core().context()
    }

    /// Writes `range` of a registered `region` to the stream without copying it: the bytes
    /// go by RDMA write straight from the region into the peer's receive ring (the peer, C
    /// rsockets included, sees ordinary stream data). Waits, as `write_all` does, until every
    /// byte is posted, then until the device is done with the region, and hands it back.
    ///
    /// The region must be registered in the stream's device context: by default the shared
    /// context of its device (`DeviceContext::shared`), or the one named with
    /// `RStreamOptions::context`. Bytes written with `write`/`write_all` before this call come
    /// first; the peer's grants and credits pace it like any write.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a range outside the region or a region of another context; the
    /// connection's error, as for a write. The region comes back (`Some`) with any result,
    /// except when a failed `ibv_post_send` left it unknown whether the device still reads
    /// it: it then stays with the stream, which frees it after its queue pair is destroyed.
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe, like `write_all`: if the future is dropped, an unknown prefix of the
    /// range was sent, and the region is kept by the stream until the device is done with it,
    /// then freed (never written, never freed under the device).
    pub async fn write_region<B: crate::rdma::RegisteredBytes>(
        &mut self,
        region: B,
        range: impl std::ops::RangeBounds<usize>,
    ) -> (io::Result<()>, Option<B>) {
        super::region_write::write_region(self.inner.core(), region, range).await
    }

    /// What the stream did on the device so far (work requests, completions, bytes).
    pub fn stats(&self) -> StreamStats {
        self.inner.core().stats()
    }

    /// Splits the stream into a reading and a writing half that borrow it (no cost, no lock).
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (ReadHalf::new(&self.inner), WriteHalf::new(&self.inner))
    }

    /// Splits the stream into halves that can move to different tasks. Dropping the write
    /// half shuts down writing (the peer reads EOF), as with `TcpStream::into_split`; the
    /// connection closes when both halves are gone.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        (
            OwnedReadHalf::new(self.inner.clone()),
            OwnedWriteHalf::new(self.inner),
        )
    }
}

impl AsyncRead for RStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        self.inner.core.poll_read(cx, buf, false)
    }
}

impl AsyncWrite for RStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.inner.core.poll_write(cx, &[io::IoSlice::new(buf)])
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        self.inner.core.poll_write(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.core.poll_flush()
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.core.poll_shutdown(cx)
    }
}
