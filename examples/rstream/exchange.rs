//! The byte exchange of one test, generic over the stream so that kernel TCP and RDMA streams
//! run the very same code.
//!
//! Per test: a 16-byte sync, client to server and then server to client, so that both clocks
//! start once the peer is there; then `iterations` times the client sends `count` transfers of
//! `size` bytes and the server receives them all, and the server sends as many back and the
//! client receives them. Sends are `count` separate calls, as in rstream.c, not one big write.
//!
//! How a transfer waits (`-T b` / `-T n`):
//!
//! - [`IoMode::Blocking`]: `write_all`/`read_exact` awaited, the task sleeps until the stream is
//!   ready, like a blocking `send`/`recv(MSG_WAITALL)`.
//! - [`IoMode::NonBlocking`]: a busy loop, like rstream.c's `MSG_DONTWAIT` calls retried on
//!   `EAGAIN`. Each attempt polls the stream once with a waker that does nothing (a try-call
//!   that never parks); when it makes no progress the task calls `yield_now`, which lets Tokio
//!   poll its reactor without blocking and run other tasks, and tries again. The thread never
//!   sleeps, which is what makes the C tool's default mode fast and CPU-hungry.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use rdma_async::rdma::LocalRegion;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::pattern::Pattern;
use crate::plan::Test;

/// The sync message size, fixed by rstream.c.
const SYNC_SIZE: usize = 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IoMode {
    Blocking,
    NonBlocking,
}

/// A stream the exchange runs on. `-T z` (rdma-async only, not in rstream.c) sends each
/// transfer from a registered region with `RStream::write_region` instead of copying it; the
/// default does nothing, so kernel TCP always copies.
pub trait Stream: AsyncRead + AsyncWrite + Unpin {
    /// Sends the first `size` bytes of `region` without a copy and hands it back.
    fn write_region(
        &mut self,
        region: LocalRegion,
        size: usize,
    ) -> impl std::future::Future<Output = (io::Result<()>, Option<LocalRegion>)> {
        let _ = size;
        async {
            let e = io::Error::new(io::ErrorKind::Unsupported, "-T z needs an RDMA stream");
            (Err(e), Some(region))
        }
    }

    /// Receives `size` bytes by borrowing them in the receive ring, checking each piece
    /// against `pattern` (`-T v`) in place.
    fn recv_lent(
        &mut self,
        size: usize,
        pattern: Option<&mut Pattern>,
    ) -> impl std::future::Future<Output = io::Result<()>> {
        let _ = (size, pattern);
        async {
            Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "-T l needs an RDMA stream",
            ))
        }
    }
}

impl Stream for tokio::net::TcpStream {}

/// The unit tests' in-memory pipe.
impl Stream for tokio::io::DuplexStream {}

impl Stream for rdma_async::stream::RStream {
    async fn write_region(
        &mut self,
        region: LocalRegion,
        size: usize,
    ) -> (io::Result<()>, Option<LocalRegion>) {
        rdma_async::stream::RStream::write_region(self, region, ..size).await
    }

    async fn recv_lent(
        &mut self,
        size: usize,
        mut pattern: Option<&mut Pattern>,
    ) -> io::Result<()> {
        let mut received = 0;
        while received < size {
            let bytes = self.read_lent_exact(size - received).await?;
            if let Some(pattern) = pattern.as_deref_mut() {
                pattern.check(&bytes)?;
            }
            received += bytes.len();
        }
        Ok(())
    }
}

/// What outlives a connection: the buffer, the I/O mode and the `-T v` counters (which carry on
/// across connections, see [`Pattern`]).
#[derive(Debug)]
pub struct Transfers {
    mode: IoMode,
    pattern: Option<Pattern>,
    /// One buffer for both directions, as in rstream.c: without `-T v` its contents are
    /// whatever was last received.
    buf: Vec<u8>,
    /// `-T z`: sends go from this registered region (registered per connection, in its
    /// device context), not `buf`.
    pub zero_copy: Option<LocalRegion>,
    /// `-T l`: receives borrow the bytes in the stream's ring.
    pub lent_reads: bool,
}

impl Transfers {
    /// Room for transfers of up to `max_size` bytes (and for the sync).
    pub fn new(mode: IoMode, verify: bool, max_size: usize) -> io::Result<Self> {
        let len = max_size.max(SYNC_SIZE);
        let mut buf = Vec::new();
        buf.try_reserve_exact(len).map_err(|e| {
            io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!("buffer of {len} bytes: {e}"),
            )
        })?;
        buf.resize(len, 0);
        Ok(Transfers {
            mode,
            pattern: verify.then(Pattern::default),
            buf,
            zero_copy: None,
            lent_reads: false,
        })
    }

    /// The size of buffer a connection's `-T z` region needs.
    pub fn max_size(&self) -> usize {
        self.buf.len()
    }

    /// `shape.iterations` times: `shape.count` transfers of `shape.size` bytes each way, in
    /// `order`; each transfer is a write or read call of its own, as in rstream.c. The loops
    /// and both kinds of transfer are in this one future: with a future of its own built and
    /// polled for each transfer (an `async fn` per transfer), the loop cost a streamed 64 B
    /// message about 120 instructions more.
    async fn exchange<S: Stream>(
        &mut self,
        stream: &mut S,
        shape: Shape,
        order: &[Direction],
    ) -> io::Result<()> {
        let Shape {
            size,
            count,
            iterations,
        } = shape;
        for _ in 0..iterations {
            for &direction in order {
                for _ in 0..count {
                    match direction {
                        Direction::Send => {
                            // Checked before it is taken: taking the empty region out of its
                            // place for every transfer moved it, for nothing.
                            if self.zero_copy.is_some() {
                                self.send_region(stream, size).await?;
                                continue;
                            }
                            let data = &mut self.buf[..size];
                            if let Some(pattern) = &mut self.pattern {
                                pattern.fill(data);
                            }
                            let data = &*data;
                            let sent = match self.mode {
                                // Hands the bytes to the transport now: a stream that batches
                                // writes must not hold back a transfer the peer is waiting
                                // for. A no-op on TCP.
                                IoMode::Blocking => match stream.write_all(data).await {
                                    Ok(()) => stream.flush().await,
                                    Err(e) => Err(e),
                                },
                                IoMode::NonBlocking => write_spinning(stream, data).await,
                            };
                            // Not `map_err`: left a call of its own, it cost every transfer.
                            if let Err(e) = sent {
                                return Err(context("send", e));
                            }
                        }
                        Direction::Recv => {
                            if self.lent_reads {
                                stream
                                    .recv_lent(size, self.pattern.as_mut())
                                    .await
                                    .map_err(|e| context("recv", e))?;
                                continue;
                            }
                            let data = &mut self.buf[..size];
                            let received = match self.mode {
                                IoMode::Blocking => stream.read_exact(data).await.map(drop),
                                IoMode::NonBlocking => read_spinning(stream, data).await,
                            };
                            if let Err(e) = received {
                                return Err(recv_error(e));
                            }
                            // Verified once the whole transfer is in, like rstream.c.
                            if let Some(pattern) = &mut self.pattern {
                                pattern.check(&self.buf[..size])?;
                            }
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// `-T z`: sends from the registered region (the caller saw it there).
    async fn send_region<S: Stream>(&mut self, stream: &mut S, size: usize) -> io::Result<()> {
        let Some(mut region) = self.zero_copy.take() else {
            return Err(io::Error::other("send: -T z has no registered region"));
        };
        if let Some(pattern) = &mut self.pattern {
            pattern.fill(&mut region[..size]);
        }
        let (result, region) = stream.write_region(region, size).await;
        self.zero_copy = region;
        result.map_err(|e| context("send", e))
    }
}

/// How many transfers of how many bytes an exchange makes.
#[derive(Debug, Clone, Copy)]
struct Shape {
    size: usize,
    count: usize,
    iterations: usize,
}

/// The sync before each test: one transfer each way.
const SYNC: Shape = Shape {
    size: SYNC_SIZE,
    count: 1,
    iterations: 1,
};

impl Shape {
    fn of(test: &Test) -> Self {
        Shape {
            size: test.size,
            count: test.count,
            iterations: test.iterations,
        }
    }
}

/// Which way a run of transfers goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Direction {
    Send,
    Recv,
}

/// The client's order in each iteration; the server's is the reverse.
const CLIENT_ORDER: [Direction; 2] = [Direction::Send, Direction::Recv];
const SERVER_ORDER: [Direction; 2] = [Direction::Recv, Direction::Send];

#[cold]
fn recv_error(e: io::Error) -> io::Error {
    match e.kind() {
        // Says more than read_exact's "early eof".
        io::ErrorKind::UnexpectedEof => {
            io::Error::new(e.kind(), "recv: connection closed by the peer")
        }
        _ => context("recv", e),
    }
}

async fn write_spinning<S: AsyncWrite + Unpin>(stream: &mut S, data: &[u8]) -> io::Result<()> {
    let mut sent = 0;
    while sent < data.len() {
        let n = spin(|cx| Pin::new(&mut *stream).poll_write(cx, &data[sent..])).await?;
        if n == 0 {
            return Err(io::ErrorKind::WriteZero.into());
        }
        sent += n;
    }
    spin(|cx| Pin::new(&mut *stream).poll_flush(cx)).await
}

async fn read_spinning<S: AsyncRead + Unpin>(stream: &mut S, data: &mut [u8]) -> io::Result<()> {
    let mut received = 0;
    while received < data.len() {
        let n = spin(|cx| {
            let mut buf = ReadBuf::new(&mut data[received..]);
            std::task::ready!(Pin::new(&mut *stream).poll_read(cx, &mut buf))?;
            Poll::Ready(Ok(buf.filled().len()))
        })
        .await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        received += n;
    }
    Ok(())
}

/// Polls `attempt` once per round with a waker that does nothing, so a `Pending` is just "no
/// progress" (`EAGAIN`) and nothing waits for a wake-up; between rounds the task yields.
async fn spin<T>(
    mut attempt: impl FnMut(&mut Context<'_>) -> Poll<io::Result<T>>,
) -> io::Result<T> {
    loop {
        if let Poll::Ready(result) = attempt(&mut Context::from_waker(Waker::noop())) {
            return result;
        }
        tokio::task::yield_now().await;
    }
}

#[cold]
fn context(what: &str, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The client side of one test; returns the time from the end of the sync to the last byte
/// received.
pub async fn run_client<S: Stream>(
    stream: &mut S,
    xfers: &mut Transfers,
    test: &Test,
) -> io::Result<Duration> {
    xfers.exchange(stream, SYNC, &CLIENT_ORDER).await?;
    let start = Instant::now();
    xfers
        .exchange(stream, Shape::of(test), &CLIENT_ORDER)
        .await?;
    Ok(start.elapsed())
}

/// The server side of one test, the mirror image of [`run_client`].
pub async fn run_server<S: Stream>(
    stream: &mut S,
    xfers: &mut Transfers,
    test: &Test,
) -> io::Result<Duration> {
    xfers.exchange(stream, SYNC, &SERVER_ORDER).await?;
    let start = Instant::now();
    xfers
        .exchange(stream, Shape::of(test), &SERVER_ORDER)
        .await?;
    Ok(start.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both modes, with verification, over an in-memory pipe smaller than a transfer so that
    /// every transfer needs several partial reads and writes.
    #[tokio::test]
    async fn client_and_server_agree() {
        for mode in [IoMode::Blocking, IoMode::NonBlocking] {
            let (mut a, mut b) = tokio::io::duplex(1000);
            let test = Test::custom(4096, 3, 2);
            let server_test = test.clone();
            let server = tokio::spawn(async move {
                let mut xfers = Transfers::new(mode, true, 4096).unwrap();
                run_server(&mut b, &mut xfers, &server_test).await
            });
            let mut xfers = Transfers::new(mode, true, 4096).unwrap();
            run_client(&mut a, &mut xfers, &test).await.unwrap();
            server.await.unwrap().unwrap();
        }
    }

    #[tokio::test]
    async fn verification_catches_a_wrong_byte() {
        let (mut a, mut b) = tokio::io::duplex(1000);
        let mut xfers = Transfers::new(IoMode::Blocking, true, 64).unwrap();
        a.write_all(&[0, 1, 2, 7]).await.unwrap();
        let err = xfers
            .exchange(
                &mut b,
                Shape {
                    size: 4,
                    count: 1,
                    iterations: 1,
                },
                &[Direction::Recv],
            )
            .await
            .unwrap_err();
        assert!(err.to_string().contains("byte 3"), "{err}");
    }
}
