//! Posting: the work requests the protocol plans (data writes, control messages, window
//! binds) go into a send chain, which reaches the device with one `ibv_post_send`.

use std::io;

use crate::proto::{DataWrite, RingSegment};
use crate::stream::gather::Gather;
use crate::stream::lending_ring::WINDOW_RANGE;
use crate::verbs::{Opcode, Payload, Segment, WorkRequest};

use super::device::data_request;
use super::{CTRL, CTRL_SLOT, CoreState, PostChain, RBUF, SBUF, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Posts every control message the protocol has due (credits, buffer grants, CTRL), with
    /// one `ibv_post_send`.
    #[inline]
    pub(super) fn post_controls(&self, state: &mut CoreState) -> io::Result<()> {
        if !state.conn.control_ready() {
            return Ok(()); // most calls (every flush, most reads): nothing is due
        }
        self.post_due_controls(state)
    }

    /// [`Self::post_controls`] once something is due: out of line, so that the calls that find
    /// nothing cost the look alone, without a call and a send chain's stack frame.
    #[inline(never)]
    fn post_due_controls(&self, state: &mut CoreState) -> io::Result<()> {
        let mut chain = self.device.chain();
        self.push_due_controls(state, &mut chain)?;
        self.post_chain(state, &mut chain)
    }

    /// Adds every control message the protocol has due to `chain`.
    #[inline]
    pub(super) fn push_controls(
        &self,
        state: &mut CoreState,
        chain: &mut D::Chain<'_>,
    ) -> io::Result<()> {
        if !state.conn.control_ready() {
            return Ok(()); // most calls: nothing is due
        }
        self.push_due_controls(state, chain)
    }

    /// [`Self::push_controls`] once something is due: out of line, as most calls find nothing.
    #[inline(never)]
    pub(super) fn push_due_controls(
        &self,
        state: &mut CoreState,
        chain: &mut D::Chain<'_>,
    ) -> io::Result<()> {
        while let Some(cw) = state.conn.poll_control() {
            if let Some(bind) = cw.bind {
                // Posted alone, after what was planned before it, so the window's new key can
                // be recorded once the provider has read the old one.
                self.post_chain(state, chain)?;
                let target = (RBUF, WINDOW_RANGE[bind.half]);
                if let Err(e) = self.device.post_bind(bind, target) {
                    return Err(self.post_failed(state, e));
                }
                state.stats.post_send_calls += 1;
            }
            let segment;
            let bytes = cw.payload.unwrap_or_default();
            let payload = match cw.payload {
                Some(_) if cw.inline => Payload::Inline(&bytes),
                Some(_) => {
                    let offset = cw.ctrl_slot * CTRL_SLOT;
                    self.device.write_at(CTRL, offset, &bytes)?;
                    segment = [Segment {
                        buffer: CTRL,
                        offset,
                        len: bytes.len(),
                    }];
                    Payload::Segments(&segment)
                }
                None => Payload::Empty,
            };
            let req = WorkRequest {
                wr_id: cw.wr_id,
                opcode: Opcode::Write {
                    remote_addr: cw.remote_addr,
                    rkey: cw.rkey,
                    imm: cw.imm,
                },
                payload,
                signaled: cw.signaled,
            };
            self.push(state, chain, &req)?;
            state.stats.control_writes += 1;
            state.stats.signaled_sends += u64::from(cw.signaled);
        }
        Ok(())
    }

    /// Adds `req` to `chain` (which posts what it holds first when full). Requests go to the
    /// device in the order the protocol planned them, so nothing else may post while a chain
    /// holds some. A failure ends the connection.
    pub(super) fn push(
        &self,
        state: &mut CoreState,
        chain: &mut D::Chain<'_>,
        req: &WorkRequest<'_>,
    ) -> io::Result<()> {
        let posts = chain.posts();
        let pushed = chain.push(req);
        state.stats.post_send_calls += chain.posts() - posts;
        pushed.map_err(|e| self.post_failed(state, e))
    }

    /// Posts what `chain` holds with one `ibv_post_send`; a failure ends the connection.
    pub(super) fn post_chain(
        &self,
        state: &mut CoreState,
        chain: &mut D::Chain<'_>,
    ) -> io::Result<()> {
        if chain.is_empty() {
            return Ok(()); // most calls: nothing was due
        }
        let posts = chain.posts();
        let posted = chain.post();
        state.stats.post_send_calls += chain.posts() - posts;
        posted.map_err(|e| self.post_failed(state, e))
    }

    /// A post failed: requests the protocol counts as outstanding may never have been posted,
    /// so their completions may never come (`CoreState::post_failed`); the connection ends.
    pub(super) fn post_failed(&self, state: &mut CoreState, e: io::Error) -> io::Error {
        state.post_failed = true;
        self.fatal(state, e)
    }

    /// Takes the data write `write`'s bytes from `source`, copied into the send ring or sent
    /// inline, and adds the write to `chain`, or with no chain posts it alone. Always inlined
    /// (into the write call, its one caller): as a call of its own, its frame and the move of
    /// `write` into it cost a streamed message some 35 instructions.
    #[inline(always)]
    pub(super) fn push_data(
        &self,
        state: &mut CoreState,
        chain: Option<&mut D::Chain<'_>>,
        write: &DataWrite,
        source: &mut Gather<'_>,
    ) -> io::Result<()> {
        if write.len > source.remaining() {
            let err = io::Error::other("a chunk was planned longer than the bytes left to write");
            return Err(self.fatal(state, err));
        }
        let gathered;
        // Made only for a copied chunk: made first, it cost every inline chunk its zeroing.
        let segments;
        // One call of `push_data_write` for both shapes, so that it is inlined here once (two
        // calls left it a function of its own; see `push_data_write`).
        let payload = if write.inline {
            match source.take_contiguous(write.len) {
                Some(bytes) => Payload::Inline(bytes),
                // Spread over several of the call's buffers: the device takes inline bytes as
                // one range. Rare: only small vectored writes go inline.
                None => {
                    gathered = source.take_vec(write.len);
                    Payload::Inline(&gathered[..])
                }
            }
        } else {
            let parts = write.sbuf.parts();
            for seg in parts.iter().flatten() {
                let mut at = seg.offset;
                while at < seg.offset + seg.len {
                    // Not empty: the source holds at least the chunk's bytes (checked above).
                    let piece = source.next_piece(seg.offset + seg.len - at);
                    self.device.write_at(SBUF, at, piece)?;
                    at += piece.len();
                }
            }
            let segment = |part: Option<RingSegment>| {
                let seg = part.unwrap_or_default();
                Segment {
                    buffer: SBUF,
                    offset: seg.offset,
                    len: seg.len,
                }
            };
            segments = [segment(parts[0]), segment(parts[1])];
            let count = parts.iter().flatten().count();
            Payload::Segments(&segments[..count])
        };
        self.push_data_write(state, chain, write, payload)
    }

    /// Adds the data write `write` (an RDMA write with its DATA immediate) from `payload` to
    /// `chain`, or with no chain posts it alone; a failure ends the connection. Always inlined,
    /// as is every call from the write down to `ibv_post_send`: whichever of them was left a
    /// call cost its frame and a request built in memory for it, and inlining them all cut a
    /// streamed message's write by about 45 instructions.
    #[inline(always)]
    pub(super) fn push_data_write(
        &self,
        state: &mut CoreState,
        chain: Option<&mut D::Chain<'_>>,
        write: &DataWrite,
        payload: Payload<'_>,
    ) -> io::Result<()> {
        match chain {
            Some(chain) => self.push(state, chain, &data_request(write, payload))?,
            None => {
                self.device
                    .post_data_write(write, payload)
                    .map_err(|e| self.post_failed(state, e))?;
                state.stats.post_send_calls += 1;
            }
        }
        state.stats.data_writes += 1;
        state.stats.inline_writes += u64::from(matches!(payload, Payload::Inline(_)));
        state.stats.signaled_sends += u64::from(write.signaled);
        state.stats.bytes_sent += write.len as u64;
        Ok(())
    }
}
