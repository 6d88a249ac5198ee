//! [`MissBackoff`]: when a way of waiting that did not pay lately is tried again.
//!
//! Busy-polling and yielding to other tasks both bet that a completion comes soon. A bet lost
//! in a row makes the following waits skip it: none after one loss (a single late completion is
//! a hiccup, not a pattern), then 1, 3, 7, ... up to 63 waits ([`MAX_MISSES`]); a bet won is
//! tried again at once. The occasional wait that still tries is the probe that notices when the
//! bet pays again.

use std::sync::atomic::{AtomicU32, Ordering};

/// Losses in a row counted: after them, 2^(7-1) - 1 = 63 waits are skipped, so at least one
/// wait in 64 probes.
pub(super) const MAX_MISSES: u32 = 7;

/// Per completion queue; shared by its waiters. Races between them only shift the count of
/// skipped waits, so relaxed atomics do.
#[derive(Debug, Default)]
pub(super) struct MissBackoff {
    /// Waits still to skip.
    skip: AtomicU32,
    /// Losses in a row, capped.
    misses: AtomicU32,
}

impl MissBackoff {
    /// Whether this wait tries; a wait told no counts as one skipped.
    pub(super) fn take_turn(&self) -> bool {
        self.skip
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1))
            .is_err()
    }

    /// A try paid: the next wait tries too.
    pub(super) fn hit(&self) {
        self.misses.store(0, Ordering::Relaxed);
    }

    /// A try did not pay: the following waits skip, the more the longer the losses go on.
    pub(super) fn miss(&self) {
        let misses = (self.misses.load(Ordering::Relaxed) + 1).min(MAX_MISSES);
        self.misses.store(misses, Ordering::Relaxed);
        // 2^(misses-1) - 1: 0, 1, 3, 7, ... 63.
        self.skip
            .store((1u32 << (misses - 1)) - 1, Ordering::Relaxed);
    }

    /// The losses so far were not (a longer try would have paid): start over.
    pub(super) fn forgive(&self) {
        self.misses.store(0, Ordering::Relaxed);
        self.skip.store(0, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// How many waits in a row skip from now on.
    fn skipped(backoff: &MissBackoff) -> u32 {
        let mut n = 0;
        while !backoff.take_turn() {
            n += 1;
            assert!(n < 1 << (MAX_MISSES - 1), "more waits skipped than the cap");
        }
        n
    }

    #[test]
    fn misses_in_a_row_skip_twice_as_many_waits_up_to_the_cap() {
        let backoff = MissBackoff::default();
        let mut seen = Vec::new();
        for _ in 0..9 {
            backoff.miss();
            seen.push(skipped(&backoff));
        }
        assert_eq!(seen, [0, 1, 3, 7, 15, 31, 63, 63, 63]);
    }

    #[test]
    fn a_hit_starts_the_count_over_and_forgiving_ends_the_skipping() {
        let backoff = MissBackoff::default();
        for _ in 0..4 {
            backoff.miss();
            skipped(&backoff);
        }
        backoff.hit();
        backoff.miss();
        assert_eq!(skipped(&backoff), 0, "one miss is not a pattern");
        backoff.miss();
        backoff.miss();
        backoff.forgive();
        assert_eq!(skipped(&backoff), 0);
        backoff.miss();
        assert_eq!(skipped(&backoff), 0, "forgiven misses are not counted");
    }
}
