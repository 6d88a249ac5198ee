//! One busy-poll window being spent: counts the empty polls and reads the clock only every
//! [`CLOCK_EVERY`] of them.
//!
//! Where the clock is slow to read (an emulated HPET costs microseconds, and a guest without a
//! stable TSC has no vDSO clock: every reading is a system call), reading it on each poll would
//! be most of the window. The window starts at the first reading, not when the spin starts: a
//! completion found within the first few polls, the common case when spinning pays, then costs
//! no reading at all. That lengthens the window by [`CLOCK_EVERY`] polls, one to a few
//! microseconds on a real device.

use std::time::{Duration, Instant};

use super::spin_policy::SpinPolicy;

/// How many empty polls of a busy-poll window go between two readings of the clock. Under
/// emulation a 64 B ping-pong's wait is a few dozen polls: 16 read the clock about once per
/// round trip, 64 about a third as often, and the round trip got about 7% shorter
/// (`docs/performance.md`).
const CLOCK_EVERY: u32 = 64;

/// A window of `policy`'s being spent ([`SpinPolicy::start`]).
#[derive(Debug)]
pub(crate) struct SpinWindow<'a> {
    policy: &'a SpinPolicy,
    length: Duration,
    /// When the window ends, from the first reading of the clock on.
    deadline: Option<Instant>,
    empty_polls: u32,
}

impl<'a> SpinWindow<'a> {
    pub(super) fn new(policy: &'a SpinPolicy, length: Duration) -> Self {
        SpinWindow {
            policy,
            length,
            deadline: None,
            empty_polls: 0,
        }
    }

    /// After an empty poll: whether the window is over (the policy then records it as spent
    /// empty).
    pub(crate) fn ended_empty(&mut self) -> bool {
        self.empty_polls = self.empty_polls.wrapping_add(1);
        if !self.empty_polls.is_multiple_of(CLOCK_EVERY) {
            return false;
        }
        let now = Instant::now();
        let deadline = *self.deadline.get_or_insert(now + self.length);
        if now < deadline {
            return false;
        }
        self.policy.record_empty(now);
        true
    }

    /// The window found what it spun for.
    pub(crate) fn found(self) {
        self.policy.record_found();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_ends_only_after_its_length_and_reads_the_clock_every_few_polls() {
        let policy = SpinPolicy::fixed(Duration::from_millis(5));
        let mut window = policy.start().expect("a nonzero window is spent");
        let started = Instant::now();
        let mut polls = 0u32;
        while !window.ended_empty() {
            polls += 1;
            std::hint::spin_loop();
        }
        assert!(started.elapsed() >= Duration::from_millis(5));
        // The empty poll that ended it was one the clock was read at.
        assert_eq!((polls + 1) % CLOCK_EVERY, 0);
    }

    #[test]
    fn a_zero_window_is_never_spent() {
        assert!(SpinPolicy::new(Duration::ZERO).start().is_none());
    }
}
