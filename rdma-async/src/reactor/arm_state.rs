//! [`ArmState`]: whether a completion queue has an arm outstanding, shared by every task that
//! waits on the queue, so only one of them makes the (system-call) arm at a time.
//!
//! An arm raises one event on the completion channel at the next completion, and lasts until
//! that event is read. Whoever ends an arm must say so, or no later waiter arms again and the
//! next completion wakes nobody: after a successful read, and after a failed arm or a failed
//! read alike (the event, and so the arm, may be gone). A waiter that found the arm claimed by
//! another, and so sleeps under it without arming, registers with [`ArmState::sleep_under`]:
//! if that arm then fails, it was never made, and its claimant wakes every such waiter to
//! claim and arm again. `tests` drives these transitions through every interleaving of two
//! waiters with a model of the queue, its channel and the reactor's readiness, failures
//! included; `loom_tests` runs the type itself under loom, in the same loop, against a device
//! thread.

use std::sync::PoisonError;
use std::sync::atomic::Ordering;
use std::task::Waker;

use crate::sync::{AtomicU64, Mutex, MutexGuard};

/// The bit of [`ArmState::word`] set while an arm is outstanding; the bits above it count the
/// arms ended, so that a waiter can tell the arm it sleeps under from a later one.
const ARMED: u64 = 1;

/// Whether an arm is outstanding: the queue was armed and its event has not been read yet.
#[derive(Debug)]
pub(crate) struct ArmState {
    /// [`ARMED`], and the number of arms ended above it.
    word: AtomicU64,
    /// Who to wake if the outstanding arm fails.
    sleepers: Mutex<Sleepers>,
}

impl Default for ArmState {
    fn default() -> Self {
        ArmState {
            word: AtomicU64::new(0),
            sleepers: Mutex::new(Sleepers::default()),
        }
    }
}

/// The tasks that sleep under one arm without having made it.
#[derive(Debug, Default)]
struct Sleepers {
    /// The arm they sleep under (its [`ArmState::word`]); wakers of an earlier arm are stale.
    arm: u64,
    wakers: Vec<Waker>,
}

/// What [`ArmState::claim`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// No arm was outstanding: the caller must arm the queue (`ibv_req_notify_cq`) now and
    /// report a failure with [`ArmState::arm_failed`].
    Mine,
    /// Another waiter's arm is outstanding (or being made): a waiter that sleeps under it
    /// registers with [`ArmState::sleep_under`].
    Outstanding(Arm),
}

/// One arm, as [`ArmState::claim`] found it outstanding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Arm(u64);

impl ArmState {
    /// Claims the next arm, unless one is outstanding.
    pub(crate) fn claim(&self) -> Claim {
        let word = self.word.fetch_or(ARMED, Ordering::AcqRel);
        if word & ARMED == 0 {
            Claim::Mine
        } else {
            Claim::Outstanding(Arm(word))
        }
    }

    /// The caller is about to sleep under `arm` (which another waiter claimed): `waker` is
    /// woken if that arm fails. `false` when `arm` is over already: the caller looks and
    /// claims again instead of sleeping (a failed arm raises no event; a read one woke every
    /// waiter's registration, but this caller's may have been made after).
    pub(crate) fn sleep_under(&self, arm: Arm, waker: &Waker) -> bool {
        let mut sleepers = self.sleepers();
        // Under the lock that `arm_failed` ends an arm under: either it sees this waker, or
        // this sees the arm over.
        if self.word.load(Ordering::Acquire) != arm.0 {
            return false;
        }
        if sleepers.arm != arm.0 {
            sleepers.arm = arm.0;
            sleepers.wakers.clear();
        }
        if !sleepers.wakers.iter().any(|w| w.will_wake(waker)) {
            sleepers.wakers.push(waker.clone());
        }
        true
    }

    /// Arming failed: no arm is outstanding, and every waiter that sleeps under the one
    /// claimed is woken, to claim and arm again (or the next completion would wake nobody).
    pub(crate) fn arm_failed(&self) {
        let wakers = {
            let mut sleepers = self.sleepers();
            self.end_arm();
            std::mem::take(&mut sleepers.wakers)
        };
        // Woken outside the lock: a waker may run code of its own.
        for waker in wakers {
            waker.wake();
        }
    }

    /// The arm's event was read from the channel: the arm is used up.
    pub(crate) fn event_read(&self) {
        self.end_arm();
    }

    /// Reading the channel failed: whether the event is still there is unknown, so the arm is
    /// treated as used up and the next waiter arms again (a second arm costs at most one more
    /// event, which a later waiter reads; a missing arm would lose every later wake-up).
    pub(crate) fn event_read_failed(&self) {
        self.end_arm();
    }

    /// Ends the outstanding arm, if there is one; counting it tells its sleepers it is over.
    fn end_arm(&self) {
        // An arm already ended stays so (as storing `false` would leave it).
        let _ = self
            .word
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                (word & ARMED != 0).then_some(word + 1)
            });
    }

    fn sleepers(&self) -> MutexGuard<'_, Sleepers> {
        // Wakers only: nothing a panic could leave half-updated.
        self.sleepers.lock().unwrap_or_else(PoisonError::into_inner)
    }

    #[cfg(test)]
    fn with(armed: bool) -> Self {
        ArmState {
            word: AtomicU64::new(u64::from(armed)),
            sleepers: Mutex::new(Sleepers::default()),
        }
    }

    /// Drops the registered wakers (which, in `loom_tests`, hold the queue this is in).
    #[cfg(all(test, rdma_async_loom))]
    fn drop_sleepers(&self) {
        self.sleepers().wakers.clear();
    }

    /// Whether an arm is outstanding (made, and its event not read yet).
    pub(crate) fn is_armed(&self) -> bool {
        self.word.load(Ordering::Acquire) & ARMED != 0
    }
}

#[cfg(test)]
mod tests {
    //! An exhaustive interleaving check of `AsyncCq::poll_completions`' loop (poll, claim and
    //! arm, poll again (with `WaitHints::exclusive`, not under an earlier arm right after a
    //! poll that found nothing), wait for readiness, read the event, clear readiness) for two
    //! waiters, a device that completes two work requests at any moment, and one failure of an
    //! arm or of an event read (which may or may not consume the event) at any moment. Each
    //! waiter wants one completion and, after an error, tries again (as the next operation
    //! would). A stream's waiters may also take the event when woken, before they look
    //! (`AsyncCq::take_wake_event`). Every reachable state is visited; a state where nothing
    //! can happen any more but a waiter is still waiting is a lost wake-up.

    use std::collections::HashSet;

    use super::{ArmState, Claim};

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum Pc {
        /// The first poll, before the loop.
        Start,
        /// Claims the arm and arms, right after a first poll that found nothing (with
        /// [`Mode::skip_after_look`], a waiter that finds an arm outstanding waits without
        /// polling again).
        ArmAfterLook,
        /// Claims the arm and arms.
        Arm,
        /// Polls after arming.
        PollArmed,
        /// Waits until its registration is readable.
        Wait,
        /// Reads one event from the channel and clears its readiness.
        Read,
        /// Woken, with [`WakeRead::Take`]: takes the arm's event if its registration is
        /// readable (`AsyncCq::take_wake_event`), then looks.
        TakeEvent,
        /// Looks after a [`Pc::TakeEvent`], in the same hold of the lock, as [`Pc::Start`]
        /// does.
        LookAfterTake,
        /// With [`WakeRead::TakeAndArm`], after that look (`true`: it found its completion):
        /// claims and makes the next arm ahead of the next wait. Found, it is done (its next
        /// operation starts with a look); not, its wait looks under that arm ([`Pc::Arm`]).
        ArmAhead(bool),
        /// Got its completion.
        Done,
    }

    #[derive(Debug, Clone, PartialEq, Eq, Hash)]
    struct State {
        pcs: [Pc; 2],
        /// Completions in the queue.
        cq: u32,
        /// The device will raise an event at the next completion.
        hw_armed: bool,
        /// Events in the channel.
        events: u32,
        /// Each waiter's registration is readable (as the reactor reports it).
        ready: [bool; 2],
        /// The `ArmState`.
        armed: bool,
        /// Completions the device has yet to make.
        to_complete: u32,
        /// Failures yet to inject.
        faults: u32,
    }

    /// Runs `transition` on the `ArmState` of `s` and stores the result back.
    fn on_arm(s: &mut State, transition: impl FnOnce(&ArmState) -> bool) -> bool {
        let arm = ArmState::with(s.armed);
        let r = transition(&arm);
        s.armed = arm.is_armed();
        r
    }

    fn complete(s: &mut State) {
        s.cq += 1;
        s.to_complete -= 1;
        if s.hw_armed {
            s.hw_armed = false;
            s.events += 1;
            s.ready = [true; 2];
        }
    }

    /// How the waiters use the queue.
    #[derive(Debug, Clone, Copy)]
    struct Mode {
        /// `WaitHints::exclusive`: after a first poll that found nothing, a waiter that finds
        /// an arm outstanding waits without polling again.
        skip_after_look: bool,
        /// The waiters take turns: each holds a lock from its first poll (or its read) until
        /// it waits or is done, as a stream's sides do under the stream's state lock.
        locked: bool,
        /// What a woken waiter does first.
        wake_read: WakeRead,
    }

    /// Whether a woken waiter takes the event before it looks (a stream's wake-up).
    #[derive(Debug, Clone, Copy, PartialEq)]
    enum WakeRead {
        /// It reads the event in its next wait, if that wait finds nothing.
        No,
        /// It takes the event, ending the arm, then looks, in one hold of the lock.
        Take,
        /// It takes the event, ending the arm, looks, and claims and makes the next arm
        /// (`AsyncCq::arm_ahead`), in one hold of the lock; a wait that follows looks under it.
        TakeAndArm,
        /// As `TakeAndArm`, but the wait that follows skips its look under the arm, as after
        /// any look that found nothing (a bug: a completion between the first look and the arm
        /// raises no event, and the wait sleeps under the arm).
        TakeAndArmSkippingLook,
        /// It takes the event but leaves the arm outstanding (a bug: the next wait sleeps under
        /// an arm whose event is gone).
        TakeKeepingArm,
    }

    /// Whether a waiter at `pc` holds the lock (in [`Mode::locked`]).
    fn holds_lock(pc: Pc) -> bool {
        matches!(
            pc,
            Pc::ArmAfterLook
                | Pc::Arm
                | Pc::PollArmed
                | Pc::Read
                | Pc::TakeEvent
                | Pc::LookAfterTake
                | Pc::ArmAhead(_)
        )
    }

    /// `AsyncCq::take_wake_event` by waiter `w`: every state it may lead to, with the waiter
    /// then at [`Pc::LookAfterTake`]. A failed read ends the arm and is not reported (the look
    /// comes next); with [`WakeRead::TakeKeepingArm`], a successful one does not end it.
    fn take_event(s: &State, w: usize, read_failed: fn(&ArmState), how: WakeRead) -> Vec<State> {
        let mut n = s.clone();
        n.pcs[w] = Pc::LookAfterTake;
        if !s.armed || !s.ready[w] {
            return vec![n];
        }
        // Read, or read empty: readiness cleared.
        n.ready[w] = false;
        if s.events == 0 {
            return vec![n];
        }
        let mut next = Vec::new();
        if s.faults > 0 {
            // `ibv_get_cq_event` fails, with the event read or not; readiness is not cleared.
            for consumed in [false, true] {
                let mut f = s.clone();
                f.pcs[w] = Pc::LookAfterTake;
                f.faults -= 1;
                f.events -= u32::from(consumed);
                on_arm(&mut f, |a| {
                    read_failed(a);
                    false
                });
                next.push(f);
            }
        }
        n.events -= 1;
        if how != WakeRead::TakeKeepingArm {
            on_arm(&mut n, |a| {
                a.event_read();
                false
            });
        }
        next.push(n);
        next
    }

    /// A look at the queue by waiter `w` before any wait: done if it found a completion, or
    /// `otherwise`.
    fn look(n: &mut State, w: usize, otherwise: Pc) {
        if n.cq > 0 {
            n.cq -= 1;
            n.pcs[w] = Pc::Done;
        } else {
            n.pcs[w] = otherwise;
        }
    }

    /// Waiter `w` claims the arm in `n` and, if it is its, arms (`n.hw_armed`); with a fault
    /// left, the arm may fail instead, which leaves `w` at `on_failure` (that state goes to
    /// `next`). Whether the claim was its.
    fn claim_and_arm(n: &mut State, w: usize, on_failure: Pc, next: &mut Vec<State>) -> bool {
        let claimed = on_arm(n, |a| a.claim() == Claim::Mine);
        if claimed {
            if n.faults > 0 {
                // `ibv_req_notify_cq` fails.
                let mut f = n.clone();
                f.faults -= 1;
                on_arm(&mut f, |a| {
                    a.arm_failed();
                    false
                });
                f.pcs[w] = on_failure;
                next.push(f);
            }
            n.hw_armed = true;
        }
        claimed
    }

    /// Every state one step from `s`.
    fn successors(s: &State, read_failed: fn(&ArmState), mode: Mode) -> Vec<State> {
        let mut next = Vec::new();
        if s.to_complete > 0 {
            let mut n = s.clone();
            complete(&mut n);
            next.push(n);
        }
        for w in 0..2 {
            // Taking the lock (to poll first, or to read after a wake-up) waits for the other.
            if mode.locked && holds_lock(s.pcs[1 - w]) && !holds_lock(s.pcs[w]) {
                continue;
            }
            let mut n = s.clone();
            match s.pcs[w] {
                Pc::Start | Pc::PollArmed => {
                    if n.cq > 0 {
                        n.cq -= 1;
                        n.pcs[w] = Pc::Done;
                    } else {
                        n.pcs[w] = if s.pcs[w] == Pc::Start {
                            Pc::ArmAfterLook
                        } else {
                            Pc::Wait
                        };
                    }
                    next.push(n);
                }
                Pc::Arm | Pc::ArmAfterLook => {
                    // A failed arm ends the operation with the error.
                    let claimed = claim_and_arm(&mut n, w, Pc::Start, &mut next);
                    let skip = mode.skip_after_look && !claimed && s.pcs[w] == Pc::ArmAfterLook;
                    n.pcs[w] = if skip { Pc::Wait } else { Pc::PollArmed };
                    next.push(n);
                }
                Pc::Wait => {
                    if s.ready[w] {
                        n.pcs[w] = match mode.wake_read {
                            WakeRead::No => Pc::Read,
                            WakeRead::Take
                            | WakeRead::TakeAndArm
                            | WakeRead::TakeAndArmSkippingLook
                            | WakeRead::TakeKeepingArm => Pc::TakeEvent,
                        };
                        next.push(n);
                    }
                }
                Pc::TakeEvent => next.extend(take_event(s, w, read_failed, mode.wake_read)),
                Pc::LookAfterTake
                    if matches!(
                        mode.wake_read,
                        WakeRead::TakeAndArm | WakeRead::TakeAndArmSkippingLook
                    ) =>
                {
                    let found = n.cq > 0;
                    n.cq -= u32::from(found);
                    n.pcs[w] = Pc::ArmAhead(found);
                    next.push(n);
                }
                Pc::LookAfterTake => {
                    look(&mut n, w, Pc::ArmAfterLook);
                    next.push(n);
                }
                Pc::ArmAhead(found) => {
                    // On failure the arm is left to the wait, which claims and arms again.
                    let after_failure = if found { Pc::Done } else { Pc::ArmAfterLook };
                    claim_and_arm(&mut n, w, after_failure, &mut next);
                    n.pcs[w] = if found {
                        Pc::Done
                    } else if mode.wake_read == WakeRead::TakeAndArmSkippingLook {
                        after_failure
                    } else {
                        Pc::Arm
                    };
                    next.push(n);
                }
                Pc::Read => {
                    if s.events > 0 && s.faults > 0 {
                        // `ibv_get_cq_event` fails, with the event read or not; readiness is
                        // not cleared; the operation ends with the error.
                        for consumed in [false, true] {
                            let mut f = n.clone();
                            f.faults -= 1;
                            f.events -= u32::from(consumed);
                            on_arm(&mut f, |a| {
                                read_failed(a);
                                false
                            });
                            f.pcs[w] = Pc::Start;
                            next.push(f);
                        }
                    }
                    if s.events > 0 {
                        n.events -= 1;
                        on_arm(&mut n, |a| {
                            a.event_read();
                            false
                        });
                    }
                    // Read, or `WouldBlock` (another waiter read it): readiness cleared.
                    n.ready[w] = false;
                    n.pcs[w] = Pc::Arm;
                    next.push(n);
                }
                Pc::Done => {}
            }
        }
        next
    }

    /// Explores every state; returns the first stuck one, and how many states there were.
    fn explore(read_failed: fn(&ArmState), mode: Mode) -> (Option<State>, usize) {
        let start = State {
            pcs: [Pc::Start; 2],
            cq: 0,
            hw_armed: false,
            events: 0,
            ready: [false; 2],
            armed: false,
            to_complete: 2,
            faults: 1,
        };
        let mut seen = HashSet::from([start.clone()]);
        let mut stack = vec![start];
        while let Some(s) = stack.pop() {
            let next = successors(&s, read_failed, mode);
            if next.is_empty() && s.pcs != [Pc::Done; 2] {
                return (Some(s), seen.len());
            }
            for n in next {
                if seen.insert(n.clone()) {
                    stack.push(n);
                }
            }
        }
        (None, seen.len())
    }

    /// Waiters that poll after every arm, in any interleaving (an endpoint's or a
    /// connection's tasks).
    const SHARED: Mode = Mode {
        skip_after_look: false,
        locked: false,
        wake_read: WakeRead::No,
    };
    /// Waiters that take turns under a lock and skip the poll under an earlier arm (a stream).
    const EXCLUSIVE: Mode = Mode {
        skip_after_look: true,
        locked: true,
        wake_read: WakeRead::No,
    };
    /// Waiters that take the event when woken, before they look, without arming.
    const EXCLUSIVE_TAKING: Mode = Mode {
        wake_read: WakeRead::Take,
        ..EXCLUSIVE
    };
    /// A stream's waiters, which take the event when woken and arm again before they look.
    const EXCLUSIVE_TAKING_ARMING: Mode = Mode {
        wake_read: WakeRead::TakeAndArm,
        ..EXCLUSIVE
    };

    #[test]
    fn no_interleaving_or_failure_loses_a_wake_up() {
        for mode in [SHARED, EXCLUSIVE, EXCLUSIVE_TAKING, EXCLUSIVE_TAKING_ARMING] {
            let (stuck, states) = explore(ArmState::event_read_failed, mode);
            assert!(stuck.is_none(), "{mode:?}: a lost wake-up: {stuck:?}");
            assert!(
                states > 100,
                "{mode:?}: the model explored only {states} states"
            );
        }
    }

    /// The check finds the bug it is for: a failed read that keeps the arm "outstanding".
    #[test]
    fn keeping_the_arm_after_a_failed_read_is_caught() {
        for mode in [SHARED, EXCLUSIVE, EXCLUSIVE_TAKING, EXCLUSIVE_TAKING_ARMING] {
            let (stuck, _) = explore(|_| {}, mode);
            let stuck = stuck.expect("the model misses the lost wake-up");
            assert!(stuck.armed && !stuck.hw_armed, "{mode:?}: {stuck:?}");
        }
    }

    /// Skipping the poll under an earlier arm is safe only while the waiters take turns:
    /// otherwise another waiter may arm after this one polled, after completions that then
    /// raise no event, and take only some of them.
    #[test]
    fn skipping_the_poll_while_waiters_interleave_is_caught() {
        let mode = Mode {
            skip_after_look: true,
            locked: false,
            wake_read: WakeRead::No,
        };
        let (stuck, _) = explore(ArmState::event_read_failed, mode);
        let stuck = stuck.expect("the model misses the lost wake-up");
        assert!(stuck.cq > 0 && stuck.events == 0, "{stuck:?}");
    }

    /// An arm ahead of the next wait must be followed by a look: a completion that came between
    /// the wake-up's look and the arm raised no event, and the wait sleeps under the arm.
    #[test]
    fn a_wait_skipping_its_look_after_an_arm_ahead_is_caught() {
        let stuck = stuck_waking_with(WakeRead::TakeAndArmSkippingLook);
        assert!(stuck.cq > 0 && stuck.events == 0, "{stuck:?}");
    }

    /// The state where a stream's waiters, woken as `wake_read` says, lose a wake-up.
    fn stuck_waking_with(wake_read: WakeRead) -> State {
        let mode = Mode {
            wake_read,
            ..EXCLUSIVE
        };
        let (stuck, _) = explore(ArmState::event_read_failed, mode);
        stuck.expect("the model misses the lost wake-up")
    }

    /// A wake-up's take of the event must end the arm: the next wait would otherwise sleep
    /// under an arm whose event is gone.
    #[test]
    fn taking_the_event_without_ending_the_arm_is_caught() {
        let stuck = stuck_waking_with(WakeRead::TakeKeepingArm);
        assert!(stuck.armed && !stuck.hw_armed, "{stuck:?}");
    }
}

#[cfg(all(test, rdma_async_loom))]
mod loom_tests {
    //! `ArmState` itself, under loom: two waiters run `AsyncCq::poll_completions`' loop (poll,
    //! claim and arm, poll again, wait for readiness (registered under another's arm with
    //! `sleep_under`), read the event) against a device thread that completes one work request
    //! for each. Whoever polls takes every completion in the queue and wakes its owner (as a
    //! stream's and a connection's completion handling do). A waiter that waits with nothing
    //! to come, after the device is done, is a deadlock, which loom reports: a lost wake-up.
    //! Unlike the exhaustive model in `tests`, a claim and its arm, and a read and its
    //! `event_read`, are separate steps here, as in the real loop. One fault at a time is
    //! injected into waiter 0: a failed arm, or a failed read that did or did not take the
    //! event (the operation ends with the error and the next one starts over, as an
    //! application's next call would). A waiter woken by its waker starts over too, as a task
    //! polled again calls `poll_completions` again.

    use std::task::{Wake, Waker};

    use loom::sync::{Arc, Condvar, Mutex};
    use loom::thread;

    use super::{ArmState, Claim};

    /// The completion queue, its channel and the waiters' readiness.
    #[derive(Debug, Default)]
    struct Device {
        /// Completions in the queue, by the waiter they are for.
        queued: [bool; 2],
        /// Completions polled and handed to their waiter.
        delivered: [bool; 2],
        /// The device raises an event at the next completion.
        hw_armed: bool,
        /// Events in the channel.
        events: u32,
        /// Each waiter's registration is readable.
        ready: [bool; 2],
        /// Each waiter's waker was woken (by `ArmState::arm_failed`).
        woken: [bool; 2],
    }

    #[derive(Debug)]
    struct Queue {
        arm: ArmState,
        device: Mutex<Device>,
        /// Signalled when readiness is set, a completion is handed over or a waker is woken.
        wake: Condvar,
    }

    /// Waiter `w`'s waker: marks it woken.
    struct Woken {
        queue: Arc<Queue>,
        w: usize,
    }

    impl Wake for Woken {
        fn wake(self: std::sync::Arc<Self>) {
            self.queue.device.lock().unwrap().woken[self.w] = true;
            self.queue.wake.notify_all();
        }
    }

    #[derive(Debug, Clone, Copy, PartialEq)]
    enum Fault {
        None,
        Arm,
        Read { consumed: bool },
    }

    impl Queue {
        /// `ibv_poll_cq`: takes every completion and wakes its owner; whether `w`'s came.
        fn poll(&self, w: usize) -> bool {
            let mut d = self.device.lock().unwrap();
            for owner in 0..2 {
                if std::mem::take(&mut d.queued[owner]) {
                    d.delivered[owner] = true;
                    self.wake.notify_all();
                }
            }
            d.delivered[w]
        }

        fn complete(&self, owner: usize) {
            let mut d = self.device.lock().unwrap();
            d.queued[owner] = true;
            if d.hw_armed {
                d.hw_armed = false;
                d.events += 1;
                d.ready = [true; 2];
                self.wake.notify_all();
            }
        }

        /// Waiter `w`'s operations until it got its completion; `fault` is injected once.
        fn wait_for_one(
            &self,
            w: usize,
            waker: &Waker,
            mut fault: Fault,
            read_failed: fn(&ArmState),
        ) {
            'operation: loop {
                if self.poll(w) {
                    return;
                }
                loop {
                    let claim = self.arm.claim();
                    if claim == Claim::Mine {
                        if fault == Fault::Arm {
                            fault = Fault::None;
                            self.arm.arm_failed();
                            continue 'operation;
                        }
                        self.device.lock().unwrap().hw_armed = true;
                    }
                    if self.poll(w) {
                        return;
                    }
                    let mut d = self.device.lock().unwrap();
                    // Not readable yet: the wait sleeps, and under another's arm registers.
                    if !d.ready[w]
                        && !d.delivered[w]
                        && let Claim::Outstanding(arm) = claim
                        && !self.arm.sleep_under(arm, waker)
                    {
                        continue;
                    }
                    while !d.ready[w] && !d.delivered[w] && !d.woken[w] {
                        d = self.wake.wait(d).unwrap();
                    }
                    if d.delivered[w] {
                        // Another waiter's poll handed it over.
                        return;
                    }
                    if std::mem::take(&mut d.woken[w]) {
                        // Polled again: `poll_completions` starts over.
                        continue 'operation;
                    }
                    if let Fault::Read { consumed } = fault
                        && d.events > 0
                    {
                        // `ibv_get_cq_event` fails; readiness is not cleared.
                        fault = Fault::None;
                        d.events -= u32::from(consumed);
                        drop(d);
                        read_failed(&self.arm);
                        continue 'operation;
                    }
                    // Read, or `WouldBlock` (another waiter read it): readiness cleared.
                    let read = d.events > 0;
                    d.events -= u32::from(read);
                    d.ready[w] = false;
                    drop(d);
                    if read {
                        self.arm.event_read();
                    }
                }
            }
        }
    }

    fn check(fault: Fault, read_failed: fn(&ArmState)) {
        loom::model(move || {
            let queue = Arc::new(Queue {
                arm: ArmState::default(),
                device: Mutex::new(Device::default()),
                wake: Condvar::new(),
            });
            let waiters: Vec<_> = [fault, Fault::None]
                .into_iter()
                .enumerate()
                .map(|(w, fault)| {
                    let queue = queue.clone();
                    let waker = Waker::from(std::sync::Arc::new(Woken {
                        queue: queue.clone(),
                        w,
                    }));
                    thread::spawn(move || queue.wait_for_one(w, &waker, fault, read_failed))
                })
                .collect();
            queue.complete(0);
            queue.complete(1);
            for waiter in waiters {
                waiter.join().unwrap();
            }
            // The wakers hold the queue, which holds them: loom would report the cycle.
            queue.arm.drop_sleepers();
        });
    }

    #[test]
    fn loom_no_interleaving_loses_a_wake_up() {
        check(Fault::None, ArmState::event_read_failed);
    }

    /// A waiter that found the arm claimed by another, whose arm then fails, is woken by it
    /// and arms itself: it does not wait under an arm that never was.
    #[test]
    fn loom_a_failed_arm_loses_no_wake_up() {
        check(Fault::Arm, ArmState::event_read_failed);
    }

    #[test]
    fn loom_a_failed_read_loses_no_wake_up() {
        check(Fault::Read { consumed: false }, ArmState::event_read_failed);
        check(Fault::Read { consumed: true }, ArmState::event_read_failed);
    }
}
