//! Control-message bookkeeping: the 4 control slots and the queue of CTRL messages waiting for
//! one (rsocket-protocol.md §2.5, §3.2).
//!
//! Credit/SGL updates, SHUTDOWN, DISCONNECT and keepalives each hold a slot from post until
//! send completion. The slots are separate from the data send-queue entries (`sq_size - 4`), so
//! credits can always flow even when data fills the send queue.

use std::collections::VecDeque;

use super::config::RS_QP_CTRL_SIZE;
use super::imm::CtrlCode;

/// Control slots and pending CTRL messages.
#[derive(Debug, Clone, Default)]
pub(crate) struct Control {
    /// Control messages posted so far (C's `ctrl_seqno`); picks the registered buffer slot.
    seqno: u32,
    in_flight: u32,
    pending: VecDeque<CtrlCode>,
    disconnect_queued: bool,
}

impl Control {
    /// Whether a control message may be posted now.
    #[inline]
    pub(crate) fn slot_free(&self) -> bool {
        self.in_flight < RS_QP_CTRL_SIZE
    }

    /// Take a slot for a message being posted; returns its buffer index `0..4`.
    pub(crate) fn take_slot(&mut self) -> usize {
        let slot = (self.seqno % RS_QP_CTRL_SIZE) as usize;
        self.seqno = self.seqno.wrapping_add(1);
        self.in_flight += 1;
        slot
    }

    /// A control message completed.
    pub(crate) fn release(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// Control messages in flight.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> u32 {
        self.in_flight
    }

    /// Queue a CTRL message to go out when a slot is free.
    pub(crate) fn queue(&mut self, code: CtrlCode) {
        if code == CtrlCode::Disconnect {
            if self.disconnect_queued {
                return;
            }
            self.disconnect_queued = true;
        }
        self.pending.push_back(code);
    }

    /// The next queued CTRL message, if any.
    pub(crate) fn pop_pending(&mut self) -> Option<CtrlCode> {
        self.pending.pop_front()
    }

    /// Whether a CTRL message is waiting for a slot.
    #[inline]
    pub(crate) fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// Whether our SHUTDOWN or DISCONNECT is still queued (it waits for a free slot). A queued
    /// SHUTDOWN becomes a DISCONNECT: the peer's own SHUTDOWN came, so reading is over too.
    pub(crate) fn close_queued_as_disconnect(&mut self) -> bool {
        let Some(at) = self
            .pending
            .iter()
            .position(|c| matches!(c, CtrlCode::Shutdown | CtrlCode::Disconnect))
        else {
            return false;
        };
        if self.pending[at] == CtrlCode::Shutdown {
            if self.disconnect_queued {
                self.pending.remove(at);
            } else {
                self.pending[at] = CtrlCode::Disconnect;
                self.disconnect_queued = true;
            }
        }
        true
    }

    /// Drop queued messages (the connection is gone; nobody would receive them).
    pub(crate) fn clear_pending(&mut self) {
        self.pending.clear();
    }

    /// Whether we have queued (or sent) a DISCONNECT: from then on no credits are sent.
    #[inline]
    pub(crate) fn disconnect_queued(&self) -> bool {
        self.disconnect_queued
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn four_slots_cycle() {
        let mut c = Control::default();
        let slots: Vec<_> = (0..4).map(|_| c.take_slot()).collect();
        assert_eq!(slots, [0, 1, 2, 3]);
        assert!(!c.slot_free());
        c.release();
        assert!(c.slot_free());
        assert_eq!(c.take_slot(), 0);
        assert_eq!(c.in_flight(), 4);
    }

    #[test]
    fn one_disconnect_only() {
        let mut c = Control::default();
        c.queue(CtrlCode::Shutdown);
        c.queue(CtrlCode::Disconnect);
        c.queue(CtrlCode::Disconnect);
        assert!(c.disconnect_queued());
        assert_eq!(c.pop_pending(), Some(CtrlCode::Shutdown));
        assert_eq!(c.pop_pending(), Some(CtrlCode::Disconnect));
        assert!(!c.has_pending());
        c.queue(CtrlCode::Keepalive);
        c.clear_pending();
        assert_eq!(c.pop_pending(), None);
    }
}
