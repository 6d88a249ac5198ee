//! Warnings that a peer can cause (a failed or rejected connection request), limited so that a
//! flood of bad requests cannot flood the logs: at most [`PER_WINDOW`] each [`WINDOW`] are
//! warnings; the rest go to `debug`, and the next warning says how many were held back.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Warnings let through per window.
pub(crate) const PER_WINDOW: u32 = 10;
/// The window.
pub(crate) const WINDOW: Duration = Duration::from_secs(10);

/// The process's budget of peer-caused warnings.
pub(crate) static PEER_WARNINGS: WarningBudget = WarningBudget::new();

/// A budget of warnings per window.
#[derive(Debug)]
pub(crate) struct WarningBudget {
    window: Mutex<Window>,
}

#[derive(Debug)]
struct Window {
    start: Option<Instant>,
    logged: u32,
    /// Held back since the last warning that went out.
    held_back: u64,
}

impl WarningBudget {
    pub(crate) const fn new() -> Self {
        WarningBudget {
            window: Mutex::new(Window {
                start: None,
                logged: 0,
                held_back: 0,
            }),
        }
    }

    /// Whether a warning may go out at `now`: `Some(n)` with the number held back since the
    /// last one that did, `None` when it is to be logged at `debug` instead.
    pub(crate) fn admit(&self, now: Instant) -> Option<u64> {
        let mut window = self.window.lock().unwrap_or_else(PoisonError::into_inner);
        if window
            .start
            .is_none_or(|start| now.saturating_duration_since(start) >= WINDOW)
        {
            window.start = Some(now);
            window.logged = 0;
        }
        if window.logged < PER_WINDOW {
            window.logged += 1;
            Some(std::mem::take(&mut window.held_back))
        } else {
            window.held_back += 1;
            None
        }
    }
}

/// Logs a warning that a peer caused, within [`PEER_WARNINGS`]' budget (at `debug` beyond it).
macro_rules! peer_warning {
    (parent: $parent:expr, $($field:tt)*) => {
        match $crate::cm::peer_warnings::PEER_WARNINGS.admit(std::time::Instant::now()) {
            Some(0) => tracing::warn!(parent: $parent, $($field)*),
            Some(held_back) => tracing::warn!(parent: $parent, held_back, $($field)*),
            None => tracing::debug!(parent: $parent, $($field)*),
        }
    };
    ($($field:tt)*) => {
        match $crate::cm::peer_warnings::PEER_WARNINGS.admit(std::time::Instant::now()) {
            Some(0) => tracing::warn!($($field)*),
            Some(held_back) => tracing::warn!(held_back, $($field)*),
            None => tracing::debug!($($field)*),
        }
    };
}
pub(crate) use peer_warning;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_lets_through_its_budget_then_counts_what_it_holds_back() {
        let budget = WarningBudget::new();
        let t0 = Instant::now();
        for _ in 0..PER_WINDOW {
            assert_eq!(budget.admit(t0), Some(0));
        }
        for _ in 0..25 {
            assert_eq!(budget.admit(t0 + WINDOW / 2), None);
        }
        // The next window's first warning says how many were held back.
        assert_eq!(budget.admit(t0 + WINDOW), Some(25));
        assert_eq!(budget.admit(t0 + WINDOW), Some(0));
    }
}
