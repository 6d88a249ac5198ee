//! [`SideWakers`]: every task waiting on one side (reading or writing) of a stream.
//!
//! Each side registers with the reactor once (its `ConnWaiter`), and Tokio keeps only one
//! waker per registration. So the reactor and the timers never get a task's waker: they get the
//! side's own waker ([`SideWakers::waker`]), which wakes every task waiting on that side. Two
//! tasks awaiting `readable()` are then both woken, and a waiter that goes away (a dropped
//! future, a task that stops polling) cannot take the others' wake-up with it.
//!
//! As with `TcpStream`, the poll functions (`poll_read`, `poll_write`, ...) keep one waker per
//! side, the most recent; each pending `readable()`/`writable()` future keeps its own until it
//! is woken or dropped.
//!
//! A poll function that went to sleep because nothing was readable marks the side blocked
//! ([`SideWakers::register_blocked`]); every wake-up of the side clears the mark. Everything
//! that can make the side readable (completions handled, the arm's event, a disconnect, a
//! failure) wakes the side, so while the mark stands a poll function called again (a task
//! polled for something else, as hyper's connection task is several times a request) finds
//! the side as it left it, and returns `Pending` at once ([`SideWakers::still_blocked`]):
//! the arm and the registrations its sleep made are still in place.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::task::{Wake, Waker};

use crate::sync::{AtomicBool, Lock, LockGuard};

use super::driver::Side;

/// The tasks waiting on one side of a stream.
#[derive(Debug, Default)]
pub(super) struct SideWakers {
    waiting: Lock<Waiting>,
    /// False only while nobody is registered, so that a wake-up with nobody to wake (most of
    /// them on the data path) skips the lock. Set under the lock by every registration, which
    /// comes before the registrant looks at the stream again (under the stream's lock, the
    /// same one a waking handler holds), so a wake-up meant for it always sees it set.
    maybe_waiting: AtomicBool,
}

#[derive(Debug, Default)]
struct Waiting {
    /// The waker of the most recent poll function call on this side.
    last_poll: Option<Waker>,
    /// One waker per pending readiness future, by the future's id.
    futures: Vec<(u64, Waker)>,
    next_id: u64,
    /// The poll function of `last_poll` went to sleep with the side blocked, and nothing has
    /// woken the side since ([`SideWakers::register_blocked`]).
    blocked: bool,
}

/// A readiness future's place among the waiters: removed when the future is dropped.
#[derive(Debug)]
pub(super) struct Registration<'a> {
    wakers: &'a SideWakers,
    id: Option<u64>,
}

/// Who is about to wait on a side.
#[derive(Debug)]
pub(super) enum Waiter<'r, 'a> {
    /// A poll function: only the most recent caller's waker is kept, as Tokio does.
    Poll,
    /// A readiness future: every pending one is woken.
    Future(&'r mut Registration<'a>),
}

/// How a task handling completions reads the stream, if it does: it looks at the reading side
/// again itself after handling them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Reading {
    /// Not reading (writing, flushing, shutting down).
    No,
    /// Through a poll function (`poll_read`, `poll_read_ready`, `try_read`).
    PollFn,
    /// Through a readiness future.
    Future,
}

/// The task being polled while it handles completions, and how it reads.
#[derive(Debug, Clone, Copy)]
pub(super) struct Polling<'w> {
    pub(super) waker: &'w Waker,
    pub(super) reading: Reading,
}

impl<'a> Waiter<'_, 'a> {
    /// How this waiter reads when it waits on `side`.
    pub(super) fn reading_on(&self, side: Side) -> Reading {
        match (side, self) {
            (Side::Write, _) => Reading::No,
            (Side::Read, Waiter::Poll) => Reading::PollFn,
            (Side::Read, Waiter::Future(_)) => Reading::Future,
        }
    }

    /// The same waiter for one more call.
    pub(super) fn reborrow(&mut self) -> Waiter<'_, 'a> {
        match self {
            Waiter::Poll => Waiter::Poll,
            Waiter::Future(registration) => Waiter::Future(registration),
        }
    }
}

impl SideWakers {
    /// The waker to hand to the reactor and timers: it wakes every waiter of this side.
    pub(super) fn waker(self: &Arc<Self>) -> Waker {
        Waker::from(self.clone())
    }

    /// A registration for one readiness future.
    pub(super) fn registration(&self) -> Registration<'_> {
        Registration {
            wakers: self,
            id: None,
        }
    }

    /// Keeps `waker` until the next wake-up of this side.
    pub(super) fn register(&self, waiter: Waiter<'_, '_>, waker: &Waker) {
        let mut waiting = self.lock();
        self.maybe_waiting.store(true, Ordering::Release);
        match waiter {
            Waiter::Poll => self.set_last_poll(&mut waiting, waker),
            Waiter::Future(registration) => {
                let id = *registration.id.get_or_insert_with(|| {
                    waiting.next_id += 1;
                    waiting.next_id
                });
                match waiting.futures.iter_mut().find(|(i, _)| *i == id) {
                    Some((_, w)) if w.will_wake(waker) => {}
                    Some((_, w)) => *w = waker.clone(),
                    None => waiting.futures.push((id, waker.clone())),
                }
            }
        }
    }

    /// Registers `waker` as the poll function's, about to sleep because the side is blocked
    /// (nothing to read), and marks the side so until its next wake-up.
    ///
    /// Called before whatever can wake the side is set up for the sleep (the arm, the
    /// reactor's and rdma_cm's registrations): a wake-up that comes at any point after that
    /// clears the mark. Marked after them, a wake-up in between would be lost: the task, woken,
    /// would find the mark and never look.
    pub(super) fn register_blocked(&self, waker: &Waker) {
        let mut waiting = self.lock();
        self.set_last_poll(&mut waiting, waker);
        waiting.blocked = true;
    }

    /// The sleep [`Self::register_blocked`] was for did not happen (the wait found what it
    /// waited for): the mark goes.
    pub(super) fn unmark_blocked(&self) {
        self.lock().blocked = false;
    }

    /// Whether the side is still as a poll function's sleep left it (see
    /// [`Self::register_blocked`]): then `waker` is the poll function's registration from now on,
    /// and the caller returns `Pending`.
    pub(super) fn still_blocked(&self, waker: &Waker) -> bool {
        // The mark is set only with a registration, which sets `maybe_waiting`: with neither,
        // this is one load.
        if !self.maybe_waiting.load(Ordering::Acquire) {
            return false;
        }
        let mut waiting = self.lock();
        if waiting.blocked {
            self.set_last_poll(&mut waiting, waker);
        }
        waiting.blocked
    }

    /// Makes `waker` the poll function's registration.
    fn set_last_poll(&self, waiting: &mut Waiting, waker: &Waker) {
        self.maybe_waiting.store(true, Ordering::Release);
        if !waiting
            .last_poll
            .as_ref()
            .is_some_and(|w| w.will_wake(waker))
        {
            waiting.last_poll = Some(waker.clone());
        }
    }

    /// Wakes every task waiting on this side (each registers again if it still waits).
    pub(super) fn wake_all(&self) {
        self.wake_all_but(None);
    }

    /// Wakes every task waiting on this side but the one `polling` wakes, if any: that task is
    /// being polled now and looks at the side again itself, so it is not polled again for
    /// nothing. When it reads through a poll function, the poll-function registration with its
    /// waker goes (that call registers again if it goes on waiting, replacing it), so that the
    /// next wake-up with nobody else waiting skips the lock; otherwise it stays, as do its
    /// readiness futures': those may be left pending while the task returns.
    #[inline]
    pub(super) fn wake_all_but(&self, polling: Option<Polling<'_>>) {
        // The common case on the data path, nobody waiting on this side, costs a load: the
        // rest (with its stack frame) is out of line.
        if self.maybe_waiting.load(Ordering::Acquire) {
            self.wake_registered_but(polling);
        }
    }

    #[inline(never)]
    fn wake_registered_but(&self, polling: Option<Polling<'_>>) {
        let (last_poll, futures) = {
            let mut waiting = self.lock();
            // Whatever woke the side may have changed it, also for the task not woken (it
            // looks again itself).
            waiting.blocked = false;
            let skip = |w: &Waker| polling.is_some_and(|p| w.will_wake(p.waker));
            let last_poll = match &waiting.last_poll {
                Some(w) if skip(w) => {
                    if polling.is_some_and(|p| p.reading == Reading::PollFn) {
                        waiting.last_poll = None;
                    }
                    None
                }
                _ => waiting.last_poll.take(),
            };
            let futures: Vec<_> = if polling.is_none() || waiting.futures.is_empty() {
                std::mem::take(&mut waiting.futures)
            } else {
                waiting.futures.extract_if(.., |(_, w)| !skip(w)).collect()
            };
            // Nobody left: the next wake-ups skip the lock until someone registers.
            if waiting.last_poll.is_none() && waiting.futures.is_empty() {
                self.maybe_waiting.store(false, Ordering::Release);
            }
            (last_poll, futures)
        };
        // Woken outside the lock: a waker may run code that registers again.
        if let Some(waker) = last_poll {
            waker.wake();
        }
        for (_, waker) in futures {
            waker.wake();
        }
    }

    fn lock(&self) -> LockGuard<'_, Waiting> {
        // Every update leaves the lists consistent (a panicking waker is woken outside it).
        self.waiting.lock()
    }

    /// How many readiness futures wait now.
    #[cfg(test)]
    fn futures_waiting(&self) -> usize {
        self.lock().futures.len()
    }
}

impl Wake for SideWakers {
    fn wake(self: Arc<Self>) {
        self.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all();
    }
}

impl Drop for Registration<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            self.wakers.lock().futures.retain(|(i, _)| *i != id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake_count::{WakeCount as Counter, counting_waker as counter};

    fn woken(c: &Counter) -> usize {
        c.get()
    }

    /// Two tasks' counting wakers, each registered on `side` by a readiness future of its own
    /// (whose registration it returns: dropping it removes the future).
    fn two_futures(side: &SideWakers) -> [(Arc<Counter>, Waker, Registration<'_>); 2] {
        [(), ()].map(|()| {
            let (count, waker) = counter();
            let mut registration = side.registration();
            side.register(Waiter::Future(&mut registration), &waker);
            (count, waker, registration)
        })
    }

    #[test]
    fn every_pending_future_is_woken() {
        let side = Arc::new(SideWakers::default());
        let [(a, _wa, _ra), (b, _wb, _rb)] = two_futures(&side);
        // What the reactor holds: the side's waker, not a task's.
        side.waker().wake();
        assert_eq!((woken(&a), woken(&b)), (1, 1));
        // Woken futures are off the list until they register again.
        side.wake_all();
        assert_eq!((woken(&a), woken(&b)), (1, 1));
    }

    #[test]
    fn a_task_registering_after_the_side_emptied_is_woken() {
        let side = Arc::new(SideWakers::default());
        let (a, wa) = counter();
        // Nobody waits: a wake-up finds nothing (and lets the next ones skip the lock).
        side.wake_all();
        side.register(Waiter::Poll, &wa);
        side.wake_all();
        assert_eq!(woken(&a), 1);
        // Woken and gone: the next wake-up reaches nobody until it registers again.
        side.wake_all();
        assert_eq!(woken(&a), 1);
        side.register(Waiter::Poll, &wa);
        side.wake_all_but(None);
        assert_eq!(woken(&a), 2);
    }

    #[test]
    fn poll_functions_keep_only_the_last_waker() {
        let side = Arc::new(SideWakers::default());
        let (a, wa) = counter();
        let (b, wb) = counter();
        side.register(Waiter::Poll, &wa);
        side.register(Waiter::Poll, &wb);
        side.wake_all();
        assert_eq!((woken(&a), woken(&b)), (0, 1));
    }

    #[test]
    fn a_dropped_future_leaves_the_list_and_the_others_stay() {
        let side = Arc::new(SideWakers::default());
        let [(a, wa, mut ra), (b, _wb, _rb)] = two_futures(&side);
        // Registering again replaces, never duplicates.
        side.register(Waiter::Future(&mut ra), &wa);
        assert_eq!(side.futures_waiting(), 2);
        drop(ra);
        assert_eq!(side.futures_waiting(), 1);
        side.wake_all();
        assert_eq!((woken(&a), woken(&b)), (0, 1));
    }

    #[test]
    fn the_task_being_polled_is_not_woken_and_its_futures_stay_registered() {
        let side = Arc::new(SideWakers::default());
        let [(a, wa, _ra), (b, _wb, _rb)] = two_futures(&side);
        side.register(Waiter::Poll, &wa);
        // Task `a` handles completions itself in a poll function: only `b` is woken.
        let polling = Polling {
            waker: &wa,
            reading: Reading::PollFn,
        };
        side.wake_all_but(Some(polling));
        assert_eq!((woken(&a), woken(&b)), (0, 1));
        assert_eq!(side.futures_waiting(), 1, "a's future is still on the list");
        // A later wake-up from elsewhere reaches a's future; its poll registration went with
        // the wake-up it handled itself (it registers again when it waits again).
        side.wake_all();
        assert_eq!((woken(&a), woken(&b)), (1, 1));
        side.register(Waiter::Poll, &wa);
        side.wake_all();
        assert_eq!((woken(&a), woken(&b)), (2, 1));
    }

    #[test]
    fn a_task_reading_through_a_future_keeps_its_poll_registration() {
        let side = Arc::new(SideWakers::default());
        let (a, wa) = counter();
        side.register(Waiter::Poll, &wa);
        // The same task handles completions in a readiness future: a poll-function call of
        // it may still be pending, so its registration stays for the next wake-up.
        let polling = Polling {
            waker: &wa,
            reading: Reading::Future,
        };
        side.wake_all_but(Some(polling));
        assert_eq!(woken(&a), 0);
        side.wake_all();
        assert_eq!(woken(&a), 1);
    }

    #[test]
    fn every_wake_up_clears_the_blocked_mark_and_a_call_under_it_registers() {
        let side = Arc::new(SideWakers::default());
        let (a, wa) = counter();
        let (b, wb) = counter();
        assert!(!side.still_blocked(&wa), "nothing marked yet");
        side.register_blocked(&wa);
        assert!(side.still_blocked(&wb), "marked, and nothing woke the side");
        side.wake_all();
        assert_eq!(
            (woken(&a), woken(&b)),
            (0, 1),
            "the call under the mark registered"
        );
        assert!(!side.still_blocked(&wb), "a wake-up clears the mark");

        // Also one that skips the task being polled (it handles completions itself).
        side.register_blocked(&wa);
        side.wake_all_but(Some(Polling {
            waker: &wa,
            reading: Reading::PollFn,
        }));
        assert!(
            !side.still_blocked(&wa),
            "a wake-up skipping the poller clears it"
        );

        // And a wait that ended without sleeping takes its mark back.
        side.register_blocked(&wa);
        side.unmark_blocked();
        assert!(!side.still_blocked(&wa), "unmarked");
        // A plain registration marks nothing.
        side.register(Waiter::Poll, &wa);
        assert!(
            !side.still_blocked(&wa),
            "a registration alone marks nothing"
        );
    }
}

#[cfg(all(test, rdma_async_loom))]
mod loom_tests {
    //! Under loom, the `maybe_waiting` fast path with its documented protocol: a task registers,
    //! then looks at the stream under the stream's lock; a handler changes the stream and wakes
    //! the side under the same lock. In every interleaving each task either saw the change or
    //! was woken, also while an earlier wake-up empties the side and clears the flag.

    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    use loom::sync::Mutex as StreamLock;
    use loom::sync::atomic::AtomicUsize;
    use loom::thread;

    use super::*;

    struct Counter(AtomicUsize);

    impl Wake for Counter {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn counter() -> (Arc<Counter>, Waker) {
        let count = Arc::new(Counter(AtomicUsize::new(0)));
        (count.clone(), Waker::from(count))
    }

    fn woken(count: &Counter) -> bool {
        count.0.load(Ordering::SeqCst) > 0
    }

    /// Two tasks that found the stream empty wait (one through a readiness future, one through
    /// a poll function, on another thread) while a handler makes it readable.
    #[test]
    fn loom_a_registration_racing_a_wake_up_never_loses_it() {
        loom::model(|| {
            let side = Arc::new(SideWakers::default());
            let stream = Arc::new(StreamLock::new(false));
            let handler = {
                let (side, stream) = (side.clone(), stream.clone());
                thread::spawn(move || {
                    let mut readable = stream.lock().unwrap();
                    *readable = true;
                    side.wake_all();
                })
            };
            let poller = {
                let (side, stream) = (side.clone(), stream.clone());
                thread::spawn(move || {
                    let (count, waker) = counter();
                    side.register(Waiter::Poll, &waker);
                    let saw = *stream.lock().unwrap();
                    (saw, count)
                })
            };
            let (count, waker) = counter();
            let mut registration = side.registration();
            side.register(Waiter::Future(&mut registration), &waker);
            let saw = *stream.lock().unwrap();
            handler.join().unwrap();
            let (poller_saw, poller_count) = poller.join().unwrap();
            assert!(saw || woken(&count), "the future's wake-up was lost");
            assert!(
                poller_saw || woken(&poller_count),
                "the poll function's wake-up was lost"
            );
        });
    }

    /// A poll function's sleep on a blocked side against a completion that makes it readable:
    /// the sleep marks the side and registers (`mark_first`; or, wrongly, registers and marks
    /// only after its look), then looks at the stream; the device makes it readable and wakes
    /// the side; the task, polled again meanwhile with a new waker, takes the shortcut while
    /// the mark stands.
    fn blocked_mark_against_a_wake_up(mark_first: bool) {
        loom::model(move || {
            let side = Arc::new(SideWakers::default());
            let stream = Arc::new(StreamLock::new(false));
            let device = {
                let (side, stream) = (side.clone(), stream.clone());
                thread::spawn(move || {
                    *stream.lock().unwrap() = true;
                    side.wake_all();
                })
            };
            let (slept, waker) = counter();
            if mark_first {
                side.register_blocked(&waker);
            } else {
                side.register(Waiter::Poll, &waker);
            }
            // The wait's look after arming: it sleeps only if it found nothing.
            let saw = *stream.lock().unwrap();
            if !mark_first {
                side.register_blocked(&waker);
            }
            let (polled, again) = counter();
            let shortcut = !saw && side.still_blocked(&again);
            device.join().unwrap();
            assert!(
                saw || woken(&slept) || woken(&polled),
                "a lost wake-up: the sleep was not woken"
            );
            assert!(
                !shortcut || woken(&polled),
                "a lost wake-up: a call that took the shortcut was not woken"
            );
            // Polled again after the wake-up: the shortcut must not hide the completion.
            let (_, late) = counter();
            assert!(
                saw || !side.still_blocked(&late),
                "a lost wake-up: the mark hid the completion"
            );
        });
    }

    #[test]
    fn loom_a_blocked_mark_never_hides_a_wake_up() {
        blocked_mark_against_a_wake_up(true);
    }

    /// The check finds the bug it is for: a sleep that marks the side only after its look
    /// (after the wake-up may have come and gone) leaves a mark no wake-up clears.
    #[test]
    #[should_panic(expected = "a lost wake-up")]
    fn loom_marking_after_the_look_is_caught() {
        blocked_mark_against_a_wake_up(false);
    }
}
