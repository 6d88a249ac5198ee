//! Caller memory on an `Endpoint`: sends straight from a registered region, and receives into
//! pool buffers handed out as `Bytes`, both without a copy.

use std::io;
use std::ops::RangeBounds;

use bytes::Bytes;

use super::{Endpoint, RECV_BUFFER, SendSlots};
use crate::device::BufferPool;
use crate::error;
use crate::memory::sealed::{Carried, SealedRegion};
use crate::memory::{LocalRegion, RegisteredBytes, span};
use crate::verbs::{Opcode, OwnedBufferQueuePair, Payload, Segment, UserBuffer, WorkRequest};

/// A region whose send completed, waiting for its `send_region` call to take it.
#[derive(Debug)]
pub(super) struct SentRegion {
    id: u64,
    buffer: UserBuffer,
    ok: bool,
}

/// A message received into a pool buffer: `Bytes` over its first `len` bytes, returning the
/// buffer to its pool when the last `Bytes` goes.
struct ReceivedMessage {
    region: LocalRegion,
    len: usize,
}

impl AsRef<[u8]> for ReceivedMessage {
    fn as_ref(&self) -> &[u8] {
        &self.region[..self.len]
    }
}

/// The message in a pool buffer whose receive completed.
pub(super) fn received(buffer: UserBuffer, len: usize) -> Bytes {
    let region = LocalRegion::new(buffer);
    let len = len.min(region.len());
    Bytes::from_owner(ReceivedMessage { region, len })
}

/// Posts receive `slot`: into a buffer of `pool` when it has one free (its attach id is returned),
/// else into the slot's part of the endpoint's receive buffer.
pub(super) fn post_receive(
    qp: &OwnedBufferQueuePair,
    pool: Option<&BufferPool>,
    slot: usize,
    max: usize,
) -> io::Result<Option<u64>> {
    if let Some(region) = pool.and_then(|pool| pool.try_get(max).ok()) {
        let id = qp.attach(region.into_user().0).map_err(|(e, _)| e)?;
        return match qp.post_recv_attached(slot as u64, id, max) {
            Ok(()) => Ok(Some(id)),
            Err(e) => {
                // Nothing was posted: the buffer goes back to the pool.
                drop(qp.reclaim(id));
                Err(e)
            }
        };
    }
    qp.post_recv(
        slot as u64,
        Segment {
            buffer: RECV_BUFFER,
            offset: slot * max,
            len: max,
        },
    )?;
    Ok(None)
}

impl Endpoint {
    /// Sends `range` of a registered region as one message, without copying it: the device
    /// reads the region itself (a [`BufferPool`] buffer, say). Returns once the send completed
    /// and hands the region back.
    ///
    /// The region must be registered in the endpoint's device context. While the call waits
    /// for its completion it holds the endpoint's send side, so other sends wait behind it.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a range outside the region, longer than `max_message_size`, or a
    /// region of another context; the connection's error, as for [`Self::send`]. The region
    /// comes back (`Some`) with any result, except when the connection closed before the device
    /// was done with it: the endpoint then frees it once the device is (never earlier).
    ///
    /// # Cancel safety
    ///
    /// If the future is dropped after the send was posted, the message is still sent and the
    /// region is freed once the device is done with it; dropped before, nothing was sent and the
    /// region is dropped.
    pub async fn send_region<B: RegisteredBytes>(
        &self,
        region: B,
        range: impl RangeBounds<usize>,
    ) -> (io::Result<()>, Option<B>) {
        let (offset, len) = match span(region.len(), range) {
            Ok(span) => span,
            Err(e) => return (Err(e), Some(region)),
        };
        if len > self.max_message_size {
            let e = error::invalid_input(format!(
                "message of {len} bytes exceeds the endpoint's max_message_size of {}",
                self.max_message_size
            ));
            return (Err(e), Some(region));
        }
        let id = match self.qp.attach(region.into_user().0) {
            Ok(id) => id,
            Err((e, buffer)) => return (Err(e), Some(B::from_user(Carried(buffer)))),
        };
        let mut unposted = Unposted {
            endpoint: self,
            id: Some(id),
        };
        let give_back = |buffer| Some(B::from_user(Carried(buffer)));
        let mut slots = self.send.lock().await;
        let reap =
            &mut |s: &mut SendSlots, wc: &crate::verbs::WorkCompletion| self.reap_send(s, wc);
        let slot = match self
            .send
            .take_free(&mut slots, Some(&self.link), reap)
            .await
        {
            Ok(slot) => slot,
            Err(e) => return (Err(e), self.qp.reclaim(id).and_then(give_back)),
        };
        let req = WorkRequest {
            wr_id: slot as u64,
            opcode: Opcode::Send { imm: None },
            payload: Payload::Attached { id, offset, len },
            signaled: true,
        };
        // Signaled: this call waits for its completion to give the region back.
        if let Err(e) = self.post_send(&mut slots, slot, req, true) {
            return (Err(e), self.qp.reclaim(id).and_then(give_back));
        }
        slots.held[slot] = Some(id);
        // Posted: from here a dropped future leaves the region to the completion.
        unposted.id = None;
        let mut abandon = Abandon {
            endpoint: self,
            id: Some(id),
        };
        let sent = self
            .send
            .take_ready(&mut slots, Some(&self.link), reap, |sent| sent.id == id)
            .await;
        match sent {
            Ok(sent) => {
                abandon.id = None;
                let result = if sent.ok {
                    Ok(())
                } else {
                    Err(self
                        .send
                        .error()
                        .report()
                        .unwrap_or_else(|| io::Error::other("the send from the region failed")))
                };
                (result, give_back(sent.buffer))
            }
            // Closed first: the completion frees the region when it comes.
            Err(e) => (Err(e), None),
        }
    }

    /// A region's send completed (`ok` or not): hand it to its caller, or free it when the
    /// caller is gone.
    pub(super) fn region_sent(&self, slots: &mut SendSlots, id: u64, ok: bool) {
        let Some(buffer) = self.qp.reclaim(id) else {
            return;
        };
        let abandoned = self
            .abandoned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(&id);
        if !abandoned {
            slots.ready.push_back(SentRegion { id, buffer, ok });
        }
    }
}

/// An attached region not posted yet: dropping the call takes it back (nothing reads it).
struct Unposted<'a> {
    endpoint: &'a Endpoint,
    id: Option<u64>,
}

impl Drop for Unposted<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            drop(self.endpoint.qp.reclaim(id));
        }
    }
}

/// A posted region whose caller may go before its completion: then the completion frees it,
/// or, if it already came, the ready entry is dropped here.
struct Abandon<'a> {
    endpoint: &'a Endpoint,
    id: Option<u64>,
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        let Some(id) = self.id else {
            return;
        };
        let endpoint = self.endpoint;
        if let Ok(mut slots) = endpoint.send.try_lock()
            && let Some(pos) = slots.ready.iter().position(|sent| sent.id == id)
        {
            slots.ready.remove(pos);
            return;
        }
        endpoint
            .abandoned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(id);
    }
}
