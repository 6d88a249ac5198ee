//! [`CmWatch`]: one task's watch on a connection's rdma_cm channel, left registered between
//! waits.
//!
//! Every wait for completions also watches for a disconnect. Registering with the reactor again
//! on each wait (Tokio's `poll_read_ready`) cost about a quarter as much as the rest of arming
//! the wait (callgrind), for an event that comes once in a connection's life. A registration
//! stays in place until its descriptor turns readable, so the watch gives the reactor a waker of
//! its own, which counts its wake-ups and passes them on to the task: while none came since the
//! registration was made, a wait only updates which task to wake.

use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Context, Poll, Wake, Waker};

use super::link::CmLink;
use crate::reactor::FdWaiter;
use crate::sync::{AtomicU64, Lock, LockGuard};

/// No registration is known to be in place.
const NOT_REGISTERED: u64 = u64::MAX;

/// A task's registration on a connection's rdma_cm channel.
#[derive(Debug)]
pub(crate) struct CmWatch {
    fd: FdWaiter,
    relayed: Relayed,
}

/// The relay and what it says about the registration in place (apart from the descriptor, so
/// that the loom check runs it against a model of one).
#[derive(Debug)]
struct Relayed {
    relay: Arc<Relay>,
    /// `relay` as a waker, made once.
    relay_waker: Waker,
    /// `relay.wakes` when the registration in place was made, or [`NOT_REGISTERED`].
    registered_at: AtomicU64,
}

/// The waker the reactor holds: it counts its wake-ups and wakes the task last registered.
#[derive(Debug, Default)]
struct Relay {
    wakes: AtomicU64,
    task: Lock<Option<Waker>>,
}

impl Wake for Relay {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Counted before the task is woken, so the task, polled, registers again.
        self.wakes.fetch_add(1, Ordering::AcqRel);
        // Kept, not taken: the same task most often waits again. Woken outside the lock.
        let task = self.lock().clone();
        if let Some(task) = task {
            task.wake();
        }
    }
}

impl Relay {
    fn lock(&self) -> LockGuard<'_, Option<Waker>> {
        self.task.lock()
    }

    /// Makes `waker` the one woken next.
    fn set_task(&self, waker: &Waker) {
        let mut task = self.lock();
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }
}

impl CmWatch {
    /// Takes a slot on `link`'s channel registration (see [`FdWaiter`]).
    pub(crate) fn new(link: &CmLink) -> io::Result<Self> {
        Ok(CmWatch {
            fd: link.waiter(),
            relayed: Relayed::default(),
        })
    }

    /// As [`CmLink::poll_disconnected`] (`link` must be the connection this watch was made
    /// for), without registering again while the registration made earlier is in place and
    /// nothing woke it.
    pub(crate) fn poll_disconnected(
        &self,
        link: &CmLink,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        // Also set without an rdma_cm event (a device event that broke the queue pair).
        if link.is_disconnected() {
            return Poll::Ready(Ok(()));
        }
        self.relayed.relay.set_task(cx.waker());
        self.poll_registered(link)
    }

    /// Whether the connection is closed or closing, reading the
    /// channel only when it turned readable since it was last read.
    pub(crate) fn try_closed(&self, link: &CmLink) -> io::Result<bool> {
        if let Poll::Ready(Err(e)) = self.poll_registered(link) {
            return Err(e);
        }
        Ok(link.is_closed_or_closing())
    }

    /// Reads the channel if a wake-up came since the registration in place was made (or none
    /// is), and registers the relay again when it finds nothing more to read.
    fn poll_registered(&self, link: &CmLink) -> Poll<io::Result<()>> {
        self.relayed.poll(|cx| link.poll_disconnected(&self.fd, cx))
    }
}

impl Default for Relayed {
    fn default() -> Self {
        let relay = Arc::new(Relay::default());
        Relayed {
            relay_waker: Waker::from(relay.clone()),
            relay,
            registered_at: AtomicU64::new(NOT_REGISTERED),
        }
    }
}

impl Relayed {
    /// [`CmWatch::poll_registered`], with `look` reading the channel and registering the
    /// context's waker when it finds nothing.
    #[inline]
    fn poll(
        &self,
        look: impl FnOnce(&mut Context<'_>) -> Poll<io::Result<()>>,
    ) -> Poll<io::Result<()>> {
        // Read before registering: a wake-up after the registration counts past it.
        let wakes = self.relay.wakes.load(Ordering::Acquire);
        if self.registered_at.load(Ordering::Relaxed) == wakes {
            return Poll::Pending;
        }
        let mut cx = Context::from_waker(&self.relay_waker);
        let polled = look(&mut cx);
        let registered_at = if polled.is_pending() {
            wakes
        } else {
            NOT_REGISTERED
        };
        self.registered_at.store(registered_at, Ordering::Relaxed);
        polled
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake_count::WakeCount;

    #[test]
    fn the_relay_counts_each_wake_up_and_wakes_the_last_task_set_each_time() {
        let relay = Arc::new(Relay::default());
        let waker = Waker::from(relay.clone());
        waker.wake_by_ref();
        assert_eq!(
            relay.wakes.load(Ordering::Relaxed),
            1,
            "counted with no task set"
        );
        let (first, second) = (
            Arc::new(WakeCount::default()),
            Arc::new(WakeCount::default()),
        );
        relay.set_task(&Waker::from(first.clone()));
        relay.set_task(&Waker::from(second.clone()));
        waker.wake_by_ref();
        waker.wake_by_ref();
        assert_eq!(relay.wakes.load(Ordering::Relaxed), 3);
        assert_eq!(first.get(), 0, "replaced: not woken");
        assert_eq!(second.get(), 2, "kept across wake-ups");
    }
}

#[cfg(all(test, rdma_async_loom))]
mod loom_tests {
    //! Under loom: a task waits twice through the relay while the reactor finds the channel
    //! readable and wakes the registration in place. In every interleaving the task either
    //! found the channel readable or was woken, and once woken its next look reads the channel
    //! (the wake-up counted past the registration it had).

    use std::sync::atomic::AtomicUsize;

    use loom::sync::Mutex as Channel;
    use loom::thread;

    use super::*;

    /// The channel's descriptor as the reactor sees it.
    #[derive(Default)]
    struct Fd {
        readable: bool,
        /// The waker of the registration in place.
        registered: Option<Waker>,
    }

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn look(fd: &Channel<Fd>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut fd = fd.lock().unwrap();
        if fd.readable {
            return Poll::Ready(Ok(()));
        }
        fd.registered = Some(cx.waker().clone());
        Poll::Pending
    }

    #[test]
    fn loom_the_relay_loses_no_wake_up_across_waits() {
        loom::model(|| {
            let relayed = Arc::new(Relayed::default());
            let fd = Arc::new(Channel::new(Fd::default()));
            let reactor = {
                let fd = fd.clone();
                thread::spawn(move || {
                    let mut state = fd.lock().unwrap();
                    state.readable = true;
                    let waker = state.registered.take();
                    drop(state);
                    if let Some(waker) = waker {
                        waker.wake();
                    }
                })
            };
            let count = Arc::new(Count(AtomicUsize::new(0)));
            let task = Waker::from(count.clone());
            let mut found = false;
            for _ in 0..2 {
                relayed.relay.set_task(&task);
                found |= relayed.poll(|cx| look(&fd, cx)).is_ready();
            }
            reactor.join().unwrap();
            assert!(
                found || count.0.load(Ordering::SeqCst) > 0,
                "the task was neither woken nor saw the channel readable"
            );
            relayed.relay.set_task(&task);
            assert!(
                relayed.poll(|cx| look(&fd, cx)).is_ready(),
                "after the wake-up the watch did not look at the channel"
            );
        });
    }
}
