//! What happens to the bytes a dropped stream had accepted: the close sends rsockets'
//! DISCONNECT after them and keeps the queue pair and rings until the peer has them all (or
//! its linger bound passed), so a `write_all` that returned `Ok` is never lost by dropping the
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

/// Closes `core`'s connection once the application dropped its last handle, waiting up to
/// `linger` ([`RStreamOptions::linger`](super::RStreamOptions::linger)) for the peer to take
/// the data written before.
pub(super) fn close(core: &Arc<StreamCore>, linger: Duration) {
    if !core.begin_close() {
        return;
    }
    let guard = Lingering {
        core: core.clone(),
        linger,
        deadline: Instant::now() + linger,
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
            Err(_) => warn_unacknowledged(linger),
        }
        guard.finished = true;
    };
    runtime.spawn(linger.instrument(span));
}

/// A close still waiting for its sends; dropped unfinished, it finishes them from the
/// dropping thread.
struct Lingering {
    core: Arc<StreamCore>,
    linger: Duration,
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
            warn_unacknowledged(self.linger);
        }
    }
}

/// The close gave up: bytes the application wrote may not have reached the peer (which reads
/// a reset, not a clean end of stream). A warning, as the writer's application learns of it
/// no other way.
fn warn_unacknowledged(linger: Duration) {
    tracing::warn!(
        ?linger,
        "closed before the peer acknowledged everything written: it reads a reset"
    );
}
