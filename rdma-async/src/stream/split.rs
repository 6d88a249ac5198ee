//! The halves of an [`RStream`]: borrowed (`split`) and owned (`into_split`), as in Tokio.

use std::error::Error;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};

use super::lent_bytes::LentBytes;
use super::rstream::{Inner, RStream};
use super::stats::StreamStats;

/// The reading half of an [`RStream`], borrowed by [`RStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a>(&'a Inner);

/// The writing half of an [`RStream`], borrowed by [`RStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a>(&'a Inner);

/// The reading half of an [`RStream`], owned (from [`RStream::into_split`]).
#[derive(Debug)]
pub struct OwnedReadHalf {
    inner: Arc<Inner>,
}

/// The writing half of an [`RStream`], owned (from [`RStream::into_split`]). Dropping it shuts
/// down writing unless [`Self::forget`] was called.
#[derive(Debug)]
pub struct OwnedWriteHalf {
    inner: Arc<Inner>,
    shutdown_on_drop: bool,
}

impl<'a> ReadHalf<'a> {
    pub(super) fn new(inner: &'a Arc<Inner>) -> Self {
        ReadHalf(inner)
    }
}

impl<'a> WriteHalf<'a> {
    pub(super) fn new(inner: &'a Arc<Inner>) -> Self {
        WriteHalf(inner)
    }
}

impl OwnedReadHalf {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        OwnedReadHalf { inner }
    }

    /// Puts the stream back together; fails (returning both halves) if they come from
    /// different streams.
    ///
    /// # Errors
    ///
    /// [`ReuniteError`] when the halves belong to different streams.
    pub fn reunite(self, other: OwnedWriteHalf) -> Result<RStream, ReuniteError> {
        if !Arc::ptr_eq(&self.inner, &other.inner) {
            return Err(ReuniteError(self, other));
        }
        let mut write = other;
        write.shutdown_on_drop = false;
        drop(write);
        Ok(RStream::from_inner(self.inner))
    }
}

impl OwnedWriteHalf {
    pub(super) fn new(inner: Arc<Inner>) -> Self {
        OwnedWriteHalf {
            inner,
            shutdown_on_drop: true,
        }
    }

    /// Drops the half without shutting down writing.
    pub fn forget(mut self) {
        self.shutdown_on_drop = false;
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        if self.shutdown_on_drop {
            self.inner.core().begin_shutdown();
        }
    }
}

/// The halves passed to [`OwnedReadHalf::reunite`] came from different streams.
#[derive(Debug)]
pub struct ReuniteError(pub OwnedReadHalf, pub OwnedWriteHalf);

impl fmt::Display for ReuniteError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("tried to reunite halves that are not from the same stream")
    }
}

impl Error for ReuniteError {}

/// Reaches the shared stream state from a half.
trait Shared {
    fn shared(&self) -> &Inner;
}

impl Shared for ReadHalf<'_> {
    fn shared(&self) -> &Inner {
        self.0
    }
}

impl Shared for WriteHalf<'_> {
    fn shared(&self) -> &Inner {
        self.0
    }
}

impl Shared for OwnedReadHalf {
    fn shared(&self) -> &Inner {
        &self.inner
    }
}

impl Shared for OwnedWriteHalf {
    fn shared(&self) -> &Inner {
        &self.inner
    }
}

/// Methods shared by both kinds of read half.
macro_rules! read_half_methods {
    () => {
        /// As [`RStream::peek`].
        ///
        /// # Errors
        ///
        /// As [`RStream::peek`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe.
        pub async fn peek(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            self.shared().peek(buf).await
        }

        /// As [`RStream::poll_peek`]; takes `&mut self`, as the halves of a `TcpStream` do.
        ///
        /// # Errors
        ///
        /// As [`RStream::poll_peek`].
        pub fn poll_peek(
            &mut self,
            cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<usize>> {
            self.shared().poll_peek(cx, buf)
        }

        /// As [`RStream::ready`]; the write half may be waited on meanwhile.
        ///
        /// # Errors
        ///
        /// As [`RStream::ready`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe.
        pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
            self.shared().ready(interest).await
        }

        /// As [`RStream::read_lent`]; the write half may go on writing meanwhile.
        ///
        /// # Errors
        ///
        /// As [`RStream::read_lent`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: nothing is consumed until the returned bytes are dropped.
        pub async fn read_lent(&mut self, max: usize) -> io::Result<LentBytes<'_>> {
            self.shared().core().read_lent(max.max(1), false).await
        }

        /// As [`RStream::read_lent_exact`]; the write half may go on writing meanwhile.
        ///
        /// # Errors
        ///
        /// As [`RStream::read_lent_exact`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe: nothing is consumed until the returned bytes are dropped.
        pub async fn read_lent_exact(&mut self, len: usize) -> io::Result<LentBytes<'_>> {
            self.shared().core().read_lent(len.max(1), true).await
        }

        /// As [`RStream::readable`].
        ///
        /// # Errors
        ///
        /// As [`RStream::readable`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe.
        pub async fn readable(&self) -> io::Result<()> {
            self.shared().readable().await
        }

        /// As [`RStream::try_read`].
        ///
        /// # Errors
        ///
        /// As [`RStream::try_read`].
        pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
            self.shared().try_read(buf)
        }

        /// The peer's address.
        ///
        /// # Errors
        ///
        /// Never fails today.
        pub fn peer_addr(&self) -> io::Result<SocketAddr> {
            self.shared().peer_addr()
        }

        /// The local address.
        ///
        /// # Errors
        ///
        /// Never fails today.
        pub fn local_addr(&self) -> io::Result<SocketAddr> {
            self.shared().local_addr()
        }

        /// As [`RStream::stats`]: the whole stream's counters, both directions.
        pub fn stats(&self) -> StreamStats {
            self.shared().core().stats()
        }
    };
}

/// Methods shared by both kinds of write half.
macro_rules! write_half_methods {
    () => {
        /// As [`RStream::writable`].
        ///
        /// # Errors
        ///
        /// As [`RStream::writable`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe.
        pub async fn writable(&self) -> io::Result<()> {
            self.shared().writable().await
        }

        /// As [`RStream::ready`]; the read half may be waited on meanwhile.
        ///
        /// # Errors
        ///
        /// As [`RStream::ready`].
        ///
        /// # Cancel safety
        ///
        /// Cancel safe.
        pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
            self.shared().ready(interest).await
        }

        /// As [`RStream::try_write`].
        ///
        /// # Errors
        ///
        /// As [`RStream::try_write`].
        pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
            self.shared().core().try_write(&[io::IoSlice::new(buf)])
        }

        /// As [`RStream::stats`]: the whole stream's counters, both directions.
        pub fn stats(&self) -> StreamStats {
            self.shared().core().stats()
        }

        /// The peer's address.
        ///
        /// # Errors
        ///
        /// Never fails today.
        pub fn peer_addr(&self) -> io::Result<SocketAddr> {
            self.shared().peer_addr()
        }

        /// The local address.
        ///
        /// # Errors
        ///
        /// Never fails today.
        pub fn local_addr(&self) -> io::Result<SocketAddr> {
            self.shared().local_addr()
        }
    };
}

impl ReadHalf<'_> {
    read_half_methods!();
}

impl OwnedReadHalf {
    read_half_methods!();
}

impl WriteHalf<'_> {
    write_half_methods!();
}

impl OwnedWriteHalf {
    write_half_methods!();
}

/// `AsyncRead` for a read half whose `Inner` is reached by `$inner`.
macro_rules! impl_async_read {
    ($ty:ty) => {
        impl AsyncRead for $ty {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                self.shared().core().poll_read(cx, buf, false)
            }
        }
    };
}

/// `AsyncWrite` for a write half; `poll_shutdown` shuts down writing of the whole stream.
macro_rules! impl_async_write {
    ($ty:ty) => {
        impl AsyncWrite for $ty {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                self.shared()
                    .core()
                    .poll_write(cx, &[io::IoSlice::new(buf)])
            }

            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[io::IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                self.shared().core().poll_write(cx, bufs)
            }

            fn is_write_vectored(&self) -> bool {
                true
            }

            fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.shared().core().poll_flush()
            }

            fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.shared().core().poll_shutdown(cx)
            }
        }
    };
}

impl_async_read!(ReadHalf<'_>);
impl_async_read!(OwnedReadHalf);
impl_async_write!(WriteHalf<'_>);
impl_async_write!(OwnedWriteHalf);
