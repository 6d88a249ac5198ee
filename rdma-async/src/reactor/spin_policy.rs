//! When a busy-poll window is worth spending, and how long it is.
//!
//! Spinning pays when the next completion arrives within the window (one connection
//! ping-ponging: it saves the arm, the sleep and the wake-up). It is pure waste when it does not
//! (a server with hundreds of connections, each waiting longer than the window, or a peer that
//! thinks between messages): the thread spins while nothing else on it can run, and then sleeps
//! anyway. So empty windows in a row make the following waits skip spinning ([`MissBackoff`]);
//! a window that found a completion spins again at once.
//!
//! The window grows when it ended just short: a completion that arrives after an empty window,
//! but within [`MAX_GROWTH`] times the configured window, shows that a longer one would have
//! caught it, so the window becomes that long (and a quarter), and the miss is forgiven. A
//! round trip longer than the configured window (a slow link, or selective signaling leaving no
//! send completion to restart the window half-way) is then spun through rather than slept
//! through. A completion later than that resets the window to the configured one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::miss_backoff::MissBackoff;
use super::spin_window::SpinWindow;

/// The longest window, as a multiple of the configured one.
const MAX_GROWTH: u64 = 8;

/// Per completion queue; shared by its waiters. Races between them only shift the count of
/// skipped waits or the window's length, so relaxed atomics do.
#[derive(Debug)]
pub(crate) struct SpinPolicy {
    /// Which waits skip spinning after empty windows.
    backoff: MissBackoff,
    /// The window now, in nanoseconds.
    window: AtomicU64,
    /// The configured window, in nanoseconds.
    base: u64,
    /// The longest the window grows to, in nanoseconds.
    max: u64,
    /// When the last window ended empty, in nanoseconds since `epoch` (at least 1); 0 once a
    /// completion came after it.
    missed_at: AtomicU64,
    epoch: Instant,
}

impl SpinPolicy {
    /// A policy whose window starts at, and never falls below, `window`, and grows up to
    /// [`MAX_GROWTH`] times that.
    pub(crate) fn new(window: Duration) -> Self {
        Self::with_growth(window, MAX_GROWTH)
    }

    /// A policy whose window stays `window` (only the skipping adapts).
    pub(crate) fn fixed(window: Duration) -> Self {
        Self::with_growth(window, 1)
    }

    fn with_growth(window: Duration, growth: u64) -> Self {
        let base = u64::try_from(window.as_nanos()).unwrap_or(u64::MAX);
        SpinPolicy {
            backoff: MissBackoff::default(),
            window: AtomicU64::new(base),
            base,
            max: base.saturating_mul(growth),
            missed_at: AtomicU64::new(0),
            epoch: Instant::now(),
        }
    }

    /// Starts spending this wait's window, if it spins at all ([`Self::window`]).
    pub(crate) fn start(&self) -> Option<SpinWindow<'_>> {
        self.window().map(|length| SpinWindow::new(self, length))
    }

    /// How long this wait spins, if at all: `None` when the window is zero or this wait skips
    /// it (a wait told no counts as skipped).
    fn window(&self) -> Option<Duration> {
        if self.base == 0 {
            return None;
        }
        self.backoff
            .take_turn()
            .then(|| Duration::from_nanos(self.window.load(Ordering::Relaxed)))
    }

    /// Records that a spent window found a completion.
    pub(crate) fn record_found(&self) {
        self.backoff.hit();
    }

    /// Records that a spent window ended empty, at `now`.
    pub(crate) fn record_empty(&self, now: Instant) {
        self.missed_at
            .store(self.nanos_since_epoch(now), Ordering::Relaxed);
        self.backoff.miss();
    }

    /// Records a completion found without spinning: if it is the first since an empty window and
    /// came soon enough, the window grows to have caught it. Reads the clock only then.
    pub(crate) fn record_late(&self) {
        if self.missed_at.load(Ordering::Relaxed) != 0 {
            self.record_late_at(Instant::now());
        }
    }

    fn record_late_at(&self, now: Instant) {
        let missed_at = self.missed_at.swap(0, Ordering::Relaxed);
        if missed_at == 0 {
            return;
        }
        let late = self.nanos_since_epoch(now).saturating_sub(missed_at);
        let needed = self.window.load(Ordering::Relaxed).saturating_add(late);
        if needed > self.max {
            self.window.store(self.base, Ordering::Relaxed);
            return;
        }
        let grown = needed.saturating_add(needed / 4).min(self.max);
        self.window.store(grown, Ordering::Relaxed);
        // A longer window would have found it: not a miss.
        self.backoff.forgive();
    }

    /// Nanoseconds from the policy's creation to `now`, at least 1 (0 means "no miss").
    fn nanos_since_epoch(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.epoch).as_nanos())
            .unwrap_or(u64::MAX)
            .max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::super::miss_backoff::MAX_MISSES;
    use super::*;

    const BASE: Duration = Duration::from_micros(10);

    /// How many waits in a row skip spinning from now on.
    fn skipped(policy: &SpinPolicy) -> u32 {
        let mut n = 0;
        while policy.window().is_none() {
            n += 1;
            assert!(n < 1 << (MAX_MISSES - 1), "more waits skipped than the cap");
        }
        n
    }

    /// An empty window ending `at` after the policy's creation.
    fn empty_at(policy: &SpinPolicy, at: Duration) {
        policy.record_empty(policy.epoch + at);
    }

    fn late_at(policy: &SpinPolicy, at: Duration) {
        policy.record_late_at(policy.epoch + at);
    }

    #[test]
    fn spins_the_configured_window_while_windows_find_completions() {
        let policy = SpinPolicy::new(BASE);
        for _ in 0..100 {
            assert_eq!(policy.window(), Some(BASE));
            policy.record_found();
        }
    }

    #[test]
    fn a_zero_window_never_spins() {
        let policy = SpinPolicy::new(Duration::ZERO);
        assert_eq!(policy.window(), None);
        policy.record_found();
        assert_eq!(policy.window(), None);
    }

    #[test]
    fn a_window_that_finds_a_completion_resets_the_backoff() {
        let policy = SpinPolicy::new(BASE);
        for i in 0..4 {
            empty_at(&policy, Duration::from_millis(i + 1));
            skipped(&policy);
        }
        policy.record_found();
        assert_eq!(skipped(&policy), 0);
        empty_at(&policy, Duration::from_millis(10));
        assert_eq!(skipped(&policy), 0, "one empty window is not a pattern");
        empty_at(&policy, Duration::from_millis(11));
        assert_eq!(skipped(&policy), 1, "the backoff starts over");
    }

    #[test]
    fn a_completion_soon_after_an_empty_window_grows_the_window_to_catch_it() {
        let policy = SpinPolicy::new(BASE);
        for i in 0..3 {
            empty_at(&policy, Duration::from_millis(i + 1));
        }
        // 20 µs late with a 10 µs window: 30 µs would have caught it, and a quarter more.
        late_at(&policy, Duration::from_micros(3020));
        assert_eq!(skipped(&policy), 0, "the misses are forgiven");
        assert_eq!(policy.window(), Some(Duration::from_nanos(37_500)));
        // Only the first completion after the miss counts.
        late_at(&policy, Duration::from_micros(3040));
        assert_eq!(policy.window(), Some(Duration::from_nanos(37_500)));
    }

    #[test]
    fn the_window_grows_to_at_most_eight_times_the_configured_one() {
        let policy = SpinPolicy::new(BASE);
        empty_at(&policy, Duration::from_millis(1));
        late_at(&policy, Duration::from_micros(1065));
        assert_eq!(policy.window(), Some(BASE * 8));
    }

    #[test]
    fn a_fixed_window_does_not_grow_and_late_completions_stay_misses() {
        let policy = SpinPolicy::fixed(BASE);
        empty_at(&policy, Duration::from_millis(1));
        late_at(&policy, Duration::from_micros(1005));
        assert_eq!(policy.window(), Some(BASE));
        empty_at(&policy, Duration::from_millis(2));
        assert_eq!(skipped(&policy), 1, "two empty windows in a row");
    }

    #[test]
    fn a_completion_later_than_the_longest_window_resets_it_and_stays_a_miss() {
        let policy = SpinPolicy::new(BASE);
        empty_at(&policy, Duration::from_millis(1));
        late_at(&policy, Duration::from_micros(1020));
        assert!(policy.window().is_some_and(|w| w > BASE));
        empty_at(&policy, Duration::from_millis(2));
        late_at(&policy, Duration::from_millis(3));
        assert_eq!(policy.window(), Some(BASE));
        empty_at(&policy, Duration::from_millis(4));
        assert_eq!(skipped(&policy), 1, "two empty windows in a row");
    }
}
