//! Receiving on an [`Endpoint`]: taking the next message, probing a silent peer meanwhile, and
//! reaping receive completions (posting each slot again).

use std::io;

use bytes::Bytes;

use super::caller_memory::{self, post_receive};
use super::sending::empty_write;
use super::{Endpoint, RECV_BUFFER, RecvSlots, SendSlots};
use crate::verbs::wc_error;
use crate::verbs::{WcStatus, WorkCompletion};

impl Endpoint {
    /// Receives the next message.
    ///
    /// # Errors
    ///
    /// `ConnectionReset` once the peer disconnected and every message it sent before was
    /// received; `NotConnected` after [`Self::disconnect`]; `TimedOut` or other kinds when the
    /// transport failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is only taken when it is returned; one that arrived while the
    /// future was pending waits for the next call.
    pub async fn recv(&self) -> io::Result<Bytes> {
        let mut slots = self.recv.lock().await;
        let mut probes = self
            .keepalive
            .map(|t| tokio::time::interval_at(tokio::time::Instant::now() + t, t));
        let reap = &mut |s: &mut RecvSlots, wc: &WorkCompletion| self.reap_recv(s, wc);
        loop {
            let fill = self.recv.fill(&mut slots, Some(&self.link), reap);
            match &mut probes {
                None => break fill.await?,
                // `fill` is cancel safe: a probe restarts it without losing anything.
                Some(probes) => tokio::select! {
                    filled = fill => break filled?,
                    _ = probes.tick() => self.probe(),
                },
            }
        }
        // Messages that completed before a disconnect are taken before it is reported.
        Ok(slots.ready.pop_front().unwrap_or_default())
    }

    /// Posts a keepalive (a 0-byte RDMA write, to address 0 with rkey 0 as rsockets does) from a
    /// free send slot. A dead peer fails it, which moves the queue pair to the error state; the
    /// flushed receives then report that failure ([`Self::send_failure`]). With every slot in
    /// flight there is nothing to do: those sends notice a dead peer themselves.
    fn probe(&self) {
        let Ok(mut slots) = self.send.try_lock() else {
            return;
        };
        let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
        if self.send.reap_queued(&mut slots, reap).is_err() || self.send.error().is_set() {
            return;
        }
        let Some(slot) = slots.free.pop() else {
            return;
        };
        if let Err(e) = self.post_send(&mut slots, slot, empty_write(slot), true) {
            tracing::debug!(parent: self.link.span(), error = %e, "posting a keepalive failed");
        }
    }

    /// The send side's failure, reaping what already completed there (when no sender is busy
    /// with it): why the receives were flushed, if a send (or a keepalive) failed.
    fn send_failure(&self) -> Option<io::Error> {
        if let Ok(mut slots) = self.send.try_lock() {
            let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
            let _ = self.send.reap_queued(&mut slots, reap);
        }
        self.send.error().report()
    }

    /// A receive completed: take the message (the pool buffer it landed in, or a copy out of
    /// the receive buffer) and post the slot again.
    fn reap_recv(&self, slots: &mut RecvSlots, wc: &WorkCompletion) {
        let max = self.max_message_size;
        let slot = wc.wr_id as usize;
        // The completion was polled: the device is done with an attached buffer, whatever the
        // status.
        let attached = slots
            .held
            .get_mut(slot)
            .and_then(Option::take)
            .and_then(|id| self.qp.reclaim(id));
        if wc.status == WcStatus::FLUSH {
            // The queue pair is in the error state: after a disconnect the link reports it;
            // after a failed send (the peer timed out) nothing else would, so take its cause.
            if let Some(e) = self.send_failure() {
                self.recv.error().set(e);
            }
            return;
        }
        if !wc.status.is_success() {
            let err = wc_error(wc, self.link.peer_addr(), false);
            tracing::debug!(parent: self.link.span(), error = %err, "receive failed");
            self.recv.error().set(err);
            return;
        }
        // The device wrote at most the posted length; check the reported length anyway.
        let len = (wc.byte_len as usize).min(max);
        let msg = match attached {
            Some(buffer) => caller_memory::received(buffer, len),
            None => {
                // Copied straight into the new buffer, not zeroed first.
                let mut msg = Vec::with_capacity(len);
                if let Err(e) = self
                    .qp
                    .buffer(RECV_BUFFER)
                    .append_to(slot * max, len, &mut msg)
                {
                    self.recv.error().set(e);
                    return;
                }
                Bytes::from(msg)
            }
        };
        slots.ready.push_back(msg);
        match post_receive(&self.qp, self.recv_pool.as_ref(), slot, max) {
            Ok(held) => {
                if let Some(entry) = slots.held.get_mut(slot) {
                    *entry = held;
                }
            }
            Err(e) if !self.link.is_disconnected() => {
                // One receive fewer would fail one of the peer's later sends (receiver not
                // ready) and leave the endpoint's books wrong: end the connection, with this
                // cause. The rest of the batch is still reaped, so what arrived stays readable
                // first.
                tracing::warn!(parent: self.link.span(), error = %e, "posting a receive again failed; closing the connection");
                self.send
                    .error()
                    .set(io::Error::new(e.kind(), e.to_string()));
                self.recv.error().set(e);
                let _ = self.link.disconnect();
            }
            Err(_) => {}
        }
    }
}
