//! [`SendOrder`]: selective signaling for a send queue of slots whose work requests complete in
//! the order they were posted (a reliable-connection send queue). Only some sends ask for a
//! completion; one completion frees its own slot and every slot posted before it, since those
//! are done too. Failed and flushed work requests complete whether signaled or not, so each
//! of those frees its slot the same way.

use std::collections::VecDeque;

/// The posting order of a send queue's slots and how many sends went unsignaled since the last
/// signaled one. Kept under the queue's lock, beside its [`Slots`](crate::cm::Slots).
#[derive(Debug, Default)]
pub(crate) struct SendOrder {
    /// Slots posted and not yet known to be done, oldest first.
    posted: VecDeque<usize>,
    /// Sends posted unsignaled since the last signaled one.
    unsignaled: usize,
}

impl SendOrder {
    /// Whether the send about to be posted asks for a completion: one that `must` (its caller
    /// waits for that completion), every `interval`-th, and the one that takes the last free slot
    /// (`free_left == 0` after taking it), so that a sender waiting for a slot always has a
    /// completion coming.
    pub(crate) fn signal(&self, must: bool, interval: usize, free_left: usize) -> bool {
        must || free_left == 0 || self.unsignaled + 1 >= interval
    }

    /// Records that `slot` was posted, `signaled` or not.
    pub(crate) fn posted(&mut self, slot: usize, signaled: bool) {
        self.posted.push_back(slot);
        self.unsignaled = if signaled { 0 } else { self.unsignaled + 1 };
    }

    /// Whether the last send posted asked for no completion: waiting for every send to be done
    /// then needs a signaled one after it.
    pub(crate) fn ends_unsignaled(&self) -> bool {
        self.unsignaled > 0
    }

    /// Takes the slots that the completion of `slot` ends, oldest first, `slot` last; none when
    /// `slot` is not posted (a completion the queue does not know of frees nothing).
    pub(crate) fn complete(
        &mut self,
        slot: usize,
    ) -> std::collections::vec_deque::Drain<'_, usize> {
        let end = self
            .posted
            .iter()
            .position(|&posted| posted == slot)
            .map_or(0, |at| at + 1);
        if end == self.posted.len() {
            // Everything posted is done: nothing unsignaled is left behind it.
            self.unsignaled = 0;
        }
        self.posted.drain(..end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_interval_th_and_the_last_free_slot_are_signaled() {
        let mut order = SendOrder::default();
        let mut signaled = Vec::new();
        for slot in 0..8 {
            let free_left = 7 - slot;
            let signal = order.signal(false, 4, free_left);
            order.posted(slot, signal);
            signaled.push(signal);
        }
        assert_eq!(
            signaled,
            [false, false, false, true, false, false, false, true]
        );
        assert!(!order.ends_unsignaled());
        assert!(order.signal(true, 4, 3), "a send that must be signaled is");
    }

    #[test]
    fn a_completion_frees_its_slot_and_every_earlier_one() {
        let mut order = SendOrder::default();
        for slot in [5, 2, 7, 1] {
            order.posted(slot, false);
        }
        assert!(order.ends_unsignaled());
        assert_eq!(order.complete(7).collect::<Vec<_>>(), [5, 2, 7]);
        assert!(
            order.ends_unsignaled(),
            "slot 1 is still posted, unsignaled"
        );
        // A completion for a slot that is not posted frees nothing.
        assert_eq!(order.complete(7).count(), 0);
        assert_eq!(order.complete(3).count(), 0);
        assert_eq!(order.complete(1).collect::<Vec<_>>(), [1]);
        assert!(!order.ends_unsignaled());
    }
}
