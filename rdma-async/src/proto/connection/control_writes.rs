//! Outgoing control messages: whether one is due (a CTRL message, credits, a grant of a
//! receive-ring half) and the [`ControlWrite`] that sends it from a control slot.

use super::Connection;
use crate::proto::config::RS_MAX_CTRL_MSG;
use crate::proto::imm::{CtrlCode, Op};
use crate::proto::plan::{ControlKind, ControlWrite, WindowBind};
use crate::proto::receiver::CreditUpdate;
use crate::proto::wr::SendKind;

impl Connection {
    /// Whether a control message is due (a CTRL message, credits or a buffer grant), free
    /// control slot or not: [`Self::poll_control`] has nothing to give without one.
    #[inline]
    pub(crate) fn control_wanted(&self) -> bool {
        // After our DISCONNECT the peer will not send again; credits would be wasted.
        self.state.connected
            && (self.control.has_pending()
                || (!self.control.disconnect_queued() && self.receiver.credit_update_due()))
    }

    /// Whether [`Self::poll_control`] has a message now: one is due and a control slot is
    /// free. A driver asks this before it gathers anything to post: a credit update is often
    /// due while all four slots are in flight, and then there is nothing to do.
    #[inline]
    pub(crate) fn control_ready(&self) -> bool {
        self.control.slot_free() && self.control_wanted()
    }

    /// The next control message to post, if one is due and a control slot is free. Call it
    /// after every `handle_*`, `consume` and `shutdown_write`/`close` until it returns `None`.
    pub(crate) fn poll_control(&mut self) -> Option<ControlWrite> {
        if !self.control_ready() {
            return None;
        }
        if let Some(code) = self.control.pop_pending() {
            return Some(self.plan_ctrl(code));
        }
        let (bind, kind, payload, remote_addr, rkey, imm) = match self.receiver.take_credit_update()
        {
            CreditUpdate::Sgl {
                slot,
                payload,
                remote_addr,
                rkey,
                limit,
                bind,
            } => (
                bind,
                ControlKind::SglUpdate { slot, limit },
                Some(payload),
                remote_addr,
                rkey,
                Op::Sgl(limit).encode(),
            ),
            CreditUpdate::Credits { limit } => (
                None,
                ControlKind::Credits { limit },
                None,
                0,
                0,
                Op::Sgl(limit).encode(),
            ),
        };
        // The bind goes first in the send queue, so the window is bound (under the key the
        // update names) before the peer can learn it.
        let bind = bind.map(|b| WindowBind {
            wr_id: self.sends.push(SendKind::Bind { half: b.half }),
            half: b.half,
            rkey: b.rkey,
        });
        let mut write = self.plan_control(kind, Some(imm), payload, remote_addr, rkey);
        write.bind = bind;
        Some(write)
    }

    fn plan_ctrl(&mut self, code: CtrlCode) -> ControlWrite {
        let imm = match code {
            // C posts keepalives as plain RDMA WRITEs: the peer never sees them.
            CtrlCode::Keepalive => None,
            _ => Some(Op::Ctrl(code).encode()),
        };
        self.plan_control(ControlKind::Ctrl(code), imm, None, 0, 0)
    }

    fn plan_control(
        &mut self,
        kind: ControlKind,
        imm: Option<u32>,
        payload: Option<[u8; 16]>,
        remote_addr: u64,
        rkey: u32,
    ) -> ControlWrite {
        let ctrl_slot = self.control.take_slot();
        let wr_id = self.sends.push(SendKind::Control(kind));
        // A credit or buffer update goes unsignaled unless it takes the last free control
        // slot: the next control message then waits for a completion, and this one's (sends
        // complete in order) frees every slot. Until then any later signaled send frees them.
        // After a local shutdown no data write will come to complete it, and
        // `all_sends_done` must become true: signaled. CTRL messages are rare, and a
        // DISCONNECT's completion ends the connection.
        let signaled = matches!(kind, ControlKind::Ctrl(_))
            || !self.state.writable
            || !self.control.slot_free();
        ControlWrite {
            wr_id,
            kind,
            signaled,
            imm,
            payload,
            remote_addr,
            rkey,
            inline: self.config.inline_size() as usize >= RS_MAX_CTRL_MSG,
            ctrl_slot,
            bind: None,
        }
    }

    /// Whether a control message is due but every control slot is taken: it waits for a send
    /// completion (the simulator checks one is coming).
    #[cfg(test)]
    pub(crate) fn control_waiting_for_slot(&self) -> bool {
        self.state.connected
            && !self.control.slot_free()
            && (self.control.has_pending()
                || (!self.control.disconnect_queued() && self.receiver.credit_update_due()))
    }
}
