//! Sending on an [`Endpoint`]: a message copied into a slot of the send buffer (or inline),
//! the post that signals only some sends, and the reaping of their completions.

use std::io;

use super::{Endpoint, SEND_BUFFER, SendSlots};
use crate::error;
use crate::verbs::wc_error;
use crate::verbs::{Opcode, Payload, Segment, WorkCompletion, WorkRequest};

/// Every how many sends one is signaled, for a send queue `depth` deep: a quarter of the
/// queue, so that slots come back while the rest is still in flight, and at most 16 (as
/// `RStream`'s data writes), beyond which fewer completions save next to nothing.
pub(super) fn signal_interval(depth: u32) -> usize {
    (depth as usize / 4).clamp(1, 16)
}

/// The work request of a probe: a 0-byte RDMA write to address 0 with rkey 0, as rsockets'
/// keepalive, which the peer's device acknowledges without touching memory (no key is checked
/// for 0 bytes) and its application never sees.
pub(super) fn empty_write(slot: usize) -> WorkRequest<'static> {
    WorkRequest {
        wr_id: slot as u64,
        opcode: Opcode::Write {
            remote_addr: 0,
            rkey: 0,
            imm: None,
        },
        payload: Payload::Empty,
        signaled: true,
    }
}

impl Endpoint {
    /// Sends one message. Returns once it is handed to the device (like a socket write); waits
    /// only when `send_depth` sends are still in flight.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the message is longer than `max_message_size`; `BrokenPipe` once the
    /// connection is closed; `TimedOut` when the transport gave up reaching the peer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, the message was not sent.
    pub async fn send(&self, msg: &[u8]) -> io::Result<()> {
        if msg.len() > self.max_message_size {
            return Err(error::invalid_input(format!(
                "message of {} bytes exceeds the endpoint's max_message_size of {}",
                msg.len(),
                self.max_message_size
            )));
        }
        let mut slots = self.send.lock().await;
        let slot = self
            .send
            .take_free(&mut slots, Some(&self.link), &mut |s, wc| {
                self.reap_send(s, wc)
            })
            .await?;
        let offset = slot * self.max_message_size;
        if msg.len() > self.max_inline
            && let Err(e) = self.qp.buffer(SEND_BUFFER).write_at(offset, msg)
        {
            slots.free.push(slot);
            return Err(e);
        }
        let segment = [Segment {
            buffer: SEND_BUFFER,
            offset,
            len: msg.len(),
        }];
        let payload = if msg.len() <= self.max_inline && !msg.is_empty() {
            Payload::Inline(msg)
        } else if msg.is_empty() {
            Payload::Empty
        } else {
            Payload::Segments(&segment)
        };
        let req = WorkRequest {
            wr_id: slot as u64,
            opcode: Opcode::Send { imm: None },
            payload,
            signaled: false,
        };
        self.post_send(&mut slots, slot, req, false)
    }

    /// Posts `req` from send slot `slot` (just taken from the free ones), signaled when `must`
    /// be or when [`crate::reactor::SendOrder::signal`] says; a failed post frees the slot again.
    pub(super) fn post_send(
        &self,
        slots: &mut SendSlots,
        slot: usize,
        mut req: WorkRequest<'_>,
        must: bool,
    ) -> io::Result<()> {
        req.signaled = slots
            .order
            .signal(must, self.signal_interval, slots.free.len());
        if let Err(e) = self.qp.post(&req) {
            slots.free.push(slot);
            return Err(e);
        }
        slots.order.posted(slot, req.signaled);
        Ok(())
    }

    /// A send completed: its slot, and those of the sends posted before it (an RC send queue
    /// completes in order, so they are done and succeeded: a failed one completes on its own,
    /// first), are free again, and a region one of them sent from comes back; the first
    /// failure ends the connection.
    pub(super) fn reap_send(&self, slots: &mut SendSlots, wc: &WorkCompletion) {
        let slot = wc.wr_id as usize;
        #[cfg(rdma_async_hooks)]
        self.send_completions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut order = std::mem::take(&mut slots.order);
        for done in order.complete(slot) {
            let attached = slots.held.get_mut(done).and_then(Option::take);
            slots.release(done);
            if let Some(id) = attached {
                self.region_sent(slots, id, done != slot || wc.status.is_success());
            }
        }
        slots.order = order;
        if !wc.status.is_success() && !self.send.error().is_set() {
            let err = wc_error(wc, self.link.peer_addr(), true);
            tracing::debug!(parent: self.link.span(), error = %err, "send failed");
            self.send.error().set(err);
        }
    }
}
