//! Whether an operation alone on its queue first lets the other tasks ready on its thread run
//! ([`LoneYield`]), and how it does ([`run_ready_tasks`]).
//!
//! Many tasks each doing one operation at a time would otherwise run one at a time: the lone
//! operation spins until it completes, and the others cannot post beside it meanwhile. But a
//! yield costs a pass through the scheduler (about 600 user-space instructions per operation at
//! queue depth 1, `scripts/count-instructions`), wasted where one task drives the queue. So
//! the yield is a probe: when one found that nobody posted beside it, the next
//! [`SKIP_AFTER_IDLE_YIELD`] lone operations spin at once; when one found company, lone
//! operations keep yielding.

use std::sync::atomic::{AtomicU32, Ordering};
use std::task::{Context, Poll};

/// Lone operations that spin without yielding after a yield that found nobody posting beside
/// it. It bounds how long tasks that start posting together run one at a time (that many round
/// trips) against the cost of probing a queue one task drives (one yield in this many + 1).
pub(crate) const SKIP_AFTER_IDLE_YIELD: u32 = 64;

/// The probe state of one work queue's lone operations. Relaxed atomics: a stale read only
/// moves one yield, and the operations are otherwise synchronized by the queue's slots.
#[derive(Debug, Default)]
pub(crate) struct LoneYield {
    /// Lone operations left to spin without yielding.
    skip: AtomicU32,
}

impl LoneYield {
    /// Whether this lone operation yields first; counts one skipped yield if not.
    pub(crate) fn should_yield(&self) -> bool {
        match self.skip.load(Ordering::Relaxed) {
            0 => true,
            left => {
                self.skip.store(left - 1, Ordering::Relaxed);
                false
            }
        }
    }

    /// After a yield: whether some other operation posted beside the yielding one.
    pub(crate) fn yielded(&self, joined: bool) {
        let skip = if joined { 0 } else { SKIP_AFTER_IDLE_YIELD };
        self.skip.store(skip, Ordering::Relaxed);
    }
}

/// Lets the tasks that are ready to run on this thread run, once: the task wakes itself and
/// returns `Pending` (the caller returns what this returns), which Tokio's schedulers treat as
/// a yield (a task goes to the back of its worker's run queue, and wakes no other worker while
/// it is the only one there); its next poll is its turn after them. Unlike
/// `tokio::task::yield_now`, it does not wait for the I/O driver to be polled first, which
/// costs a system call where no other task is ready. A poll function, not a future: the
/// operations that yield are hand-written state machines.
pub(crate) fn run_ready_tasks<T>(cx: &Context<'_>) -> Poll<T> {
    cx.waker().wake_by_ref();
    Poll::Pending
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_queue_driven_by_one_task_yields_once_in_skip_plus_one_operations() {
        let probe = LoneYield::default();
        let mut yields = 0;
        for _ in 0..3 * (SKIP_AFTER_IDLE_YIELD + 1) {
            if probe.should_yield() {
                yields += 1;
                probe.yielded(false);
            }
        }
        assert_eq!(yields, 3);
    }

    #[test]
    fn lone_operations_keep_yielding_while_others_post_beside_them() {
        let probe = LoneYield::default();
        for _ in 0..10 {
            assert!(probe.should_yield());
            probe.yielded(true);
        }
    }

    #[test]
    fn company_after_an_idle_probe_is_found_at_the_next_probe() {
        let probe = LoneYield::default();
        assert!(probe.should_yield());
        probe.yielded(false);
        let skipped = std::iter::repeat_with(|| probe.should_yield())
            .take_while(|yields| !yields)
            .count();
        assert_eq!(skipped, SKIP_AFTER_IDLE_YIELD as usize);
        probe.yielded(true);
        assert!(probe.should_yield());
    }
}
