//! [`FakeStreams`]: two stream drivers over the fake device and the wire between them, for
//! code outside `stream` (the fuzz harness `crate::fuzzing::stream_driver`), which reaches the
//! drivers only through these calls: the driver's own read, write and shutdown entry points,
//! by end (0 or 1).

use std::io::{self, IoSlice};
use std::task::{Context, Poll};

use tokio::io::ReadBuf;

use crate::proto::{Config, Connection};

use super::super::StreamCore;
use super::{FakeDevice, FakeWire, pair_from};

/// Two connected stream drivers over the fake device, and the wire between them.
#[derive(Debug)]
pub(crate) struct FakeStreams {
    ends: [StreamCore<FakeDevice>; 2],
    wire: FakeWire,
}

impl FakeStreams {
    /// Two drivers with `config` on both ends, whose message sequence numbers start at
    /// `start_seq` (near 2^16, they wrap early in a run).
    ///
    /// # Errors
    ///
    /// As [`pair_from`]: the ends did not connect.
    pub(crate) fn connect(config: Config, start_seq: u16) -> io::Result<Self> {
        let (a, b, wire) = pair_from(config, start_seq)?;
        Ok(FakeStreams { ends: [a, b], wire })
    }

    /// The wire, to inject failures.
    pub(crate) fn wire(&self) -> &FakeWire {
        &self.wire
    }

    /// Calls `look` with `end`'s protocol state (under the driver's lock), for the harness's
    /// invariants on credits and ring space.
    pub(crate) fn look<R>(&self, end: usize, look: impl FnOnce(&Connection) -> R) -> R {
        look(&self.ends[end].lock().conn)
    }

    /// Receives `end`'s driver consumed and holds back, to post with later ones.
    pub(crate) fn unposted_recvs(&self, end: usize) -> usize {
        self.ends[end].lock().unposted_recvs
    }

    /// `StreamCore::poll_write` of `end`.
    pub(crate) fn poll_write(
        &self,
        end: usize,
        cx: &mut Context<'_>,
        bytes: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.ends[end].poll_write(cx, &[IoSlice::new(bytes)])
    }

    /// `StreamCore::try_write` of `end`.
    pub(crate) fn try_write(&self, end: usize, bytes: &[u8]) -> io::Result<usize> {
        self.ends[end].try_write(&[IoSlice::new(bytes)])
    }

    /// `StreamCore::poll_read` of `end` (a peek with `peek`).
    pub(crate) fn poll_read(
        &self,
        end: usize,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        peek: bool,
    ) -> Poll<io::Result<()>> {
        self.ends[end].poll_read(cx, buf, peek)
    }

    /// `StreamCore::try_read` of `end`.
    pub(crate) fn try_read(&self, end: usize, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        self.ends[end].try_read(buf)
    }

    /// `StreamCore::poll_shutdown` of `end`.
    pub(crate) fn poll_shutdown(&self, end: usize, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.ends[end].poll_shutdown(cx)
    }
}
