//! When a busy-poll window is worth spending.
//!
//! Spinning pays when the next completion arrives within the window (one connection
//! ping-ponging: it saves the arm, the sleep and the wake-up). It is pure waste when it does not
//! (a server with hundreds of connections, each waiting longer than the window, or a peer that
//! thinks between messages): the thread spins while nothing else on it can run, and then sleeps
//! anyway. So empty windows in a row make the following waits skip spinning: none after one
//! (a single late completion is a hiccup, not a pattern), then 1, 3, 7, ... up to 63 waits
//! ([`MAX_MISSES`]); a window that found a completion spins again at once. The occasional
//! window that is still spent is the probe that notices when spinning pays again.

use std::sync::atomic::{AtomicU32, Ordering};

/// Empty windows in a row counted: after them, 2^(7-1) - 1 = 63 waits are skipped, so at least
/// one wait in 64 probes.
const MAX_MISSES: u32 = 7;

/// Per completion queue; shared by its waiters. Races between them only shift the count of
/// skipped waits, so relaxed atomics do.
#[derive(Debug, Default)]
pub(crate) struct SpinPolicy {
    /// Waits still to skip spinning.
    skip: AtomicU32,
    /// Empty windows in a row, capped.
    misses: AtomicU32,
}

impl SpinPolicy {
    /// Whether this wait should spend its busy-poll window; a wait told no counts as skipped.
    pub(crate) fn should_spin(&self) -> bool {
        self.skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
    }

    /// Records how a spent window ended: with a completion (`found`) or empty.
    pub(crate) fn record(&self, found: bool) {
        if found {
            self.misses.store(0, Ordering::Relaxed);
            return;
        }
        let misses = (self.misses.load(Ordering::Relaxed) + 1).min(MAX_MISSES);
        self.misses.store(misses, Ordering::Relaxed);
        // 2^(misses-1) - 1: 0, 1, 3, 7, ... 63.
        self.skip
            .store((1u32 << (misses - 1)) - 1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many waits in a row skip spinning from now on.
    fn skipped(policy: &SpinPolicy) -> u32 {
        let mut n = 0;
        while !policy.should_spin() {
            n += 1;
            assert!(n < 1 << (MAX_MISSES - 1), "more waits skipped than the cap");
        }
        n
    }

    #[test]
    fn spins_while_windows_find_completions() {
        let policy = SpinPolicy::default();
        for _ in 0..100 {
            assert!(policy.should_spin());
            policy.record(true);
        }
    }

    #[test]
    fn empty_windows_in_a_row_skip_twice_as_many_waits_up_to_the_cap() {
        let policy = SpinPolicy::default();
        let mut seen = Vec::new();
        for _ in 0..9 {
            policy.record(false);
            seen.push(skipped(&policy));
        }
        assert_eq!(seen, [0, 1, 3, 7, 15, 31, 63, 63, 63]);
    }

    #[test]
    fn a_window_that_finds_a_completion_resets_the_backoff() {
        let policy = SpinPolicy::default();
        for _ in 0..4 {
            policy.record(false);
            skipped(&policy);
        }
        policy.record(true);
        assert_eq!(skipped(&policy), 0);
        policy.record(false);
        assert_eq!(skipped(&policy), 0, "one empty window is not a pattern");
        policy.record(false);
        assert_eq!(skipped(&policy), 1, "the backoff starts over");
    }
}
