//! Work-request ids for the sends the core plans, and the FIFO that matches completions.
//!
//! C encodes the message word in the wr_id. We keep what each outstanding send was in a FIFO
//! instead and put a tag and a serial number in the wr_id. Not every send is signaled (see
//! `Sender::take_signal`): an RC send queue completes in post order, so a completion means
//! every send posted before it is done too, and it releases the FIFO up to and including its
//! entry. A completion for a send that is not outstanding (a driver bug) is caught instead of
//! silently corrupting the ring accounting.

use std::collections::VecDeque;

use super::error::ProtoError;
use super::plan::ControlKind;

/// Bit 63 marks receive work requests (as in C); the core never produces it for sends, so a
/// driver can post its receives with any id that has this bit set.
pub(crate) const WR_ID_RECV_FLAG: u64 = 1 << 63;

const TAG_SHIFT: u32 = 56;
const TAG_DATA: u64 = 0x01 << TAG_SHIFT;
const TAG_CONTROL: u64 = 0x02 << TAG_SHIFT;
const TAG_WINDOW: u64 = 0x03 << TAG_SHIFT;

/// What an outstanding send was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendKind {
    /// A data chunk of `len` bytes (charged to the send ring and one data SQ entry).
    Data { len: u32 },
    /// A control message (charged to one control slot).
    Control(ControlKind),
    /// A bind of the window over receive-ring half `half` (zero-copy reads).
    Bind { half: usize },
    /// A local invalidation of the window key `key` over half `half` (zero-copy reads).
    Invalidate { half: usize, key: u32 },
}

/// Outstanding sends in post order.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendQueue {
    next_serial: u32,
    fifo: VecDeque<(u64, SendKind)>,
}

impl SendQueue {
    /// Record a new send and return its wr_id.
    pub(crate) fn push(&mut self, kind: SendKind) -> u64 {
        let tag = match kind {
            SendKind::Data { .. } => TAG_DATA,
            SendKind::Control(_) => TAG_CONTROL,
            SendKind::Bind { .. } | SendKind::Invalidate { .. } => TAG_WINDOW,
        };
        let wr_id = tag | u64::from(self.next_serial);
        self.next_serial = self.next_serial.wrapping_add(1);
        self.fifo.push_back((wr_id, kind));
        wr_id
    }

    /// Match a completion with an outstanding send and release it and every send posted
    /// before it (completed in order, unsignaled); returns them, oldest first.
    pub(crate) fn complete_through(
        &mut self,
        wr_id: u64,
    ) -> Result<std::collections::vec_deque::Drain<'_, (u64, SendKind)>, ProtoError> {
        let n = self.completed_by(wr_id)?;
        Ok(self.fifo.drain(..n))
    }

    /// How many sends a completion for `wr_id` completes (it and every send before it).
    pub(crate) fn completed_by(&self, wr_id: u64) -> Result<usize, ProtoError> {
        let Some(&(oldest, _)) = self.fifo.front() else {
            return Err(ProtoError::usage(format!(
                "send completion for wr_id {wr_id:#x}, but no send is outstanding"
            )));
        };
        // Serials are consecutive in the FIFO, so the entry's position follows from its serial.
        let pos = (wr_id as u32).wrapping_sub(oldest as u32) as usize;
        match self.fifo.get(pos) {
            Some(&(id, _)) if id == wr_id => Ok(pos + 1),
            _ => Err(ProtoError::usage(format!(
                "send completion for wr_id {wr_id:#x}, which is not outstanding (the oldest \
                 outstanding send is {oldest:#x}; sends must be posted in the order planned)"
            ))),
        }
    }

    /// Whether `wr_id` is still outstanding. Serials are consecutive in the FIFO, so its
    /// position follows from its serial.
    pub(crate) fn is_outstanding(&self, wr_id: u64) -> bool {
        let Some(&(oldest, _)) = self.fifo.front() else {
            return false;
        };
        let pos = (wr_id as u32).wrapping_sub(oldest as u32) as usize;
        self.fifo.get(pos).is_some_and(|&(id, _)| id == wr_id)
    }

    /// Sends posted and not yet completed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.fifo.len()
    }

    /// Whether every send has completed.
    pub(crate) fn is_empty(&self) -> bool {
        self.fifo.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completions_match_in_order() {
        let mut q = SendQueue::default();
        let a = q.push(SendKind::Data { len: 5 });
        let b = q.push(SendKind::Control(ControlKind::Credits { limit: 3 }));
        assert_eq!(a & WR_ID_RECV_FLAG, 0);
        assert_ne!(a, b);
        assert_eq!(q.len(), 2);
        let kinds = |q: &mut SendQueue, id| {
            q.complete_through(id)
                .map(|d| d.map(|(_, k)| k).collect::<Vec<_>>())
        };
        assert_eq!(kinds(&mut q, a).unwrap(), [SendKind::Data { len: 5 }]);
        assert_eq!(
            kinds(&mut q, b).unwrap(),
            [SendKind::Control(ControlKind::Credits { limit: 3 })]
        );
        assert!(q.is_empty());
        assert!(kinds(&mut q, b).is_err());
    }

    #[test]
    fn a_completion_releases_every_earlier_send() {
        let mut q = SendQueue::default();
        let a = q.push(SendKind::Data { len: 1 });
        let b = q.push(SendKind::Data { len: 2 });
        let c = q.push(SendKind::Data { len: 3 });
        let released: Vec<_> = q.complete_through(b).unwrap().map(|(id, _)| id).collect();
        assert_eq!(released, [a, b]);
        // Already released, or never posted: a driver bug, reported.
        assert!(q.complete_through(a).is_err());
        assert!(q.complete_through(c + 1).is_err());
        assert_eq!(q.len(), 1);
        assert_eq!(q.complete_through(c).unwrap().count(), 1);
    }
}
