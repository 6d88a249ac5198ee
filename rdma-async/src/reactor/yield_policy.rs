//! When a wait for completions yields to the runtime's other tasks before it sleeps.
//!
//! A task that finds its queue empty (after its busy-poll window, if any) can sleep: arm the
//! queue (a system call on some providers, rxe among them), read the channel's event when it
//! comes (another) and be woken by the reactor. Or it can go to the back of the runtime's run
//! queue and look again when its turn comes. With many connections on a thread, the other
//! tasks' turns take about as long as a peer needs to answer, so a look after a few yields
//! finds the completion and the arm, the event and the wake-up are saved (`scripts/compare-many`
//! measures it). With nothing else to run, the yields come back at once and cost a few looks.
//! A wait whose yields all found nothing sleeps anyway, and makes the following waits skip
//! yielding ([`MissBackoff`]).
//!
//! A yield pays only when other tasks run in it: with nothing else to run it is one more look
//! at the queue through a round trip of the runtime (about 400 instructions in Tokio's
//! scheduler and time driver), a poll after the busy-poll window (or with busy-polling off)
//! that the caller did not ask for. Which tasks ran in a yield is not something Tokio tells
//! cheaply, so the waits tell each other: every look at a completion queue notes its queue on
//! the thread ([`note_look`]), and a yield back to which no other queue was looked at on the
//! thread ran no other connection's task. It ends the wait's yielding (the wait sleeps) and
//! counts as a yield in vain, even when the look after it found the completion.

use std::cell::Cell;

use super::miss_backoff::MissBackoff;

/// The most yields one wait makes before it sleeps. Measured with 256 connections ping-ponging
/// on one thread each side (`docs/performance.md`): 1 yield found the peer's answer about half
/// the time, 8 nearly always, which took CPU per transfer to 1.09 times that of one
/// busy-polling connection.
pub(crate) const MAX_YIELDS: u32 = 8;

/// Marks a wait that yields no more: it sleeps until a completion comes.
const DONE: u32 = u32::MAX;

/// Where one waiter keeps the yields of its current wait for completions (a stream keeps one
/// for both sides, which wait under one lock).
#[derive(Debug, Default)]
pub(crate) struct WaitYields {
    /// Yields made, or [`DONE`].
    made: Cell<u32>,
    /// [`Looks::changes`] when the wait last yielded.
    changes_at_yield: Cell<u64>,
}

/// The looks at completion queues on one thread.
#[derive(Clone, Copy)]
struct Looks {
    /// The queue that looked last (its address).
    last: usize,
    /// How many times the looking queue changed: a queue's looks in a row count once.
    changes: u64,
}

thread_local! {
    static LOOKS: Cell<Looks> = const { Cell::new(Looks { last: 0, changes: 0 }) };
}

/// A look at queue `queue` (any value that tells the thread's queues apart) on this thread:
/// what tells a wait whether other connections' tasks ran in its yield.
#[inline]
pub(crate) fn note_look(queue: usize) {
    LOOKS.with(|looks| {
        let seen = looks.get();
        if seen.last != queue {
            looks.set(Looks {
                last: queue,
                changes: seen.changes.wrapping_add(1),
            });
        }
    });
}

/// See [`Looks::changes`].
fn look_changes() -> u64 {
    LOOKS.with(|looks| looks.get().changes)
}

/// Per completion queue; shared by its waiters.
#[derive(Debug, Default)]
pub(crate) struct YieldPolicy {
    backoff: MissBackoff,
}

impl YieldPolicy {
    /// After a look that found the queue empty: whether this wait yields now (the caller then
    /// wakes its task and returns `Pending`) rather than sleeping.
    pub(crate) fn should_yield(&self, wait: &WaitYields) -> bool {
        let (yield_now, next) = match wait.made.get() {
            0 if self.backoff.take_turn() => (true, 1),
            0 | DONE => (false, DONE),
            _ if wait.ran_alone() => {
                // The runtime had nothing else to run: yielding again is polling.
                self.backoff.miss();
                (false, DONE)
            }
            n if n < MAX_YIELDS => (true, n + 1),
            _ => {
                // Every yield of this wait found nothing.
                self.backoff.miss();
                (false, DONE)
            }
        };
        wait.made.set(next);
        if yield_now {
            wait.changes_at_yield.set(look_changes());
        }
        yield_now
    }

    /// Completions came for `wait`: it is over. Returns whether it had yielded (and so
    /// yielding paid: other tasks ran in its yields, and the completion came meanwhile).
    pub(crate) fn end_wait(&self, wait: &WaitYields) -> bool {
        let yielded = (1..=MAX_YIELDS).contains(&wait.made.get());
        let paid = yielded && !wait.ran_alone();
        if paid {
            self.backoff.hit();
        } else if yielded {
            // Found, but by a look that sleeping would have made as well.
            self.backoff.miss();
        }
        wait.made.set(0);
        paid
    }
}

impl WaitYields {
    /// Whether no other queue was looked at on this thread since the wait's last yield.
    fn ran_alone(&self) -> bool {
        look_changes() == self.changes_at_yield.get()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The waiting queue, and another one on the same thread.
    const OWN: usize = 1;
    const OTHER: usize = 2;

    /// The runtime runs another connection's task in a yield, then the waiting one, which
    /// looks at its queue.
    fn others_ran() {
        note_look(OTHER);
        note_look(OWN);
    }

    /// Yields one wait makes before it sleeps, other tasks running in each.
    fn yields_of_a_wait(policy: &YieldPolicy, wait: &WaitYields) -> u32 {
        let mut n = 0;
        while policy.should_yield(wait) {
            others_ran();
            n += 1;
            assert!(n <= MAX_YIELDS, "a wait yields at most MAX_YIELDS times");
        }
        assert!(
            !policy.should_yield(wait),
            "a wait that slept yields no more"
        );
        n
    }

    #[test]
    fn a_wait_yields_up_to_the_limit_then_sleeps() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        assert_eq!(yields_of_a_wait(&policy, &wait), MAX_YIELDS);
        policy.end_wait(&wait);
        // One wait that yielded in vain is not a pattern.
        assert_eq!(yields_of_a_wait(&policy, &wait), MAX_YIELDS);
    }

    #[test]
    fn waits_whose_yields_find_nothing_make_later_waits_skip_yielding() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        let mut seen = Vec::new();
        for _ in 0..6 {
            seen.push(yields_of_a_wait(&policy, &wait));
            policy.end_wait(&wait);
        }
        // In vain twice in a row: the next wait skips; three times: the next three.
        assert_eq!(seen, [MAX_YIELDS, MAX_YIELDS, 0, MAX_YIELDS, 0, 0]);
    }

    #[test]
    fn a_yield_that_pays_keeps_later_waits_yielding() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        for _ in 0..2 {
            yields_of_a_wait(&policy, &wait);
            policy.end_wait(&wait);
        }
        // This wait skips (two in vain); the next tries, and its second yield pays.
        assert_eq!(yields_of_a_wait(&policy, &wait), 0);
        policy.end_wait(&wait);
        for _ in 0..10 {
            assert!(policy.should_yield(&wait));
            others_ran();
            assert!(policy.should_yield(&wait));
            others_ran();
            assert!(policy.end_wait(&wait), "paid");
        }
    }

    #[test]
    fn a_yield_back_to_which_only_this_queue_looked_ends_the_yielding() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        note_look(OWN);
        assert!(policy.should_yield(&wait));
        // Back at once: only this wait looked again.
        note_look(OWN);
        note_look(OWN);
        assert!(!policy.should_yield(&wait), "sleeps rather than poll");
        assert!(!policy.end_wait(&wait), "the yield did not pay");
    }

    #[test]
    fn completions_found_after_lonely_yields_make_later_waits_skip_yielding() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        let mut seen = Vec::new();
        for _ in 0..6 {
            note_look(OWN);
            let yielded = policy.should_yield(&wait);
            seen.push(yielded);
            if yielded {
                // The look after the yield finds the completion: a look that sleeping, with
                // nothing else to run, would have made as well.
                note_look(OWN);
            }
            assert!(!policy.end_wait(&wait), "a yield alone never pays");
        }
        assert_eq!(seen, [true, true, false, true, false, false]);
    }

    #[test]
    fn a_wait_ended_without_yielding_counts_neither_way() {
        let (policy, wait) = (YieldPolicy::default(), WaitYields::default());
        yields_of_a_wait(&policy, &wait);
        policy.end_wait(&wait);
        // Completions found at once, before any yield: nothing learned.
        policy.end_wait(&wait);
        assert_eq!(yields_of_a_wait(&policy, &wait), MAX_YIELDS);
        policy.end_wait(&wait);
        assert_eq!(yields_of_a_wait(&policy, &wait), 0, "two in vain in a row");
    }
}
