//! Completion queues as futures: the completion channel fd on Tokio's reactor.
//!
//! The loop follows `ibv_get_cq_event(3)`: poll; if empty, busy-poll for a bounded window (and,
//! for a waiter that asks, yield to the runtime's other tasks a few times: [`YieldPolicy`]); then
//! arm, poll again (a completion that landed between the empty poll and the arm raises no event),
//! and only then wait for the fd. On wake-up the channel's event is read, counted, and acked in
//! batches. Every call spends one unit of Tokio's cooperative budget, so a connection whose CQ is
//! never empty still yields to other tasks.
//!
//! Arming is a system call on some providers (an ioctl on rxe), so the queue is armed only when
//! no arm is outstanding: an arm lasts until its event is read from the channel, or until
//! arming or reading fails ([`ArmState`], which has the exhaustive interleaving check). A wait
//! that sleeps under another waiter's arm is woken if that arm fails, and arms again. A stream
//! whose reader reads until it finds nothing reads the event that woke it as soon as it is
//! woken, before it looks ([`AsyncCq::take_wake_event`]), and arms again after that look,
//! before it hands up what it found ([`AsyncCq::arm_ahead`]): the read that finds nothing
//! after that sleeps under the arm, with no system call.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::task::{Context, Poll, Waker, ready};
use std::time::Duration;

use tokio::task::coop;

use super::arm_state::{ArmState, Claim};
use super::cq_waiter::{ChannelRead, CqWaiter};
use super::routed_channel::CqSignal;
use super::spin_policy::SpinPolicy;
use super::yield_policy::{WaitYields, YieldPolicy, note_look};
use crate::reactor::SharedFd;
use crate::sync::AtomicU32;
use crate::verbs::{
    ChannelFd, CmId, CompletionBatch, CompletionChannel, CompletionQueue, PolledCompletion,
};

/// What a caller of [`AsyncCq::poll_completions`] knows that saves work.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct WaitHints<'a> {
    /// How many threads wait for a lock the caller holds while it waits (a stream's state).
    /// The busy-poll window ends as soon as there is one: spinning would keep that thread, and
    /// the task behind it, blocked for the rest of the window, when the caller can as well
    /// sleep until the completion comes.
    pub(crate) lock_waiters: Option<&'a AtomicU32>,
    /// The caller looked at the queue a moment ago and took what it held: another look before
    /// spinning or arming would most often find nothing. Only a saving: the look after arming
    /// (or, with `exclusive`, the arm made earlier) sees whatever came meanwhile.
    pub(crate) just_polled: bool,
    /// The caller's last look (or the last by any waiter of this queue) found it empty, and
    /// every waiter looks and waits under one lock the caller holds (a stream's two sides,
    /// under the stream's state). A wait that finds an arm made earlier still outstanding then
    /// need not look again before waiting: whatever completed since that look raises the arm's
    /// event, or its event is already in the channel. (Without the lock, another waiter may
    /// arm after this one's look, after completions that raised no event, and take only some
    /// of them: `arm_state`'s model check finds that.)
    pub(crate) exclusive: bool,
    /// The caller's yields of its current wait: with them, a wait that finds the queue empty
    /// after its busy-poll window yields to the runtime's other tasks a few times before it
    /// arms and sleeps ([`YieldPolicy`]). For waiters that look again when polled next (a
    /// stream's sides), and that say when a wait ends ([`AsyncCq::end_wait`]).
    pub(crate) yields: Option<&'a WaitYields>,
    /// The waiting task's own waker, woken when the wait returns `Pending` without sleeping
    /// (a yield, or Tokio's budget spent): that is only this task's look again, where the
    /// context's waker may wake more (a stream's side waker wakes every waiter of the side).
    pub(crate) task: Option<&'a Waker>,
    /// Run once, when the wait is about to sleep (before it arms): registers whoever the
    /// context's waker must wake. A wait that ends without sleeping never runs it, so a task
    /// that finds its completions, or yields, costs no registration.
    pub(crate) before_sleep: Option<BeforeSleep<'a>>,
}

/// See [`WaitHints::before_sleep`].
#[derive(Clone, Copy)]
pub(crate) struct BeforeSleep<'a>(pub(crate) &'a dyn Fn());

impl std::fmt::Debug for BeforeSleep<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("BeforeSleep")
    }
}

/// A completion queue whose completions wake tasks.
///
/// Each task that may wait gets its own [`CqWaiter`]: a slot on the channel's one registration
/// (see [`crate::reactor`]), or on the queue's [`CqSignal`] when the queue reports to a shared
/// channel; the queue itself
/// may be polled by any of them, but owners serialise polling when completions must be handled
/// in order.
#[derive(Debug)]
pub(crate) struct AsyncCq {
    cq: Arc<CompletionQueue>,
    /// The channel's registration with the reactor, made when the first waiter comes (on the
    /// runtime the waiting happens on), for a queue with a channel of its own.
    registered: OnceLock<Arc<SharedFd>>,
    /// Where a shared channel's dispatcher routes the queue's events, for a queue on one.
    routed: Option<Arc<CqSignal>>,
    /// Held while the registration is made, so that it is made once.
    registering: Mutex<()>,
    /// Whether the busy-poll window has been paying off lately, and how long it is.
    spin: SpinPolicy,
    /// Whether yielding to other tasks before sleeping has been paying off lately.
    yields: YieldPolicy,
    /// Whether an arm is outstanding.
    arm: ArmState,
    /// Busy-poll windows ended early because another thread waited for the caller's lock.
    spins_yielded: AtomicU64,
    /// Yields to other tasks made instead of sleeping.
    waits_yielded: AtomicU64,
    /// Arms made (`ibv_req_notify_cq` calls).
    arms: AtomicU64,
    /// Test hook: the next wait fails as if polling the queue had failed.
    #[cfg(rdma_async_hooks)]
    fail_next_poll: std::sync::atomic::AtomicBool,
}

impl AsyncCq {
    /// Wraps `cq`; `spin` says how long an empty queue is polled before the task sleeps.
    fn new(cq: Arc<CompletionQueue>, routed: Option<Arc<CqSignal>>, spin: SpinPolicy) -> Self {
        AsyncCq {
            cq,
            registered: OnceLock::new(),
            routed,
            registering: Mutex::new(()),
            spin,
            yields: YieldPolicy::default(),
            arm: ArmState::default(),
            spins_yielded: AtomicU64::new(0),
            waits_yielded: AtomicU64::new(0),
            arms: AtomicU64::new(0),
            #[cfg(rdma_async_hooks)]
            fail_next_poll: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Creates a completion queue of `entries` on `id`'s device, with a completion channel of
    /// its own (so its events wake only its waiters), and a busy-poll window that starts at
    /// `busy_poll` and adapts ([`SpinPolicy::new`]).
    pub(crate) fn create(id: &Arc<CmId>, entries: u32, busy_poll: Duration) -> io::Result<Self> {
        Self::create_with(id, entries, SpinPolicy::new(busy_poll))
    }

    /// As [`Self::create`], with a busy-poll window that stays `busy_poll` (only the skipping
    /// adapts: [`SpinPolicy::fixed`]). For a queue polled by a task that wakes the waiting
    /// ones, where a longer spin holds a CPU without waking them sooner.
    pub(crate) fn create_fixed_window(
        id: &Arc<CmId>,
        entries: u32,
        busy_poll: Duration,
    ) -> io::Result<Self> {
        Self::create_with(id, entries, SpinPolicy::fixed(busy_poll))
    }

    /// As [`Self::create`], on the completion channel that every queue created this way on
    /// the device context and the current Tokio runtime shares ([`super::routed_channel`]):
    /// one descriptor for all of them, at the cost of a dispatch per event.
    ///
    /// # Errors
    ///
    /// `Other` outside a Tokio runtime; those of creating the channel and the queue.
    pub(crate) fn create_shared(
        id: &Arc<CmId>,
        entries: u32,
        busy_poll: Duration,
    ) -> io::Result<Self> {
        let (cq, signal) = CqSignal::create_queue(id, entries)?;
        Ok(Self::new(cq, Some(signal), SpinPolicy::new(busy_poll)))
    }

    fn create_with(id: &Arc<CmId>, entries: u32, spin: SpinPolicy) -> io::Result<Self> {
        let channel = Arc::new(CompletionChannel::new(id.clone())?);
        let cq = Arc::new(CompletionQueue::new(channel, entries)?);
        Ok(Self::new(cq, None, spin))
    }

    /// The verbs queue, for creating queue pairs on it.
    pub(crate) fn queue(&self) -> &Arc<CompletionQueue> {
        &self.cq
    }

    /// A registration for one more waiting task.
    pub(crate) fn waiter(&self) -> io::Result<CqWaiter> {
        if let Some(signal) = &self.routed {
            return Ok(CqWaiter::Routed(signal.waiter()));
        }
        if let Some(shared) = self.registered.get() {
            return Ok(CqWaiter::Own(shared.waiter()));
        }
        let _registering = self
            .registering
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(shared) = self.registered.get() {
            return Ok(CqWaiter::Own(shared.waiter()));
        }
        let shared = SharedFd::register(ChannelFd::new(self.cq.channel().clone()))?;
        Ok(CqWaiter::Own(
            self.registered.get_or_init(|| shared).waiter(),
        ))
    }

    /// Test hook: the next wait for completions fails as if `ibv_poll_cq` had failed.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn fail_next_poll(&self) {
        self.fail_next_poll
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Polls for up to `N` completions into `batch` without waiting, and returns them.
    pub(crate) fn try_poll_batch<'b, const N: usize>(
        &self,
        batch: &'b mut CompletionBatch<N>,
    ) -> io::Result<&'b [PolledCompletion]> {
        self.note_look();
        self.cq.poll_batch(batch)
    }

    /// Notes on the thread that this queue's owner runs ([`note_look`]).
    #[inline]
    fn note_look(&self) {
        note_look(std::ptr::from_ref(self).addr());
    }

    /// Busy-poll windows ended early because a thread waited for the caller's lock.
    pub(crate) fn spins_yielded(&self) -> u64 {
        self.spins_yielded.load(Ordering::Relaxed)
    }

    /// Yields to other tasks that waits made instead of sleeping ([`WaitHints::yields`]).
    pub(crate) fn waits_yielded(&self) -> u64 {
        self.waits_yielded.load(Ordering::Relaxed)
    }

    /// Arms made: `ibv_req_notify_cq` calls, each a system call on rxe.
    pub(crate) fn arms(&self) -> u64 {
        self.arms.load(Ordering::Relaxed)
    }

    /// Arms the queue after a claim of the arm that was [`Claim::Mine`]; a failure ends the
    /// claimed arm (and wakes whoever sleeps under it), so the next wait arms again.
    fn arm_claimed(&self) -> io::Result<()> {
        self.arms.fetch_add(1, Ordering::Relaxed);
        self.cq.req_notify().inspect_err(|_| self.arm.arm_failed())
    }

    /// Completions came for the caller's current wait (found by a look of its own, not by
    /// [`Self::poll_completions`], which says so itself): the wait is over.
    pub(crate) fn end_wait(&self, yields: &WaitYields) {
        if self.yields.end_wait(yields) {
            // Found after the window ended empty: a longer window may have caught it.
            self.spin.record_late();
        }
    }

    /// Waits until at least one completion is available and polls up to `N` of them into
    /// `out`; returns how many. `hints` says what the caller knows ([`WaitHints`]).
    ///
    /// Cancel safety: completions are only taken from the queue when this returns `Ready`.
    pub(crate) fn poll_completions<const N: usize>(
        &self,
        waiter: &CqWaiter,
        cx: &mut Context<'_>,
        out: &mut CompletionBatch<N>,
        hints: WaitHints<'_>,
    ) -> Poll<io::Result<usize>> {
        self.note_look();
        // Out of budget, Tokio wakes the context's waker: the task's own, when the caller
        // gave it (a `before_sleep` registration has not run yet).
        let coop = match hints.task {
            Some(task) => ready!(coop::poll_proceed(&mut Context::from_waker(task))),
            None => ready!(coop::poll_proceed(cx)),
        };
        #[cfg(rdma_async_hooks)]
        if self
            .fail_next_poll
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Poll::Ready(Err(io::Error::other(
                "ibv_poll_cq failed (injected by a test hook)",
            )));
        }
        let n = self.poll_busy(out, hints)?;
        if n > 0 {
            return Poll::Ready(Ok(self.found(n, hints, coop)));
        }
        if let Some(yields) = hints.yields
            && self.yields.should_yield(yields)
        {
            // To the back of the run queue: the next poll looks again. Dropping `coop`
            // unused gives its unit back.
            self.waits_yielded.fetch_add(1, Ordering::Relaxed);
            hints.task.unwrap_or(cx.waker()).wake_by_ref();
            return Poll::Pending;
        }
        if let Some(BeforeSleep(register)) = hints.before_sleep {
            register();
        }
        // `poll_busy` looked last, or the caller's look before it was left at that.
        let mut skip_look = hints.exclusive;
        loop {
            let claim = self.arm.claim();
            let armed_now = claim == Claim::Mine;
            if armed_now && let Err(e) = self.arm_claimed() {
                return Poll::Ready(Err(e));
            }
            // A completion between the last look and a new arm raises no event: look again.
            if armed_now || !skip_look {
                let n = self.cq.poll_batch(out)?.len();
                if n > 0 {
                    self.spin.record_late();
                    return Poll::Ready(Ok(self.found(n, hints, coop)));
                }
            }
            skip_look = false;
            let read = match waiter.poll_event(&self.cq, cx) {
                Poll::Ready(read) => read?,
                Poll::Pending => {
                    // Under another waiter's arm, which may yet fail: it wakes this one then.
                    if let Claim::Outstanding(arm) = claim
                        && !self.arm.sleep_under(arm, cx.waker())
                    {
                        // Over already (failed, or its event read): claim again.
                        continue;
                    }
                    return Poll::Pending;
                }
            };
            match read {
                ChannelRead::Event => self.arm.event_read(),
                ChannelRead::Failed(e) => {
                    // The next waiter arms again, or no completion would wake anyone.
                    self.arm.event_read_failed();
                    return Poll::Ready(Err(e));
                }
                ChannelRead::Empty => {}
            }
        }
    }

    /// After a wait slept and was woken, before the woken task's first look at the queue:
    /// takes the outstanding arm's event if it came, ending the arm; whether it did. The
    /// caller then looks, and arms again ([`Self::arm_ahead`]) before it hands up what it
    /// found. Both system calls (the read, and the arm on providers where it is one: an
    /// `ioctl` on rxe) then come before the completions that woke the task are handed up, not
    /// after the task (an HTTP client's connection, say) has acted on them and looks for more:
    /// the wait that finds nothing then sleeps under that arm, with no system call between the
    /// answer and the connection being ready for the next request (with one there, hyper's
    /// client often found its connection not ready yet, and spawned a task per request to
    /// return it to its pool). Nothing happens when the event has not come (a wake-up by
    /// something else: the arm stands).
    ///
    /// For waiters that take turns under one lock, which the caller holds (a stream's sides,
    /// whose driver does this for a reader that reads until it finds nothing).
    ///
    /// # Errors
    ///
    /// Reading the channel failed; the arm is over, and the next wait arms again.
    pub(crate) fn take_wake_event(&self, waiter: &CqWaiter) -> io::Result<bool> {
        if !self.arm.is_armed() {
            return Ok(false);
        }
        match waiter.try_event(&self.cq) {
            ChannelRead::Event => self.arm.event_read(),
            ChannelRead::Empty => return Ok(false),
            ChannelRead::Failed(e) => {
                self.arm.event_read_failed();
                return Err(e);
            }
        }
        Ok(true)
    }

    /// Arms the queue ahead of a wait, unless an arm is outstanding: after a wake-up's look
    /// ([`Self::take_wake_event`]), with the completions it found taken (a device may raise
    /// the event at once for completions not yet polled when it is armed). A completion that
    /// came between that look and the arm raises no event, so the queue is not known empty
    /// under this arm: the caller's next look must be a real one (a wait that follows does
    /// not skip it, as [`WaitHints::exclusive`] lets a wait after an empty look do). A wait
    /// that then finds nothing sleeps under this arm.
    ///
    /// For waiters that take turns under one lock, which the caller holds.
    ///
    /// # Errors
    ///
    /// Arming failed; no arm is outstanding, and the next wait arms again.
    pub(crate) fn arm_ahead(&self) -> io::Result<()> {
        if self.arm.claim() == Claim::Mine {
            self.arm_claimed()?;
        }
        Ok(())
    }

    /// `n` completions were found for a wait: it is over.
    fn found(&self, n: usize, hints: WaitHints<'_>, coop: coop::RestoreOnPending) -> usize {
        coop.made_progress();
        if let Some(yields) = hints.yields {
            self.end_wait(yields);
        }
        n
    }

    /// Polls the queue, spinning for at most the busy-poll window while it is empty (unless
    /// recent windows ended empty; the window adapts: [`SpinPolicy`]) and nobody waits in
    /// `hints.lock_waiters`. A window cut short that way tells the policy nothing.
    fn poll_busy<const N: usize>(
        &self,
        out: &mut CompletionBatch<N>,
        hints: WaitHints<'_>,
    ) -> io::Result<usize> {
        // A caller that has just looked skips this look: the spin loop (or, with no window,
        // the look after arming, or none: `WaitHints::exclusive`) is the next one.
        if !hints.just_polled {
            let n = self.cq.poll_batch(out)?.len();
            if n > 0 {
                self.spin.record_late();
                return Ok(n);
            }
        }
        let Some(mut window) = self.spin.start() else {
            return Ok(0);
        };
        loop {
            let n = self.cq.poll_batch(out)?.len();
            if n > 0 {
                window.found();
                return Ok(n);
            }
            if hints
                .lock_waiters
                .is_some_and(|w| w.load(Ordering::Relaxed) > 0)
            {
                self.spins_yielded.fetch_add(1, Ordering::Relaxed);
                return Ok(0);
            }
            if window.ended_empty() {
                return Ok(0);
            }
            std::hint::spin_loop();
        }
    }
}
