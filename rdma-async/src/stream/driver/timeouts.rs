//! The protocol's deadlines (the blocked writer's probe, the keepalive; `proto::timers`):
//! handled by a waiting writer, which arms the stream's timer, and by the keepalive task.

use std::io;
use std::task::Context;
use std::time::{Duration, Instant};

use crate::stream::deadline_timer;

use super::{CoreState, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Sends rsockets' keepalive every `interval` from now on; the keepalive task (see
    /// [`Self::next_timeout`]) sends it when no writer waits.
    pub(in crate::stream) fn set_keepalive(&self, interval: Duration) {
        self.lock()
            .conn
            .set_keepalive(interval, deadline_timer::now());
    }

    /// When the protocol's next deadline is due; `None` once none will be (the connection
    /// is down).
    pub(in crate::stream) fn next_timeout(&self) -> Option<Instant> {
        self.lock().conn.poll_timeout()
    }

    /// Handles the deadlines due now, for a task that slept until [`Self::next_timeout`]. A
    /// failed transport shows up in the completion of the keepalive write it posts.
    pub(in crate::stream) fn handle_due_timeouts(&self) -> io::Result<()> {
        let mut state = self.lock();
        self.pump_some(&mut state)?;
        self.handle_timeouts(&mut state, None)
    }

    /// Handles the protocol's deadlines that are due (posting the keepalive writes they
    /// queue), then, with `cx`, arms the stream's timer for the next one, to wake `cx`.
    pub(super) fn handle_timeouts(
        &self,
        state: &mut CoreState,
        mut cx: Option<&mut Context<'_>>,
    ) -> io::Result<()> {
        loop {
            let expired = state.conn.handle_timeout(deadline_timer::now());
            if expired.probe {
                tracing::trace!(parent: self.device.span(), "writer blocked on credits: probing the peer");
                state.stats.write_probes += 1;
            }
            if expired.any() {
                self.post_controls(state)?;
            }
            let (Some(cx), Some(at)) = (cx.as_deref_mut(), state.conn.poll_timeout()) else {
                return Ok(());
            };
            if !state.timer.poll_at(at, cx) {
                return Ok(());
            }
            // Due already (the clock moved on): handle it now.
        }
    }
}
