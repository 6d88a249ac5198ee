//! The writing side: copying the caller's bytes into the send ring (or inline), flushing and
//! shutting down.

use std::io;
use std::task::{Context, Poll, ready};

use tokio::task::coop::{self, RestoreOnPending};

use crate::proto::{DataWrite, WriteCall, WriteError};
use crate::stream::gather::Gather;
use crate::stream::side_wakers::{Reading, Waiter};

use super::{CoreState, CountedGuard, Side, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Writes from `bufs` in order, as much as fits now; with no `cx`, returns `WouldBlock`
    /// instead of waiting when nothing fits.
    ///
    /// A unit of Tokio's budget (`unit`, for the caller to spend) is taken only once the write
    /// has to reap completions or wait: a write that posts at once spends none. Such writes
    /// cannot go on for ever without one: they stop when the ring or the peer's credits run
    /// out, and what returns them comes through completions, handled within the budget.
    pub(super) fn write(
        &self,
        cx: Option<&mut Context<'_>>,
        bufs: &[io::IoSlice<'_>],
        unit: &mut Option<RestoreOnPending>,
    ) -> Poll<io::Result<usize>> {
        let mut state = self.lock();
        // Written to right after taking bytes: not a reader that reads until it finds nothing.
        if std::mem::take(&mut state.took_bytes) {
            state.reads_until_empty = false;
        }
        // The call's buffers are one run of bytes (see `Gather`): rsockets ramps chunk sizes up
        // from 2 KiB in every write call; we send the largest chunks at once (fewer work
        // requests; the peer cannot tell the difference).
        let mut source = Gather::new(bufs);
        let mut call = WriteCall::largest();
        // Like rsockets' rsend, completions are reaped only once the write cannot go on: a
        // write that can post goes straight to the device (a 64 B round trip polled the queue
        // for nothing here first).
        let first = match source.remaining() {
            0 => None,
            remaining => Some(state.conn.prepare_write(&mut call, remaining)),
        };
        // The usual call: one chunk takes all its bytes, and is posted alone. No control
        // message waits for it: each is posted by the call that made it due, or by the
        // handling of the completion that frees its slot (looking here cost every streamed
        // message some 14 instructions, for nothing).
        if let Some(Ok(write)) = &first
            && write.len == source.remaining()
        {
            self.push_data(&mut state, None, write, &mut source)?;
            return Poll::Ready(Ok(write.len));
        }
        self.write_chunks(state, cx, source, call, first, unit)
    }

    /// [`Self::write`] for every other call: several chunks, or a first that could not be
    /// planned (`first`, `None` for a call of no bytes). Out of line, so that the usual call
    /// carries neither its send chain's room in its frame nor its registers' spills.
    #[inline(never)]
    fn write_chunks(
        &self,
        mut state: CountedGuard<'_, CoreState>,
        mut cx: Option<&mut Context<'_>>,
        mut source: Gather<'_>,
        mut call: WriteCall,
        mut first: Option<Result<DataWrite, WriteError>>,
        unit: &mut Option<RestoreOnPending>,
    ) -> Poll<io::Result<usize>> {
        let mut pumped = false;
        let mut written = 0;
        // Every chunk of the call, and any control message due after them, go to the device
        // with one `ibv_post_send`. Only a call that has written nothing yet returns or waits
        // below, so the chain is empty whenever it does.
        let mut chain = None;
        while source.remaining() > 0 {
            let planned = match first.take() {
                Some(planned) => planned,
                None => state.conn.prepare_write(&mut call, source.remaining()),
            };
            match planned {
                Ok(write) => {
                    let chain = chain.get_or_insert_with(|| self.device.chain());
                    self.push_data(&mut state, Some(chain), &write, &mut source)?;
                    written += write.len;
                }
                Err(_) if written > 0 => break,
                Err(_) if !pumped => {
                    debug_assert!(chain.is_none(), "a write waits with chunks unposted");
                    pumped = true;
                    if let Some(cx) = cx.as_deref_mut() {
                        *unit = Some(ready!(coop::poll_proceed(cx)));
                    }
                    // The write's unit pays for the first batch.
                    ready!(self.pump_from(&mut state, cx.as_deref_mut(), Reading::No, true))?;
                }
                Err(WriteError::Blocked(reason)) => match cx.as_deref_mut() {
                    Some(cx) => {
                        ready!(self.wait_to_write(&mut state, cx, Waiter::Poll, Some(reason)))?
                    }
                    None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
                },
                Err(WriteError::Closed) => return Poll::Ready(Err(self.failure(&state, None))),
                Err(WriteError::Failed(e)) => {
                    return Poll::Ready(Err(self.failure(&state, Some(e))));
                }
            }
        }
        let chain = chain.get_or_insert_with(|| self.device.chain());
        self.push_controls(&mut state, chain)?;
        self.post_chain(&mut state, chain)?;
        Poll::Ready(Ok(written))
    }

    pub(in crate::stream) fn poll_write(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let mut unit = None;
        let result = ready!(self.write(Some(cx), bufs, &mut unit));
        if let Some(unit) = unit {
            unit.made_progress();
        }
        Poll::Ready(result)
    }

    /// Writes without waiting: `WouldBlock` when nothing fits now.
    pub(in crate::stream) fn try_write(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        match self.write(None, bufs, &mut None) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Nothing to do, as with `TcpStream`: everything written is already posted, and every
    /// control message is posted by the call that made it due (a read consuming bytes, a
    /// completion returning credits, a write, a timer), or, when no slot was free for it, by the
    /// handling of the completion that frees one, which a flush does not poll for. A failure is
    /// reported by the next read, or by the write that waits for the ring space or credits it
    /// holds. (Taking the lock to look for a control message due cost a streamed 64 B message
    /// some 60 instructions, for nothing.)
    #[inline]
    pub(in crate::stream) fn poll_flush(&self) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// Sends rsockets' SHUTDOWN (or DISCONNECT when reading is over too) and waits until every
    /// send completed. The peer reads EOF and may keep writing to us.
    pub(in crate::stream) fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        if !state.shutdown_started {
            state.shutdown_started = true;
            state.conn.shutdown_write();
            // Out before the peer's own SHUTDOWN, if one is queued, is handled: that leaves
            // the connection disconnected and drops ours, which the peer then never reads.
            self.post_controls(&mut state)?;
        }
        loop {
            ready!(self.pump(&mut state, Some(&mut *cx), Reading::No))?;
            self.post_controls(&mut state)?;
            if state.conn.all_sends_done() || state.conn.is_disconnected() {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = state.conn.error().cloned() {
                return Poll::Ready(Err(self.failure(&state, Some(e))));
            }
            ready!(self.wait(&mut state, Side::Write, cx, Waiter::Poll))?;
        }
    }
}
