//! Zero-copy writes: a caller's registered buffer attached to the queue pair and sent from there.

use std::io;
use std::task::{Context, Poll, ready};

use crate::proto::{WriteCall, WriteError};
use crate::stream::region_write::{AttachedBuffer, RegionWrite};
use crate::stream::side_wakers::{Reading, Waiter};
use crate::verbs::Payload;

use super::{CoreState, StreamCore, StreamDevice};

impl StreamCore {
    /// Moves the write's buffer into the queue pair, sends as much of it as the peer's grants
    /// allow straight from there, waiting for more, and once all of it is posted waits for the
    /// device to be done with it: `op.buffer` then holds it again. On an error the buffer is
    /// back in `op.buffer` too, unless a failed `ibv_post_send` left it unknown whether the
    /// device still reads it (it then stays with the queue pair until the stream is dropped).
    pub(in crate::stream) fn poll_write_region(
        &self,
        cx: &mut Context<'_>,
        op: &mut RegionWrite,
    ) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        ready!(self.pump(&mut state, Some(cx), Reading::No))?;
        loop {
            // A buffer the device is done with comes back first: the next chunks attach it
            // again, under a new id.
            self.reclaim_attached(&mut state);
            if let Some(id) = op.attached
                && let Some(buffer) = state.returned.remove(&id)
            {
                op.buffer = Some(buffer);
                op.attached = None;
            }
            if op.failure.is_none() && op.remaining() > 0 {
                self.post_region(&mut state, op)?;
                self.reclaim_attached(&mut state);
                if let Some(id) = op.attached
                    && let Some(buffer) = state.returned.remove(&id)
                {
                    op.buffer = Some(buffer);
                    op.attached = None;
                }
            }
            if op.attached.is_none() {
                if let Some(e) = op.failure.take() {
                    return Poll::Ready(Err(e));
                }
                if op.remaining() == 0 {
                    return Poll::Ready(Ok(()));
                }
            } else if state.post_failed
                && let Some(e) = op.failure.take()
            {
                return Poll::Ready(Err(e));
            }
            let blocked = match state.conn.write_readiness() {
                Ok(()) if op.remaining() > 0 && op.failure.is_none() => continue,
                Err(WriteError::Blocked(reason)) if op.remaining() > 0 => Some(reason),
                _ => None,
            };
            if let Err(e) = ready!(self.wait_to_write(&mut state, cx, Waiter::Poll, blocked)) {
                // Once the connection is gone nothing more completes: handle what is queued;
                // a buffer still out after that stays with the queue pair.
                self.drain(&mut state)?;
                self.reclaim_attached(&mut state);
                if let Some(id) = op.attached
                    && let Some(buffer) = state.returned.remove(&id)
                {
                    op.buffer = Some(buffer);
                    op.attached = None;
                }
                return Poll::Ready(Err(op.failure.take().unwrap_or(e)));
            }
        }
    }

    /// Attaches the write's buffer to the queue pair (unless it already is) and posts as many of
    /// its chunks as the peer's grants allow, then the control messages due.
    /// Records a refusal of the protocol in `op.failure`.
    pub(super) fn post_region(
        &self,
        state: &mut CoreState,
        op: &mut RegionWrite,
    ) -> io::Result<()> {
        if let Err(WriteError::Blocked(_)) = state.conn.write_readiness() {
            return Ok(()); // nothing can be posted yet
        }
        let attach_id = match (op.attached, op.buffer.take()) {
            (Some(id), _) => id,
            (None, Some(buffer)) => match self.device.qp.attach(buffer) {
                Ok(id) => {
                    op.attached = Some(id);
                    id
                }
                Err((err, buffer)) => {
                    op.buffer = Some(buffer);
                    op.failure = Some(err);
                    return Ok(());
                }
            },
            (None, None) => return Ok(()),
        };
        let mut last_send = None;
        let mut call = WriteCall::largest();
        let mut chain = self.device.chain();
        while op.remaining() > 0 {
            let write = match state.conn.prepare_external_write(&mut call, op.remaining()) {
                Ok(write) => write,
                Err(WriteError::Blocked(_)) => break,
                Err(WriteError::Closed) => {
                    op.failure = Some(self.failure(state, None));
                    break;
                }
                Err(WriteError::Failed(e)) => {
                    op.failure = Some(self.failure(state, Some(e)));
                    break;
                }
            };
            let payload = Payload::Attached {
                id: attach_id,
                offset: op.start + op.done,
                len: write.len,
            };
            if let Err(e) = self.push_data_write(state, Some(&mut chain), &write, payload) {
                op.failure = Some(e);
                break;
            }
            state.stats.zero_copy_bytes += write.len as u64;
            op.done += write.len;
            last_send = Some(write.wr_id);
        }
        let posted = self
            .push_controls(state, &mut chain)
            .and_then(|()| self.post_chain(state, &mut chain));
        match last_send {
            Some(last_send) => {
                // The buffer's entry moves to the back: its last send is now the newest.
                state.attached.retain(|l| l.attach_id != attach_id);
                state.attached.push_back(AttachedBuffer {
                    attach_id,
                    last_send,
                });
            }
            None if !state.attached.iter().any(|l| l.attach_id == attach_id) => {
                // No send of it was ever posted: the device never saw it.
                op.buffer = self.device.qp.reclaim(attach_id);
                op.attached = None;
            }
            None => {}
        }
        if let Err(e) = posted {
            op.failure.get_or_insert(e);
        }
        Ok(())
    }

    /// A zero-copy write was dropped: its buffer is freed when the device is done with it.
    pub(in crate::stream) fn abandon_region_write(&self, op: &mut RegionWrite) {
        let Some(attach_id) = op.attached.take() else {
            return;
        };
        let mut state = self.lock();
        if state.returned.remove(&attach_id).is_none() {
            if state.attached.iter().any(|l| l.attach_id == attach_id) {
                state.abandoned.insert(attach_id);
            } else {
                drop(self.device.qp.reclaim(attach_id));
            }
        }
    }
}
