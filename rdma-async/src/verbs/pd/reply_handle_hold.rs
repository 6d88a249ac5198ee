//! Test hook (`--cfg rdma_async_hooks`): holds every creation of an address handle that answers
//! a received datagram (`ibv_create_ah_from_wc`) until the test releases it, as a RoCE device
//! that resolves the sender's neighbour synchronously would, so a test can check that no runtime
//! thread waits for one. Process-wide, since the creation runs on whichever thread makes it; one
//! hold at a time. Bounded: a creation held for [`HOLD_LIMIT`] gives up, ends the hold (later
//! creations go on) and records it, so a build that waits on a runtime thread fails its test
//! instead of hanging.

use std::sync::{Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::watch;

/// How long a creation waits for the test to release the hold before it goes on anyway.
const HOLD_LIMIT: Duration = Duration::from_secs(30);

/// The hold in force, if any.
#[derive(Debug)]
struct Hold {
    released: bool,
    gave_up: bool,
    /// How many creations have been held so far.
    held: watch::Sender<usize>,
}

static HOLD: Mutex<Option<Hold>> = Mutex::new(None);
static RELEASED: Condvar = Condvar::new();

fn hold() -> MutexGuard<'static, Option<Hold>> {
    // A plain flag and counter: a panic elsewhere cannot leave them half-changed.
    HOLD.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Holds address-handle creations from received datagrams until released or dropped (see the
/// module docs).
#[derive(Debug)]
pub struct ReplyHandleHold {
    held: watch::Receiver<usize>,
}

/// Starts holding every creation of an address handle from a received datagram, replacing any
/// hold in force.
pub fn hold_reply_handles() -> ReplyHandleHold {
    let (held, watched) = watch::channel(0);
    *hold() = Some(Hold {
        released: false,
        gave_up: false,
        held,
    });
    ReplyHandleHold { held: watched }
}

impl ReplyHandleHold {
    /// Waits until `count` creations have been held (or have waited and given up).
    pub async fn wait_held(&mut self, count: usize) {
        // The sender lives in the static hold until this hold is dropped: never closed here.
        let _ = self.held.wait_for(|n| *n >= count).await;
    }

    /// How many creations have been held so far.
    pub fn held(&self) -> usize {
        *self.held.borrow()
    }

    /// Whether a creation waited the 30 s limit and went on without being released.
    pub fn gave_up(&self) -> bool {
        hold().as_ref().is_some_and(|h| h.gave_up)
    }

    /// Lets held and later creations go on.
    pub fn release(self) {}
}

impl Drop for ReplyHandleHold {
    fn drop(&mut self) {
        *hold() = None;
        RELEASED.notify_all();
    }
}

/// Called before each creation of an address handle from a received datagram: waits while a
/// test holds them, for at most [`HOLD_LIMIT`].
pub(crate) fn wait_if_held() {
    let mut guard = hold();
    let Some(h) = guard.as_mut().filter(|h| !h.released) else {
        return;
    };
    h.held.send_modify(|n| *n += 1);
    let still_held = |h: &mut Option<Hold>| h.as_ref().is_some_and(|h| !h.released);
    let (mut guard, waited) = RELEASED
        .wait_timeout_while(guard, HOLD_LIMIT, still_held)
        .unwrap_or_else(PoisonError::into_inner);
    if waited.timed_out()
        && let Some(h) = guard.as_mut()
    {
        h.gave_up = true;
        h.released = true;
        RELEASED.notify_all();
    }
}
