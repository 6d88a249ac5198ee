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
pub(crate) struct WaitYields(Cell<u32>);

/// Per completion queue; shared by its waiters.
#[derive(Debug, Default)]
pub(crate) struct YieldPolicy {
    backoff: MissBackoff,
}

impl YieldPolicy {
    /// After a look that found the queue empty: whether this wait yields now (the caller then
    /// wakes its task and returns `Pending`) rather than sleeping.
    pub(crate) fn should_yield(&self, wait: &WaitYields) -> bool {
        let (yield_now, next) = match wait.0.get() {
            0 if self.backoff.take_turn() => (true, 1),
            0 | DONE => (false, DONE),
            n if n < MAX_YIELDS => (true, n + 1),
            _ => {
                // Every yield of this wait found nothing.
                self.backoff.miss();
                (false, DONE)
            }
        };
        wait.0.set(next);
        yield_now
    }

    /// Completions came for `wait`: it is over. Returns whether it had yielded (and so
    /// yielding paid).
    pub(crate) fn end_wait(&self, wait: &WaitYields) -> bool {
        let paid = (1..=MAX_YIELDS).contains(&wait.0.get());
        if paid {
            self.backoff.hit();
        }
        wait.0.set(0);
        paid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Yields one wait makes before it sleeps.
    fn yields_of_a_wait(policy: &YieldPolicy, wait: &WaitYields) -> u32 {
        let mut n = 0;
        while policy.should_yield(wait) {
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
            assert!(policy.should_yield(&wait) && policy.should_yield(&wait));
            policy.end_wait(&wait);
        }
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
