//! What happens to the bytes a dropped stream had accepted: the close sends rsockets'
//! DISCONNECT after them and keeps the queue pair and rings until the peer has them all (or
//! [`LINGER`] passed), so a `write_all` that returned `Ok` is never lost by dropping the
//! stream, the task, or the runtime.
//!
//! Inside a runtime a task does the waiting. Where no task can, the thread that drops does it,
//! polling the completion queue itself (as rsockets' `rclose` does): when the stream is dropped
//! outside any runtime, and when the runtime drops the lingering task unfinished (it shuts down:
//! a `#[tokio::main]` returning is the common case). Only a process that dies, or exits without
//! dropping its streams (`std::process::exit`), loses them, and then the peer reads a reset,
//! never a clean end of stream.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tracing::Instrument;

use super::driver::StreamCore;

/// How long a dropped stream keeps its resources so that data written before the drop still
/// reaches the peer (rsockets' `rclose` waits without a bound; we do not hang for ever).
pub(super) const LINGER: Duration = Duration::from_secs(10);

/// Closes `core`'s connection once the application dropped its last handle.
pub(super) fn close(core: &Arc<StreamCore>) {
    if !core.begin_close() {
        return;
    }
    let guard = Lingering {
        core: core.clone(),
        deadline: Instant::now() + LINGER,
        finished: false,
    };
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        // Dropping `guard` drains from this thread.
        return;
    };
    let span = core.link().span().clone();
    // `guard` moves into the future before its first poll, so a runtime that drops the task
    // unpolled still drains through it.
    let linger = async move {
        let mut guard = guard;
        match tokio::time::timeout_at(guard.deadline.into(), guard.core.clone().linger()).await {
            Ok(()) => tracing::debug!("closed after lingering"),
            Err(_) => {
                tracing::debug!(?LINGER, "closed: the peer did not take all data in time")
            }
        }
        guard.finished = true;
    };
    runtime.spawn(linger.instrument(span));
}

/// A close still waiting for its sends; dropped unfinished, it finishes them from the
/// dropping thread.
struct Lingering {
    core: Arc<StreamCore>,
    deadline: Instant,
    finished: bool,
}

impl Drop for Lingering {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        let _span = self.core.link().span().clone().entered();
        if self.core.linger_blocking(self.deadline) {
            tracing::debug!("closed after lingering in the dropping thread");
        } else {
            tracing::debug!(?LINGER, "closed: the sends did not complete in time");
        }
    }
}
