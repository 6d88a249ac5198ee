//! [`DeadlineTimer`]: the one Tokio timer of a stream, armed for the protocol's next deadline
//! (`proto::Connection::poll_timeout`: the blocked writer's probe, the keepalive). The
//! decisions are the protocol's; this only wakes whoever handles them in time.

use std::pin::Pin;
use std::task::Context;

use tokio::time::Sleep;

/// Now, on Tokio's clock (which a test may pause), as the protocol's input.
pub(super) fn now() -> std::time::Instant {
    tokio::time::Instant::now().into_std()
}

/// A reusable timer for one deadline at a time.
#[derive(Debug, Default)]
pub(super) struct DeadlineTimer {
    /// Allocated on first use and reset after that.
    sleep: Option<Pin<Box<Sleep>>>,
}

impl DeadlineTimer {
    /// Arms the timer for `at` and registers `cx` to be woken then. Returns whether `at` has
    /// passed already (the caller then handles the deadline now).
    pub(super) fn poll_at(&mut self, at: std::time::Instant, cx: &mut Context<'_>) -> bool {
        let at = tokio::time::Instant::from_std(at);
        let sleep = self
            .sleep
            .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
        if sleep.deadline() != at {
            sleep.as_mut().reset(at);
        }
        sleep.as_mut().poll(cx).is_ready()
    }
}
