//! Closing: SHUTDOWN and DISCONNECT, and lingering until the sends queued before close
//! completed.

use std::sync::Arc;
use std::task::Poll;

use crate::stream::side_wakers::{Reading, Waiter};

use super::{CoreState, Side, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Queues rsockets' SHUTDOWN without waiting for it (dropping a write half).
    pub(in crate::stream) fn begin_shutdown(&self) {
        let mut state = self.lock();
        if !state.shutdown_started {
            state.shutdown_started = true;
            state.conn.shutdown_write();
            // Posted before the completions are handled, as in `poll_shutdown` (a peer's
            // SHUTDOWN among them would drop ours); again after, if it waited for a slot.
            let _ = self.post_controls(&mut state);
            let _ = self.pump_some(&mut state);
            let _ = self.post_controls(&mut state);
        }
    }

    /// Starts closing: queues rsockets' DISCONNECT. Returns whether sends are still in flight.
    pub(in crate::stream) fn begin_close(&self) -> bool {
        let mut state = self.lock();
        state.conn.close();
        // As in `begin_shutdown`: the DISCONNECT goes out before a peer's SHUTDOWN can drop it.
        let _ = self.post_controls(&mut state);
        let _ = self.pump_some(&mut state);
        let _ = self.post_controls(&mut state);
        !Self::close_settled(&state)
    }

    /// Whether closing has nothing left to wait for: every send queued before the close
    /// completed, or the connection is already down.
    pub(super) fn close_settled(state: &CoreState) -> bool {
        state.conn.all_sends_done() || state.conn.is_disconnected() || state.conn.error().is_some()
    }

    /// [`Self::linger`] without a runtime: polls the completion queue from this thread,
    /// sleeping a little between looks, until the sends queued before close completed or
    /// `deadline` passed (as rsockets' `rclose` blocks). Returns whether they completed.
    pub(in crate::stream) fn linger_blocking(&self, deadline: std::time::Instant) -> bool {
        const FIRST_NAP: std::time::Duration = std::time::Duration::from_micros(50);
        const LONGEST_NAP: std::time::Duration = std::time::Duration::from_millis(1);
        let mut nap = FIRST_NAP;
        loop {
            {
                let mut state = self.lock();
                let handled = state.stats.send_completions + state.stats.recv_completions;
                if self.pump_some(&mut state).is_err() {
                    return false;
                }
                let _ = self.post_controls(&mut state);
                if Self::close_settled(&state) {
                    return state.conn.all_sends_done();
                }
                if state.stats.send_completions + state.stats.recv_completions != handled {
                    nap = FIRST_NAP;
                }
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(LONGEST_NAP);
        }
    }

    /// Waits (boundedly, by the caller) until the sends queued before close completed.
    pub(in crate::stream) async fn linger(self: Arc<Self>) {
        std::future::poll_fn(|cx| {
            let mut state = self.lock();
            loop {
                match self.pump(&mut state, Some(&mut *cx), Reading::No) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
                let _ = self.post_controls(&mut state);
                if Self::close_settled(&state) {
                    return Poll::Ready(());
                }
                match self.wait(&mut state, Side::Write, cx, Waiter::Poll) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
    }
}
