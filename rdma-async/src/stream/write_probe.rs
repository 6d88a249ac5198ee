//! [`WriteProbe`]: probing the peer while a writer waits for its credits, like TCP's persist
//! timer.
//!
//! A writer blocked on credits has nothing in flight, so a peer host that vanished is never
//! noticed: no work request is there to run out of transport retries. While the writer waits,
//! a probe (rsockets' keepalive, a 0-byte RDMA write the peer's application never sees) goes out
//! every interval; a dead peer then fails the probe's transport retries and the writer gets that
//! error. A live peer that simply does not read costs one 0-byte write per interval.

use std::pin::Pin;
use std::task::Context;
use std::time::Duration;

use tokio::time::{Instant, Sleep};

/// How long a writer waits for credits before probing the peer, and between probes.
pub(crate) const WRITE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The probe timer of one stream's writing side.
#[derive(Debug)]
pub(super) struct WriteProbe {
    /// Allocated on the first wait and reused (reset) after that.
    timer: Option<Pin<Box<Sleep>>>,
    /// A wait is in progress: the timer runs. Progress disarms it, so the next wait starts a
    /// whole interval.
    armed: bool,
}

impl WriteProbe {
    pub(super) fn new() -> Self {
        WriteProbe {
            timer: None,
            armed: false,
        }
    }

    /// The writer made progress.
    pub(super) fn disarm(&mut self) {
        self.armed = false;
    }

    /// Whether a wait is in progress: a writer polled again since it began waiting, with no
    /// progress in between, is still in the same wait.
    pub(super) fn waiting(&self) -> bool {
        self.armed
    }

    /// Called by a writer about to wait: registers `cx` with the timer and returns whether a
    /// probe is due now (the timer then restarts for the next one).
    pub(super) fn poll_due(&mut self, cx: &mut Context<'_>) -> bool {
        let next = Instant::now() + WRITE_PROBE_INTERVAL;
        let timer = self
            .timer
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(next)));
        if !self.armed {
            timer.as_mut().reset(next);
            self.armed = true;
        }
        if timer.as_mut().poll(cx).is_pending() {
            return false;
        }
        timer.as_mut().reset(next);
        // Registers `cx` for the next probe (a just-reset timer is pending).
        let _ = timer.as_mut().poll(cx);
        true
    }
}
