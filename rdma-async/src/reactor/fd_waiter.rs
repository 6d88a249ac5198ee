//! One registration of a channel descriptor with the reactor, shared by every task that waits
//! on it.
//!
//! Tokio's `AsyncFd::poll_read_ready` keeps only the most recent waker, so two tasks that wait
//! on one descriptor (a stream's reader and writer) would steal each other's wake-ups; a
//! cancelled write future could then leave the reader asleep for ever. Registering a duplicate
//! of the descriptor per task avoids that at the cost of a descriptor per task. Instead, the
//! reactor holds one waker of the channel's own ([`Fanout`]), and each waiting task has a slot
//! there ([`FdWaiter`]): readiness wakes every task in a slot, and each takes what it was
//! waiting for from the channel or goes back to waiting.
//!
//! Most of the time one task waits (a stream's reader, or its writer, rarely both). A task
//! that registers while no other slot holds a waker gives the reactor its own waker: its
//! wake-up then skips the fan-out (its lock, its list and a waker's call: about 105
//! instructions a sleep, by callgrind). A task that comes while another waits puts the
//! fan-out's waker back, and every slot is woken by it, the lone waiter's included: its slot
//! keeps its waker either way.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker, ready};

use tokio::io::Interest;
use tokio::io::unix::{AsyncFd, AsyncFdReadyGuard};

use crate::sync::{Lock, LockGuard};
use crate::verbs::{self, ChannelFd};

/// The one registration of a channel's descriptor.
#[derive(Debug)]
pub(crate) struct SharedFd {
    fd: AsyncFd<ChannelFd>,
    fanout: Arc<Fanout>,
    /// `fanout` as a waker, made once.
    fanout_waker: Waker,
}

/// The waker the reactor holds for a [`SharedFd`]: it wakes every task waiting in a slot. A
/// queue on a shared completion channel has one too ([`super::routed_channel`]).
#[derive(Debug, Default)]
pub(super) struct Fanout {
    slots: Lock<Slots>,
    /// How many times the reactor woke it.
    wakes: AtomicU64,
    /// How many slots hold a waker ([`Slots::holding`]), for a lone waiter's look after it
    /// gave the reactor its own waker (see [`FdWaiter::poll_registered`]).
    holding: AtomicUsize,
}

/// The waiting tasks of one descriptor, by slot.
#[derive(Debug, Default)]
struct Slots {
    /// `None` for a slot that is free, `Some(None)` for one in use with no task waiting.
    wakers: Vec<Option<Option<Waker>>>,
    /// How many slots hold a waker.
    holding: usize,
}

/// What holds a [`Fanout`]: a descriptor's registration, or a routed queue's signal.
pub(super) trait HasFanout {
    /// The fan-out whose slots the waiting tasks take.
    fn fanout(&self) -> &Fanout;
}

/// One task's slot in the [`Fanout`] of `O`, freed when dropped.
#[derive(Debug)]
pub(super) struct FanoutSlot<O: HasFanout> {
    pub(super) owner: Arc<O>,
    pub(super) index: usize,
}

impl<O: HasFanout> FanoutSlot<O> {
    /// A slot for one more waiting task on `owner`'s fan-out.
    pub(super) fn take(owner: &Arc<O>) -> Self {
        FanoutSlot {
            index: owner.fanout().take_slot(),
            owner: owner.clone(),
        }
    }

    /// Makes `waker` the task that this slot's next wake-up wakes; returns whether this slot
    /// is the only one that holds a waker.
    pub(super) fn set(&self, waker: &Waker) -> bool {
        self.owner.fanout().set(self.index, waker)
    }
}

impl<O: HasFanout> Drop for FanoutSlot<O> {
    fn drop(&mut self) {
        self.owner.fanout().free_slot(self.index);
    }
}

impl HasFanout for SharedFd {
    fn fanout(&self) -> &Fanout {
        &self.fanout
    }
}

/// One task's place among the waiters of a [`SharedFd`].
#[derive(Debug)]
pub(crate) struct FdWaiter {
    slot: FanoutSlot<SharedFd>,
    /// [`Fanout::wakes`] when this waiter last looked at the descriptor's readiness.
    wakes_seen: AtomicU64,
    /// The reactor was given this waiter's own waker (it waited alone) since its last look:
    /// a wake-up then comes without the fan-out's count.
    registered_alone: AtomicBool,
}

impl SharedFd {
    /// Registers `channel`'s descriptor (owned by it, non-blocking) with the current runtime's
    /// reactor.
    pub(crate) fn register(channel: ChannelFd) -> io::Result<Arc<Self>> {
        let fanout = Arc::new(Fanout::default());
        Ok(Arc::new(SharedFd {
            fd: verbs::register_readable(channel)?,
            fanout_waker: Waker::from(fanout.clone()),
            fanout,
        }))
    }

    /// A slot for one more waiting task.
    pub(crate) fn waiter(self: &Arc<Self>) -> FdWaiter {
        FdWaiter {
            wakes_seen: AtomicU64::new(self.fanout.wakes.load(Ordering::Relaxed)),
            registered_alone: AtomicBool::new(false),
            slot: FanoutSlot::take(self),
        }
    }

    /// Waits until the descriptor is readable, with any number of other tasks (Tokio's
    /// `AsyncFd::readable`, which keeps a waker per waiting future).
    pub(crate) async fn readable(&self) -> io::Result<AsyncFdReadyGuard<'_, ChannelFd>> {
        self.fd.readable().await
    }
}

impl Fanout {
    fn lock(&self) -> LockGuard<'_, Slots> {
        self.slots.lock()
    }

    fn take_slot(&self) -> usize {
        let mut slots = self.lock();
        match slots.wakers.iter().position(Option::is_none) {
            Some(free) => {
                slots.wakers[free] = Some(None);
                free
            }
            None => {
                slots.wakers.push(Some(None));
                slots.wakers.len() - 1
            }
        }
    }

    fn free_slot(&self, slot: usize) {
        let waker = {
            let mut slots = self.lock();
            let waker = slots.wakers[slot].take().flatten();
            if waker.is_some() {
                slots.holding -= 1;
                self.holding.store(slots.holding, Ordering::SeqCst);
            }
            waker
        };
        drop(waker);
    }

    /// Makes `waker` the task that `slot`'s next wake-up wakes; returns whether `slot` is the
    /// only one that holds a waker.
    fn set(&self, slot: usize, waker: &Waker) -> bool {
        let mut slots = self.lock();
        let slots = &mut *slots;
        match slots.wakers[slot].get_or_insert(None) {
            Some(held) if held.will_wake(waker) => {}
            Some(held) => *held = waker.clone(),
            entry @ None => {
                *entry = Some(waker.clone());
                slots.holding += 1;
                // Before the caller registers with the reactor: see `FdWaiter::poll_registered`.
                self.holding.store(slots.holding, Ordering::SeqCst);
            }
        }
        slots.holding == 1
    }
}

impl Wake for Fanout {
    // The reactor wakes by value (Tokio takes the registration's waker out to wake it).
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        // Counted before the tasks are woken: a woken task's next look sees it.
        self.wakes.fetch_add(1, Ordering::Relaxed);
        self.wake_all();
    }
}

impl Fanout {
    /// Wakes every task waiting in a slot (each once: a woken task sets its waker again).
    pub(super) fn wake_all(&self) {
        // Taken under the lock, woken outside it: a waker dropped or woken may release a task
        // that frees its own slot here. A stream has two or three waiters. Most wake-ups find
        // one of them waiting, which is woken with no list to go through; a few more go into
        // an array, and only beyond that into a vector.
        let mut first = None;
        let mut few: [Option<Waker>; 3] = Default::default();
        let mut more = Vec::new();
        let mut waiting = 0;
        {
            let mut slots = self.lock();
            if slots.holding > 0 {
                slots.holding = 0;
                self.holding.store(0, Ordering::SeqCst);
            }
            for waker in slots.wakers.iter_mut().filter_map(|s| s.as_mut()?.take()) {
                match waiting {
                    0 => first = Some(waker),
                    n => match few.get_mut(n - 1) {
                        Some(place) => *place = Some(waker),
                        None => more.push(waker),
                    },
                }
                waiting += 1;
            }
        }
        if let Some(waker) = first {
            waker.wake();
        }
        if waiting > 1 {
            few.into_iter().flatten().chain(more).for_each(Waker::wake);
        }
    }
}

impl FdWaiter {
    /// Waits until the descriptor is readable. Callers drain the channel through its owner
    /// and clear the readiness with the guard once the channel reports `WouldBlock`; readiness
    /// is the descriptor's, shared by every waiter, so one that finds the channel empty after
    /// another drained it clears it and waits again.
    ///
    /// The registration belongs to the runtime it was made on: once that runtime is shut
    /// down, this fails (`ConnectionAborted`, saying so) on any runtime.
    pub(crate) fn poll_readable(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<AsyncFdReadyGuard<'_, ChannelFd>>> {
        let shared = &*self.slot.owner;
        let mut fanout = Context::from_waker(&shared.fanout_waker);
        // Woken since this waiter last looked: the descriptor is most likely still readable
        // (a task woken by it often finds what it waited for before it reads the channel), so
        // it looks before taking its slot, which only a wait needs. Readiness that comes after
        // this look is seen by the look after the slot is taken.
        if self.woken_since_last_look()
            && let Poll::Ready(ready) = shared.fd.poll_read_ready(&mut fanout)
        {
            return Poll::Ready(ready.map_err(|e| runtime_gone(&e)));
        }
        self.poll_registered(cx)
    }

    /// Whether this waiter may have been woken by the descriptor since its last look: the
    /// fan-out woke since, or the reactor held the waiter's own waker.
    fn woken_since_last_look(&self) -> bool {
        let wakes = self.slot.owner.fanout.wakes.load(Ordering::Relaxed);
        let fanned_out = self.wakes_seen.swap(wakes, Ordering::Relaxed) != wakes;
        // Both read, so that each look resets both.
        self.registered_alone.swap(false, Ordering::Relaxed) | fanned_out
    }

    /// Takes this waiter's slot, then looks at the reactor's registration: readiness that
    /// comes in between wakes the slot's task (through the fan-out, or, for a waiter alone,
    /// directly).
    fn poll_registered(
        &self,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<AsyncFdReadyGuard<'_, ChannelFd>>> {
        let shared = &*self.slot.owner;
        let mut fanout = Context::from_waker(&shared.fanout_waker);
        // The reactor keeps one waker: the task's own while no other slot holds one, else
        // the fan-out's. A task that takes a slot after this one found itself alone
        // registers the fan-out's waker after it counted its slot (`Fanout::set`). If its
        // registration came first, this one replaced it, and then its count is seen below
        // (the reactor's registrations are ordered by its lock): the fan-out's waker goes
        // back, and if the descriptor turned readable meanwhile, the reactor may have woken
        // this task alone, so the fan-out wakes every slot itself. Either way each waiting
        // slot is woken by the next readiness.
        let ready = if self.slot.set(cx.waker()) {
            let alone = shared.fd.poll_read_ready(cx);
            if shared.fanout.holding.load(Ordering::SeqCst) > 1 {
                let fanned_out = shared.fd.poll_read_ready(&mut fanout);
                if fanned_out.is_ready() {
                    shared.fanout_waker.wake_by_ref();
                }
                fanned_out
            } else {
                if alone.is_pending() {
                    self.registered_alone.store(true, Ordering::Relaxed);
                }
                alone
            }
        } else {
            shared.fd.poll_read_ready(&mut fanout)
        };
        // The reactor's only error: its driver is gone (Tokio's own message does not say
        // which runtime, or what to do).
        ready.map_err(|e| runtime_gone(&e))
    }

    /// Takes what the descriptor holds with `take` if the reactor has seen it readable, with
    /// no task registered and no slot touched: whether `take` took something. For a look
    /// outside a wait (a wake-up's re-arm); a wait registers through [`Self::poll_take`].
    ///
    /// # Errors
    ///
    /// Those of `take`, other than `WouldBlock`.
    pub(crate) fn try_take(&self, mut take: impl FnMut() -> io::Result<()>) -> io::Result<bool> {
        // A take that succeeds reports `WouldBlock` to Tokio, which then clears the readiness
        // of the very tick this look read (an edge after it stays).
        let mut took = false;
        let read = self.slot.owner.fd.try_io(Interest::READABLE, |_| {
            take()?;
            took = true;
            Err::<(), _>(io::ErrorKind::WouldBlock.into())
        });
        match read {
            _ if took => Ok(true),
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            // Not readable, or read empty (which cleared the readiness). (The closure never
            // returns `Ok`.)
            _ => Ok(false),
        }
    }

    /// Takes what the descriptor holds with `take` (a non-blocking read of it, which fails
    /// with `WouldBlock` when nothing is there), or waits until it is readable: `Ready` with
    /// whether `take` took something (`Ok(false)`: it found nothing, another waiter took it),
    /// or `Pending` with this waiter's task registered.
    ///
    /// For a descriptor that holds at most one thing at a time, and nothing more until its
    /// owner acts on what it took (a completion channel with one queue, armed again only after
    /// its event is read): once `take` succeeds the readiness is cleared, and the next thing
    /// written is a new edge for the reactor. Readiness is the descriptor's, shared by every
    /// waiter, so one that finds the channel empty after another drained it clears it and
    /// waits again.
    ///
    /// The registration belongs to the runtime it was made on: once that runtime is shut
    /// down, this fails (`ConnectionAborted`, saying so) on any runtime.
    pub(crate) fn poll_take(
        &self,
        cx: &mut Context<'_>,
        mut take: impl FnMut() -> io::Result<()>,
    ) -> Poll<io::Result<io::Result<bool>>> {
        // Woken since this waiter last looked: the descriptor is most likely still readable
        // (a task woken by it often finds what it waited for before it reads the channel), so
        // it reads it at once, with no readiness to wait for and no slot to take, which only a
        // wait needs. If nothing is there, it waits as any look that found nothing: whatever
        // comes after this look is seen by the look after the slot is taken.
        if self.woken_since_last_look() {
            match self.try_take(&mut take) {
                Ok(true) => return Poll::Ready(Ok(Ok(true))),
                Err(e) => return Poll::Ready(Ok(Err(e))),
                // Not readable, or read empty (which cleared the readiness): wait.
                Ok(false) => {}
            }
        }
        let mut guard = ready!(self.poll_registered(cx))?;
        Poll::Ready(Ok(match guard.try_io(|_| take()) {
            Ok(Ok(())) => {
                guard.clear_ready();
                Ok(true)
            }
            Ok(Err(e)) => Err(e),
            // try_io cleared the readiness: another waiter took what was there.
            Err(_would_block) => Ok(false),
        }))
    }
}

/// The error of a wait whose reactor registration's runtime was shut down (`cause`: what
/// Tokio said, which names neither the runtime nor what to do).
pub(super) fn runtime_gone(cause: &dyn std::fmt::Display) -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        format!(
            "the Tokio runtime this object was created on was shut down, and with it the \
             reactor that watches its completions; create connections and sockets on a runtime \
             that outlives them ({cause})"
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::io::{Read, Write};
    use std::os::fd::OwnedFd;
    use std::os::unix::net::UnixStream;

    use super::*;
    use crate::wake_count::counting_waker as counter;

    #[test]
    fn a_wake_up_wakes_every_waiting_slot_once_and_no_freed_one() {
        let fanout = Arc::new(Fanout::default());
        let wake = Waker::from(fanout.clone());
        let slots: Vec<usize> = (0..6).map(|_| fanout.take_slot()).collect();
        let counts: Vec<_> = slots
            .iter()
            .map(|&slot| {
                let (count, waker) = counter();
                fanout.set(slot, &waker);
                count
            })
            .collect();
        fanout.free_slot(slots[1]);
        wake.wake_by_ref();
        let woken: Vec<usize> = counts.iter().map(|c| c.get()).collect();
        assert_eq!(woken, [1, 0, 1, 1, 1, 1], "six waiters, the second gone");
        wake.wake_by_ref();
        let woken: Vec<usize> = counts.iter().map(|c| c.get()).collect();
        assert_eq!(
            woken,
            [1, 0, 1, 1, 1, 1],
            "a woken task waits again to be woken again"
        );
        assert_eq!(fanout.take_slot(), slots[1], "a freed slot is used again");
    }

    /// A socket registered as a channel is, on a runtime of its own, with a peer to write into
    /// it and a handle on it to take bytes from it, one at a time, counting the takes.
    struct Socket {
        rt: tokio::runtime::Runtime,
        shared: Arc<SharedFd>,
        reader: UnixStream,
        peer: UnixStream,
        takes: Cell<usize>,
    }

    impl Socket {
        fn new() -> Self {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_io()
                .build()
                .unwrap();
            let (watched, peer) = UnixStream::pair().unwrap();
            watched.set_nonblocking(true).unwrap();
            let reader = watched.try_clone().unwrap();
            let fd = ChannelFd::new(Arc::new(OwnedFd::from(watched)));
            let shared = {
                let _entered = rt.enter();
                SharedFd::register(fd).unwrap()
            };
            Socket {
                rt,
                shared,
                reader,
                peer,
                takes: Cell::new(0),
            }
        }

        /// `waiter`'s look, taking one byte.
        fn poll_take(&self, waiter: &FdWaiter, task: &Waker) -> Poll<io::Result<io::Result<bool>>> {
            let take = || {
                self.takes.set(self.takes.get() + 1);
                (&self.reader).read_exact(&mut [0u8])
            };
            waiter.poll_take(&mut Context::from_waker(task), take)
        }

        /// Writes a byte and waits until the reactor has reported it (and so woken the
        /// fan-out's waiting slots).
        fn write(&mut self, byte: u8) {
            self.peer.write_all(&[byte]).unwrap();
            self.rt
                .block_on(async { drop(self.shared.readable().await.unwrap()) });
        }
    }

    #[test]
    fn a_woken_waiter_takes_at_once_and_clears_the_readiness_for_the_next_wait() {
        let mut socket = Socket::new();
        let waiter = socket.shared.waiter();
        let (woken, task) = counter();
        assert!(
            socket.poll_take(&waiter, &task).is_pending(),
            "nothing written yet"
        );
        socket.write(7);
        assert_eq!(woken.get(), 1, "the waiting task is woken");
        assert_eq!(
            socket.shared.fanout.wakes.load(Ordering::Relaxed),
            0,
            "a task waiting alone is woken by the reactor, not through the fan-out"
        );
        let took = socket.poll_take(&waiter, &task);
        assert!(matches!(took, Poll::Ready(Ok(Ok(true)))), "{took:?}");
        assert_eq!(socket.takes.get(), 1);
        // The readiness that reported the byte is gone with it: the next wait registers and
        // sleeps without another read of the descriptor.
        assert!(socket.poll_take(&waiter, &task).is_pending());
        assert_eq!(socket.takes.get(), 1, "no read of an empty descriptor");
        socket.write(8);
        assert_eq!(
            woken.get(),
            2,
            "a new byte is a new edge: the slot is woken again"
        );
    }

    /// A take outside a wait reads only what the reactor has reported, and leaves every
    /// waiting slot as it was: another waiter asleep in its slot is still woken by the next
    /// byte.
    #[test]
    fn a_take_outside_a_wait_reads_only_what_was_reported_and_registers_nothing() {
        let mut socket = Socket::new();
        let (taker, sleeper) = (socket.shared.waiter(), socket.shared.waiter());
        let take = |socket: &Socket| {
            taker.try_take(|| {
                socket.takes.set(socket.takes.get() + 1);
                (&socket.reader).read_exact(&mut [0u8])
            })
        };
        assert!(!take(&socket).unwrap(), "nothing written yet");
        assert_eq!(socket.takes.get(), 0, "a read with nothing reported");
        let (woken, task) = counter();
        assert!(socket.poll_take(&sleeper, &task).is_pending());
        socket.write(7);
        assert_eq!(woken.get(), 1);
        assert!(take(&socket).unwrap(), "the reported byte");
        assert_eq!(socket.takes.get(), 1);
        assert!(!take(&socket).unwrap(), "taken already");
        assert_eq!(socket.takes.get(), 1, "its readiness went with it");
        assert!(socket.poll_take(&sleeper, &task).is_pending());
        socket.write(8);
        assert_eq!(
            woken.get(),
            2,
            "the sleeping slot is woken by the next byte"
        );
    }

    #[test]
    fn an_edge_between_the_take_and_the_clear_is_not_wiped() {
        let mut socket = Socket::new();
        let waiter = socket.shared.waiter();
        let (_woken, task) = counter();
        assert!(socket.poll_take(&waiter, &task).is_pending());
        socket.write(7);
        // The woken waiter's take reads byte 7; a new byte comes, and the reactor reports it
        // (a new tick), before poll_take returns. A current-thread runtime polls its driver at
        // every yield, so the yields let it see the new byte.
        let take = || {
            (&socket.reader).read_exact(&mut [0u8])?;
            (&socket.peer).write_all(&[8]).unwrap();
            socket.rt.block_on(async {
                for _ in 0..4 {
                    tokio::task::yield_now().await;
                }
            });
            Ok(())
        };
        let took = waiter.poll_take(&mut Context::from_waker(&task), take);
        assert!(matches!(took, Poll::Ready(Ok(Ok(true)))), "{took:?}");
        let next = socket.poll_take(&waiter, &task);
        assert!(
            matches!(next, Poll::Ready(Ok(Ok(true)))),
            "the new edge was wiped: {next:?}"
        );
    }

    #[test]
    fn a_woken_waiter_that_finds_nothing_left_waits_in_the_same_call() {
        let mut socket = Socket::new();
        let (waiter, other) = (socket.shared.waiter(), socket.shared.waiter());
        let (woken, task) = counter();
        let (_, other_task) = counter();
        assert!(socket.poll_take(&waiter, &task).is_pending());
        socket.write(7);
        // Another waiter, woken too, takes the byte first.
        let took = socket.poll_take(&other, &other_task);
        assert!(matches!(took, Poll::Ready(Ok(Ok(true)))), "{took:?}");
        // This one reads nothing and goes back to waiting, registered for the next byte.
        assert!(socket.poll_take(&waiter, &task).is_pending());
        assert_eq!(
            socket.takes.get(),
            1,
            "the readiness was cleared by the take"
        );
        socket.write(8);
        assert_eq!(
            woken.get(),
            2,
            "registered again, so woken by the next byte"
        );
    }

    #[test]
    fn a_second_waiter_puts_the_fan_out_back_and_both_are_woken() {
        let mut socket = Socket::new();
        let (first, second) = (socket.shared.waiter(), socket.shared.waiter());
        let ((first_woken, first_task), (second_woken, second_task)) = (counter(), counter());
        assert!(socket.poll_take(&first, &first_task).is_pending());
        assert!(socket.poll_take(&second, &second_task).is_pending());
        socket.write(7);
        assert_eq!(
            (first_woken.get(), second_woken.get()),
            (1, 1),
            "the one that waited alone first is woken too"
        );
        assert_eq!(socket.shared.fanout.wakes.load(Ordering::Relaxed), 1);
        let took = socket.poll_take(&second, &second_task);
        assert!(matches!(took, Poll::Ready(Ok(Ok(true)))), "{took:?}");
        // The fan-out took both wakers: the first to wait again is alone again.
        assert!(socket.poll_take(&first, &first_task).is_pending());
        socket.write(8);
        assert_eq!((first_woken.get(), second_woken.get()), (2, 1));
        assert_eq!(
            socket.shared.fanout.wakes.load(Ordering::Relaxed),
            1,
            "the lone waiter's wake-up skips the fan-out"
        );
    }

    /// Two tasks on two worker threads wait on one descriptor, each in its own slot, both
    /// registered before each byte comes, so the registration goes back and forth between a
    /// lone task's waker and the fan-out's: every round, both must be woken.
    #[test]
    fn every_task_waiting_on_a_descriptor_is_woken_by_its_readiness() {
        const ROUNDS: usize = 500;
        /// What a waiting task reports.
        enum Report {
            /// It looked, found the descriptor not readable, and is registered.
            Waiting,
            /// It was woken and found it readable.
            Saw,
        }
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let (watched, mut peer) = UnixStream::pair().unwrap();
        watched.set_nonblocking(true).unwrap();
        let reader = watched.try_clone().unwrap();
        let shared = {
            let _entered = rt.enter();
            SharedFd::register(ChannelFd::new(Arc::new(OwnedFd::from(watched)))).unwrap()
        };
        let (round, rounds) = tokio::sync::watch::channel(0);
        let (report, mut reports) = tokio::sync::mpsc::unbounded_channel();
        let tasks: Vec<_> = (0..2)
            .map(|_| {
                let (waiter, mut rounds, report) =
                    (shared.waiter(), rounds.clone(), report.clone());
                rt.spawn(async move {
                    while rounds.changed().await.is_ok() {
                        let mut reported = false;
                        std::future::poll_fn(|cx| match waiter.poll_readable(cx) {
                            Poll::Pending => {
                                if !std::mem::replace(&mut reported, true) {
                                    report.send(Report::Waiting).unwrap();
                                }
                                Poll::Pending
                            }
                            Poll::Ready(ready) => {
                                // Readable: the readiness stays for the round's drain.
                                ready.unwrap().retain_ready();
                                Poll::Ready(())
                            }
                        })
                        .await;
                        report.send(Report::Saw).unwrap();
                    }
                })
            })
            .collect();
        let drainer = shared.waiter();
        rt.block_on(async {
            let mut done = 0;
            let all = async {
                for n in 1..=ROUNDS {
                    round.send(n).unwrap();
                    for expected in [Report::Waiting, Report::Saw] {
                        for _ in 0..2 {
                            let got = reports.recv().await.unwrap();
                            assert_eq!(
                                std::mem::discriminant(&got),
                                std::mem::discriminant(&expected)
                            );
                        }
                        if matches!(expected, Report::Waiting) {
                            peer.write_all(&[1]).unwrap();
                        }
                    }
                    // The byte goes, and with it the readiness, before the next round.
                    assert!(
                        drainer
                            .try_take(|| (&reader).read_exact(&mut [0u8]))
                            .unwrap()
                    );
                    done = n;
                }
            };
            // Bounds a hang (a task never woken) with a failure; it measures no speed.
            if tokio::time::timeout(std::time::Duration::from_secs(120), all)
                .await
                .is_err()
            {
                panic!("round {}: a waiting task was not woken", done + 1);
            }
        });
        tasks.iter().for_each(tokio::task::JoinHandle::abort);
    }

    #[test]
    fn a_slot_alone_is_one_whose_fellows_hold_no_waker() {
        let fanout = Fanout::default();
        let (a, b) = (fanout.take_slot(), fanout.take_slot());
        let ((_, a_task), (_, b_task)) = (counter(), counter());
        assert!(fanout.set(a, &a_task), "b holds no waker");
        assert!(!fanout.set(b, &b_task), "a holds one");
        assert!(!fanout.set(a, &a_task), "b holds one now");
        fanout.free_slot(b);
        assert!(fanout.set(a, &a_task), "b's slot went with its waker");
        assert_eq!(fanout.holding.load(Ordering::SeqCst), 1);
        fanout.wake_all();
        assert_eq!(fanout.holding.load(Ordering::SeqCst), 0, "all taken");
    }

    #[test]
    fn a_wake_up_by_value_is_counted_as_one_by_reference_is() {
        // Tokio's reactor takes the registration's waker out and wakes it by value: a waiter
        // knows it was woken since its last look only if that wake-up is counted too.
        let fanout = Arc::new(Fanout::default());
        let slot = fanout.take_slot();
        let (count, waker) = counter();
        fanout.set(slot, &waker);
        Waker::from(fanout.clone()).wake();
        assert_eq!(fanout.wakes.load(Ordering::Relaxed), 1, "by value");
        fanout.set(slot, &waker);
        Waker::from(fanout.clone()).wake_by_ref();
        assert_eq!(fanout.wakes.load(Ordering::Relaxed), 2, "by reference");
        assert_eq!(count.get(), 2, "the slot's task is woken either way");
    }
}
