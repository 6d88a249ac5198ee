//! Handling completions: polling the queue in budgeted batches, handing each completion to
//! the protocol, reposting receives and taking back attached buffers.

use std::io;
use std::task::{Context, Poll, ready};

use tokio::task::coop;

use crate::proto::WR_ID_RECV_FLAG;
use crate::stream::side_wakers::{Polling, Reading};
use crate::verbs::{CompletionBatch, PolledCompletion, WcStatus, WorkCompletion};
use crate::verbs::{completion_error, wc_error};

use super::{BATCH, CoreState, PUMP_BATCHES, Side, StreamCore, StreamDevice, TARGET_SGL};

impl<D: StreamDevice> StreamCore<D> {
    /// Handles the completions already queued, up to [`PUMP_BATCHES`] batches. With `cx`, each
    /// batch spends a unit of the task's budget; once it is spent, this wakes the task and
    /// returns `Pending`, leaving the rest queued for the next poll. `reading`: whether (and how)
    /// the caller reads (or waits for readability): it looks at the stream again after this.
    pub(super) fn pump(
        &self,
        state: &mut CoreState,
        cx: Option<&mut Context<'_>>,
        reading: Reading,
    ) -> Poll<io::Result<()>> {
        self.pump_from(state, cx, reading, false)
    }

    /// [`Self::pump`]; with `unit_held`, the caller holds a unit of the task's budget for this
    /// call (a read or write that found nothing to do without completions): the first batch is
    /// paid with that unit, which the caller spends or gives back, and takes none of its own.
    pub(super) fn pump_from(
        &self,
        state: &mut CoreState,
        mut cx: Option<&mut Context<'_>>,
        reading: Reading,
        mut unit_held: bool,
    ) -> Poll<io::Result<()>> {
        let mut batch = CompletionBatch::<BATCH>::new();
        // The first look after a sleep, by a reader that reads until it finds nothing: the
        // event's read, and the next arm once this look has taken what the queue holds, come
        // now, not in that read's wait, which the caller makes after handing up what this
        // finds (`CoreState::reads_until_empty`). A failure leaves no arm outstanding: the
        // next wait arms again, and what the queue holds is handled first.
        let arm_ahead = std::mem::take(&mut state.slept)
            && state.reads_until_empty
            && self.device.take_wake_event().unwrap_or_else(|e| {
                tracing::debug!(parent: self.device.span(), error = %e, "reading the wake-up's event failed");
                false
            });
        for _ in 0..PUMP_BATCHES {
            let coop = match cx.as_deref_mut() {
                Some(_) if std::mem::take(&mut unit_held) => None,
                Some(cx) => Some(ready!(coop::poll_proceed(cx))),
                None => None,
            };
            let wcs = self.device.try_poll_batch(&mut batch)?;
            state.queue_empty = wcs.len() < BATCH;
            if wcs.is_empty() {
                if arm_ahead {
                    self.arm_ahead(state);
                }
                // Dropping `coop` unused gives the unit back.
                return Poll::Ready(Ok(()));
            }
            if let Some(coop) = &coop {
                coop.made_progress();
            }
            self.device.end_wait(&state.yields);
            let reader = cx
                .as_deref()
                .filter(|_| reading != Reading::No)
                .map(|cx| Polling {
                    waker: cx.waker(),
                    reading,
                });
            let drained = state.queue_empty;
            self.handle(state, wcs, reader)?;
            if drained {
                if arm_ahead {
                    self.arm_ahead(state);
                }
                // Less than a batch: the queue was empty after it, and polling it again now
                // (C's loop does) would most often find nothing. What arrives later is seen
                // by the next call, or by a waiter, which polls again after arming.
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Arms the queue ahead of the wait that a reader's next read makes when it finds nothing
    /// ([`StreamDevice::arm_ahead`]), after a look that drained it. A completion between that
    /// look and the arm raised no event, so the queue is no longer known empty: the next look
    /// (the caller's next read, or its wait, which then polls under the arm) finds it. Looking
    /// again here instead would cost a poll per wake-up that most often finds nothing. A
    /// failure is left to that wait, which arms again.
    fn arm_ahead(&self, state: &mut CoreState) {
        match self.device.arm_ahead() {
            Ok(()) => state.queue_empty = false,
            Err(e) => {
                tracing::debug!(parent: self.device.span(), error = %e, "arming after a wake-up failed");
            }
        }
    }

    /// [`Self::pump`] for calls without a task context: at most [`PUMP_BATCHES`] batches.
    pub(super) fn pump_some(&self, state: &mut CoreState) -> io::Result<()> {
        // Without a context there is no budget to wait for: this is always `Ready`.
        match self.pump(state, None, Reading::No) {
            Poll::Ready(result) => result,
            Poll::Pending => Ok(()),
        }
    }

    /// Handles the completions in the queue, as many as it can hold: for the end of a
    /// connection, when the order of events must be settled. Once the queue pair is in the
    /// error state that is all of them; while it is not (a wait failed for another reason), a
    /// peer could keep the queue full for ever, so the bound keeps this from looping for ever.
    pub(super) fn drain(&self, state: &mut CoreState) -> io::Result<()> {
        let mut batch = CompletionBatch::<BATCH>::new();
        let mut left = self.device.queue_capacity();
        loop {
            let wcs = self.device.try_poll_batch(&mut batch)?;
            if wcs.is_empty() {
                state.queue_empty = true;
                return Ok(());
            }
            self.handle(state, wcs, None)?;
            left = left.saturating_sub(wcs.len());
            if left == 0 {
                return Ok(());
            }
        }
    }

    /// Handles a batch of completions and wakes the waiters of both sides. Receives that
    /// cannot be posted again end the connection once the whole batch is handled: those
    /// completions are out of the queue, and the protocol's count of sends and receives must
    /// include them.
    ///
    /// `reader`: the task reading now (and how), which looks at the stream again before it
    /// returns. It is not woken on the reading side (every reader waits for the same thing,
    /// readable bytes, so it sees what the others would); waking it would only poll it again
    /// for nothing, once per message of a ping-pong (see [`SideWakers::wake_all_but`](crate::stream::side_wakers::SideWakers::wake_all_but)). On the
    /// writing side it is woken as any other: it may wait there for something else, polled
    /// earlier in this same poll.
    pub(super) fn handle(
        &self,
        state: &mut CoreState,
        wcs: &[PolledCompletion],
        reader: Option<Polling<'_>>,
    ) -> io::Result<()> {
        let mut reposts = 0;
        for wc in wcs {
            if wc.wr_id() & WR_ID_RECV_FLAG != 0 {
                state.stats.recv_completions += 1;
                reposts += usize::from(self.handle_recv(state, wc));
            } else {
                state.stats.send_completions += 1;
                // Few completions are sends (a stream signals one data write in 95 at the
                // default depth): these take the whole completion.
                let wc = &wc.to_work_completion();
                let ok = wc.status.is_success();
                if !ok && wc.status != WcStatus::FLUSH && !state.transport_error.is_set() {
                    let err = send_error(wc, self.device.peer_addr());
                    tracing::warn!(parent: self.device.span(), error = %err, "send failed");
                    state.transport_error.set(err);
                }
                // A lending ring's invalidations unbind their windows in the queue pair's
                // books too (it decides what may be viewed).
                self.device.window_completed(wc);
                if let Err(e) = state.conn.handle_send_completion(wc.wr_id, ok) {
                    tracing::debug!(parent: self.device.span(), error = %e, "send completion ended the connection");
                }
            }
        }
        // Consumed receives go back with one post once there are `repost_batch` of them, before
        // any control message that returns their credits; the spares cover those held back.
        // If they cannot be posted the connection ends there: what the batch delivered is
        // still read first, then the failure, by every reader and writer.
        state.unposted_recvs += reposts;
        if state.unposted_recvs >= state.repost_batch {
            let count = std::mem::take(&mut state.unposted_recvs);
            if let Err(e) = self.device.post_empty_recvs(WR_ID_RECV_FLAG, count) {
                self.fatal(state, e);
            }
        }
        // Most streams never attach a buffer: the empty case costs no call.
        if !state.attached.is_empty() {
            self.reclaim_attached(state);
        }
        let posted = self.post_controls(state);
        self.wakers[Side::Read as usize].wake_all_but(reader);
        self.wakers[Side::Write as usize].wake_all();
        posted
    }

    /// Takes back from the queue pair every attached buffer whose last send has completed.
    pub(super) fn reclaim_attached(&self, state: &mut CoreState) {
        while let Some(&attached) = state.attached.front() {
            if state.conn.is_send_outstanding(attached.last_send) {
                return;
            }
            state.attached.pop_front();
            if let Some(buffer) = self.device.reclaim(attached.attach_id)
                && !state.abandoned.remove(&attached.attach_id)
            {
                state.returned.insert(attached.attach_id, buffer);
            }
        }
    }

    /// Hands a receive completion to the protocol; returns whether its receive is to be
    /// posted again.
    pub(super) fn handle_recv(&self, state: &mut CoreState, wc: &PolledCompletion) -> bool {
        if !wc.status().is_success() {
            // Flushed or failed receives carry nothing; rsockets skips them too.
            return false;
        }
        let read_slot = |slot: usize| {
            let mut entry = [0u8; 16];
            // An out-of-range slot reads as an empty entry, which the protocol rejects.
            let _ = self.device.read_at(TARGET_SGL, slot * 16, &mut entry);
            entry
        };
        match state
            .conn
            .recv_completed(wc.imm_data(), wc.byte_len(), read_slot)
        {
            Ok(repost) => repost,
            Err(e) => {
                tracing::warn!(parent: self.device.span(), error = %e, "rsockets protocol violation");
                false
            }
        }
    }
}

/// The error of a stream's failed send. A stream writes only where the peer's own keys say; a
/// write they no longer allow (a remote access error) means the peer took its memory away, as
/// a process that exits does before its queue pair goes: for the application that is the
/// peer's reset, as `ECONNRESET` is for a `TcpStream`, with the status kept in the message.
fn send_error(wc: &WorkCompletion, peer: std::net::SocketAddr) -> io::Error {
    let err = wc_error(wc, peer, true);
    if wc.status != WcStatus::REMOTE_ACCESS {
        return err;
    }
    completion_error(
        io::ErrorKind::ConnectionReset,
        wc,
        format!(
            "connection with {peer} reset: the peer no longer accepts our writes into its \
             memory (its process exited, or it released its buffers): {err}"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_the_peers_keys_refuse_is_a_reset_and_other_failures_keep_their_kind() {
        let peer = "10.0.0.2:7471".parse().unwrap();
        let failed = |status| WorkCompletion {
            status,
            ..WorkCompletion::EMPTY
        };
        let err = send_error(&failed(WcStatus::REMOTE_ACCESS), peer);
        assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
        let text = err.to_string();
        assert!(
            text.contains("10.0.0.2:7471") && text.contains("remote access error"),
            "{text}"
        );
        let other = failed(WcStatus(
            rdma_async_sys::ibv_wc_status::IBV_WC_RETRY_EXC_ERR,
        ));
        assert_eq!(send_error(&other, peer).kind(), io::ErrorKind::TimedOut);
    }
}
