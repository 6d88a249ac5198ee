//! The reading side: copying readable bytes out of the receive ring, or lending them in place.

use std::future::poll_fn;
use std::io;
use std::task::{Context, Poll, ready};

use tokio::io::ReadBuf;
use tokio::task::coop::{self, RestoreOnPending};

use crate::proto::{LendStep, ReadStatus};
use crate::stream::lending_ring::INITIAL_RANGE;
use crate::stream::lent_bytes::LentBytes;
use crate::stream::side_wakers::{Reading, Waiter};

use super::{CoreState, RBUF, Side, StreamCore, StreamDevice};

/// What [`StreamCore::poll_lend`] found.
enum LendOutcome {
    /// Bytes of the ring to view: nothing but the CPU can write them until consumed.
    View { offset: usize, len: usize },
    /// Bytes copied out and consumed (empty: end of stream).
    Copied(Vec<u8>),
}

impl<D: StreamDevice> StreamCore<D> {
    /// Copies readable bytes into `buf`, consuming them unless `peek`.
    pub(super) fn copy_out(
        &self,
        state: &mut CoreState,
        buf: &mut ReadBuf<'_>,
        peek: bool,
    ) -> io::Result<()> {
        self.take_readable(state, buf.remaining(), peek, |offset, n| {
            self.device
                .read_at(RBUF, offset, &mut buf.initialize_unfilled_to(n)[..n])?;
            buf.advance(n);
            Ok(())
        })
    }

    /// Copies up to `max` readable bytes to the end of `out` and consumes them.
    pub(super) fn copy_out_to_vec(
        &self,
        state: &mut CoreState,
        max: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        self.take_readable(state, max, false, |offset, n| {
            self.device.append_to(RBUF, offset..offset + n, out)
        })
    }

    /// Hands up to `max` readable bytes, piece by piece (ring offset, length), to `put`; then,
    /// unless peeking, consumes them.
    pub(super) fn take_readable(
        &self,
        state: &mut CoreState,
        max: usize,
        peek: bool,
        mut put: impl FnMut(usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        // At most two pieces: from the read position to the ring's end, then from its start.
        // One call site of `put`, so that it is inlined (two left the copy a call of its own).
        let taken = max.min(state.conn.read_status_len());
        let (mut offset, run) = state.conn.readable_run();
        let mut piece = taken.min(run);
        let mut left = taken;
        while left > 0 {
            if piece > 0 {
                put(offset, piece)?;
            }
            left -= piece;
            (offset, piece) = (0, left);
        }
        if !peek {
            if taken > 0 {
                state.took_bytes = true;
            }
            state.conn.consume(taken).map_err(io::Error::from)?;
            state.stats.bytes_received += taken as u64;
            // Consuming is what returns credits and buffer halves to the peer. If posting them
            // fails, the bytes are consumed all the same: they go to the caller now, and the
            // failure (which ended the connection) to the next call, after the bytes that
            // arrived before it (failing this call would lose them).
            if let Err(e) = self.post_controls(state) {
                self.fatal(state, e);
            }
        }
        Ok(())
    }

    /// Waits for readable bytes and hands out up to `max` of them, lent when their half of the
    /// ring can be (the peer's access to it is revoked first), copied out otherwise (their half
    /// is still being filled, or the ring was not set up for lending).
    ///
    /// With `whole`, it first waits for the whole piece: `max` bytes, or the bytes to the end
    /// of the half if fewer; end of stream before that is `UnexpectedEof`.
    fn poll_lend(
        &self,
        cx: &mut Context<'_>,
        max: usize,
        whole: bool,
    ) -> Poll<io::Result<LendOutcome>> {
        let coop = ready!(coop::poll_proceed(cx));
        let mut state = self.lock();
        let outcome = loop {
            ready!(self.pump(&mut state, Some(cx), Reading::PollFn))?;
            if whole && state.conn.read_status_len() < max.min(state.conn.lend_limit()) {
                match state.conn.read_status() {
                    ReadStatus::Failed(e) => {
                        return Poll::Ready(Err(self.failure(&state, Some(e))));
                    }
                    ReadStatus::Eof => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "{} closed the stream before the {max} bytes asked for came",
                                self.device.peer_addr()
                            ),
                        )));
                    }
                    ReadStatus::Data(_) | ReadStatus::Blocked => {
                        ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                        continue;
                    }
                }
            }
            match state.conn.lend() {
                LendStep::Ready { offset, len } => {
                    break LendOutcome::View {
                        offset,
                        len: len.min(max),
                    };
                }
                LendStep::Copy => {
                    let len = state.conn.read_status_len().min(max);
                    let mut bytes = Vec::with_capacity(len);
                    self.copy_out_to_vec(&mut state, len, &mut bytes)?;
                    break LendOutcome::Copied(bytes);
                }
                LendStep::Deregister { half, key } => {
                    if let Err(e) = self.device.deregister_range(RBUF, INITIAL_RANGE[half]) {
                        return Poll::Ready(Err(self.fatal(&mut state, e)));
                    }
                    state.conn.deregistered(half, key);
                }
                LendStep::Invalidate { wr_id, half, key } => {
                    if let Err(e) = self.device.post_invalidate(wr_id, half, key) {
                        return Poll::Ready(Err(self.post_failed(&mut state, e)));
                    }
                    state.stats.post_send_calls += 1;
                    state.stats.signaled_sends += 1;
                }
                LendStep::Wait => {
                    ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                }
                LendStep::Empty => match state.conn.read_status() {
                    ReadStatus::Eof
                        if state.transport_error.is_set() && state.conn.is_disconnected() =>
                    {
                        return Poll::Ready(Err(self.failure(&state, None)));
                    }
                    ReadStatus::Eof => break LendOutcome::Copied(Vec::new()),
                    ReadStatus::Failed(e) => {
                        return Poll::Ready(Err(self.failure(&state, Some(e))));
                    }
                    // Data appeared since `lend` looked: look again.
                    ReadStatus::Data(_) => {}
                    ReadStatus::Blocked => {
                        ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                    }
                },
            }
        };
        // A window revoked on the way may have made an SGL update due: out now, as flush
        // posts nothing.
        if let Err(e) = self.post_controls(&mut state) {
            self.fatal(&mut state, e);
        }
        coop.made_progress();
        Poll::Ready(Ok(outcome))
    }

    /// Lent bytes came back: consumed, which may return ring space and credits to the peer.
    pub(in crate::stream) fn consume_lent(&self, len: usize) {
        let mut state = self.lock();
        if let Err(e) = state.conn.consume(len) {
            tracing::warn!(parent: self.device.span(), error = %e, "giving lent bytes back");
            return;
        }
        state.stats.bytes_received += len as u64;
        state.stats.lent_bytes += len as u64;
        // An error ends the connection; the next call reports it.
        let _ = self.post_controls(&mut state);
    }

    /// Reads (or peeks) into `buf`; with no `cx`, returns `WouldBlock` instead of waiting.
    ///
    /// A unit of Tokio's budget (`unit`, for the caller to spend) is taken, if the caller has
    /// not, only once nothing is readable: a read of bytes already delivered spends none. Such
    /// reads consume the ring, so they cannot go on for ever without one: refilling it takes
    /// completions, handled within the budget (and end of stream or an error spends one on
    /// every read).
    pub(super) fn read(
        &self,
        mut cx: Option<&mut Context<'_>>,
        buf: &mut ReadBuf<'_>,
        peek: bool,
        unit: &mut Option<RestoreOnPending>,
    ) -> Poll<io::Result<()>> {
        // Most calls of a task polled for something else find the side as their last sleep
        // left it: that costs no lock and no look.
        if let Some(cx) = cx.as_deref()
            && self.still_unreadable(cx)
        {
            return Poll::Pending;
        }
        let mut state = self.lock();
        loop {
            // Like rsockets' rrecv, the queue is polled only when nothing is readable: bytes a
            // batch of completions delivered are read without polling it again for each read.
            if state.conn.read_status_len() == 0 {
                if let Some(cx) = cx.as_deref_mut()
                    && unit.is_none()
                {
                    *unit = Some(ready!(coop::poll_proceed(cx)));
                }
                // The read's unit pays for the first batch.
                ready!(self.pump_from(&mut state, cx.as_deref_mut(), Reading::PollFn, true))?;
            }
            // The usual case, bytes to read, without building the status (its error variant
            // makes it a value to match and drop).
            if state.conn.read_status_len() > 0 {
                return Poll::Ready(self.copy_out(&mut state, buf, peek));
            }
            match state.conn.read_status() {
                ReadStatus::Data(_) => return Poll::Ready(self.copy_out(&mut state, buf, peek)),
                // Our own sends failed (not merely flushed): report that, not end-of-stream.
                ReadStatus::Eof
                    if state.transport_error.is_set() && state.conn.is_disconnected() =>
                {
                    return Poll::Ready(Err(self.failure(&state, None)));
                }
                ReadStatus::Eof => return Poll::Ready(Ok(())),
                ReadStatus::Failed(e) => return Poll::Ready(Err(self.failure(&state, Some(e)))),
                ReadStatus::Blocked => match cx.as_deref_mut() {
                    Some(cx) => ready!(self.wait_unreadable(&mut state, cx))?,
                    None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
                },
            }
        }
    }

    pub(in crate::stream) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        peek: bool,
    ) -> Poll<io::Result<()>> {
        // A peek, or a read into no room, leaves the stream as it was: repeated, it could go on
        // for ever, so it always spends a unit.
        let mut unit = None;
        if peek || buf.remaining() == 0 {
            unit = Some(ready!(coop::poll_proceed(cx)));
        }
        let result = ready!(self.read(Some(cx), buf, peek, &mut unit));
        if let Some(unit) = unit {
            unit.made_progress();
        }
        Poll::Ready(result)
    }

    /// Reads without waiting: `WouldBlock` when nothing is buffered.
    pub(in crate::stream) fn try_read(&self, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        match self.read(None, buf, false, &mut None) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
}

impl StreamCore {
    /// See [`crate::stream::RStream::read_lent`].
    pub(in crate::stream) async fn read_lent(
        &self,
        max: usize,
        whole: bool,
    ) -> io::Result<LentBytes<'_>> {
        match poll_fn(|cx| self.poll_lend(cx, max, whole)).await? {
            LendOutcome::Copied(bytes) => Ok(LentBytes::copied(bytes)),
            LendOutcome::View { offset, len } => {
                let view = self.device.qp.view(RBUF, offset, len).map_err(|e| {
                    let mut state = self.lock();
                    self.fatal(&mut state, e)
                })?;
                Ok(LentBytes::lent(view, self))
            }
        }
    }
}
