//! The sending half: chunking, send-buffer ring, target SGL and send credits
//! (rsocket-protocol.md §2.3).

use super::config::{
    Config, RS_MAX_TRANSFER, RS_OLAP_START_SIZE, RS_QP_CTRL_SIZE, RS_SGL_SIZE, RS_SNDLOWAT,
};
use super::error::ProtoError;
use super::ring::Segments;
use super::sge::RsSge;

/// The chunk-size ramp of one application write call.
///
/// C restarts at 2048 bytes in every `rsend` and doubles per chunk up to 64 KiB. The driver
/// creates one `WriteCall` per `poll_write` (a new call after `Pending` or a partial write
/// restarts the ramp, exactly like C's non-blocking `rsend` returning a short count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WriteCall {
    olen: u32,
}

impl Default for WriteCall {
    fn default() -> Self {
        Self::new()
    }
}

impl WriteCall {
    /// A new call: the next chunk is at most 2048 bytes.
    pub(crate) const fn new() -> Self {
        Self {
            olen: RS_OLAP_START_SIZE,
        }
    }

    /// A call that sends the largest chunks at once (64 KiB, still clipped to the target
    /// buffer and the send ring). The ramp is local to the sender: a receiver accepts any chunk
    /// that fits the buffer it granted, so skipping it stays compatible with C, and needs up to
    /// six times fewer work requests (and completions) per 64 KiB written.
    pub(crate) const fn largest() -> Self {
        Self {
            olen: RS_MAX_TRANSFER,
        }
    }

    /// C's ramp: `olen` if more than `olen` is left (and double `olen`), else everything left.
    /// The doubling happens even when the chunk is later clipped, as in C.
    fn take(&mut self, remaining: usize) -> u32 {
        if (self.olen as usize) < remaining {
            let chunk = self.olen;
            if self.olen < RS_MAX_TRANSFER {
                self.olen <<= 1;
            }
            chunk
        } else {
            // remaining <= olen <= 65536 here, so it fits.
            remaining as u32
        }
    }
}

/// Why a write cannot proceed now (the first failing condition of C's `rs_can_send`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriteBlocked {
    /// Every data send-queue entry is in flight: wait for a send completion.
    SendQueue,
    /// Fewer than 2048 free send-buffer bytes: wait for a send completion.
    SendBuffer,
    /// `sseq_no == sseq_comp`: wait for the peer's credit update (it comes when the peer's
    /// application reads).
    Credits,
    /// The current target SGE is used up: wait for the peer's SGL update.
    TargetBuffer,
}

/// One chunk the sender decided to write; the connection wraps it into a `DataWrite`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Chunk {
    pub(crate) len: u32,
    pub(crate) sbuf: Segments,
    pub(crate) inline: bool,
    pub(crate) remote_addr: u64,
    pub(crate) rkey: u32,
    /// Post it signaled (see [`Sender::take_signal`]).
    pub(crate) signaled: bool,
}

/// Sender state.
#[derive(Debug, Clone)]
pub(crate) struct Sender {
    sbuf_size: u32,
    /// Where the next copied chunk starts (C's `ssgl[0].addr`).
    sbuf_head: u32,
    sbuf_bytes_avail: u32,
    sqe_avail: u32,
    sqe_max: u32,
    inline_size: u32,
    /// Local copy of our target SGL: what the peer granted, consumed as we write.
    target_sgl: [RsSge; RS_SGL_SIZE],
    target_sge: usize,
    /// The slot the peer's next SGL update lands in: 1, 0, 1, ... (it starts at 1 because the
    /// conn data filled slot 0).
    next_update_slot: usize,
    sseq_no: u16,
    sseq_comp: u16,
    peer_credits: u16,
    /// Every `signal_interval`-th data write is signaled.
    signal_interval: u32,
    /// Unsignaled ring bytes at which a data write is signaled: three quarters of the ring
    /// (see `take_signal`).
    signal_bytes: u32,
    /// Data writes posted unsignaled since the last signaled one.
    unsignaled_run: u32,
    /// Send-ring bytes those writes hold.
    unsignaled_bytes: u32,
}

impl Sender {
    pub(crate) fn new(config: &Config) -> Self {
        let sqe_max = config.sq_size().saturating_sub(RS_QP_CTRL_SIZE);
        Self {
            sbuf_size: config.sbuf_size(),
            sbuf_head: 0,
            sbuf_bytes_avail: config.sbuf_size(),
            sqe_avail: sqe_max,
            sqe_max,
            inline_size: config.inline_size(),
            target_sgl: [RsSge::default(); RS_SGL_SIZE],
            target_sge: 0,
            next_update_slot: 1 % RS_SGL_SIZE,
            sseq_no: 0,
            sseq_comp: 0,
            peer_credits: 0,
            // A quarter of the queue (95 writes at the default depth), so a signaled completion
            // comes back while three quarters of it are still free. (An eighth, 47, counted 4
            // instructions a message more when streaming 64 B; at most 16, 20 more.)
            signal_interval: (sqe_max / 4).max(1),
            signal_bytes: config.sbuf_size() - config.sbuf_size() / 4,
            unsignaled_run: 0,
            unsignaled_bytes: 0,
        }
    }

    /// C's `rs_save_conn_data`, sender part: slot 0 = the peer's first buffer, limit = credits.
    pub(crate) fn seed(&mut self, data_buf: RsSge, credits: u16) {
        self.target_sgl[0] = data_buf;
        self.sseq_comp = credits;
        self.peer_credits = credits;
    }

    /// Moves the sequence numbers on by `start` messages (both ends of a connection by the
    /// same amount, before the first message): a harness starts near the 2^16 wrap.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn start_sequences_at(&mut self, start: u16) {
        self.sseq_no = self.sseq_no.wrapping_add(start);
        self.sseq_comp = self.sseq_comp.wrapping_add(start);
    }

    /// The target SGL entry the next chunk goes to. Always below the array's size; taken
    /// modulo it so that the compiler drops the bounds check of every data write's looks.
    #[inline]
    fn target_index(&self) -> usize {
        self.target_sge % RS_SGL_SIZE
    }

    /// `None` if a chunk can be sent now (C's `rs_can_send`), else the first reason it cannot.
    pub(crate) fn blocked(&self) -> Option<WriteBlocked> {
        if self.sqe_avail == 0 {
            Some(WriteBlocked::SendQueue)
        } else if self.sbuf_bytes_avail < RS_SNDLOWAT {
            Some(WriteBlocked::SendBuffer)
        } else if self.sseq_no == self.sseq_comp {
            Some(WriteBlocked::Credits)
        } else if self.target_sgl[self.target_index()].length == 0 {
            Some(WriteBlocked::TargetBuffer)
        } else {
            None
        }
    }

    /// Whether the writer would wait for a send completion ([`WriteBlocked::SendQueue`] or
    /// [`WriteBlocked::SendBuffer`]): [`Self::blocked`]'s first two looks alone, as each data
    /// write asks this once it is accounted for.
    #[inline]
    fn blocked_by_own_sends(&self) -> bool {
        self.sqe_avail == 0 || self.sbuf_bytes_avail < RS_SNDLOWAT
    }

    /// The length of the next chunk of a call with `remaining > 0` bytes left, and the target
    /// buffer it goes to, or why none can go now.
    fn chunk_len(
        &self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<(u32, RsSge), WriteBlocked> {
        if let Some(reason) = self.blocked() {
            return Err(reason);
        }
        let target = self.target_sgl[self.target_index()];
        let len = call
            .take(remaining)
            .min(self.sbuf_bytes_avail)
            .min(target.length);
        Ok((len, target))
    }

    /// Decide the next chunk of a call with `remaining > 0` bytes left, and account for it
    /// before returning (C: "update target SGE before sending data"). Always inlined into the
    /// write that posts the chunk (see `Connection::prepare_write`).
    #[inline(always)]
    pub(crate) fn next_chunk(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<Chunk, WriteBlocked> {
        let (len, target) = self.chunk_len(call, remaining)?;
        // len > 0: remaining > 0, sbuf_bytes_avail >= 2048 and target.length > 0.
        let inline = len <= self.inline_size;
        let sbuf = if inline {
            // Sent from the application's buffer; sbuf space is still charged (as in C) and
            // returned on completion, but the ring head does not move.
            Segments::EMPTY
        } else {
            let segs = Segments::in_ring(self.sbuf_head, len, self.sbuf_size);
            self.sbuf_head =
                ((u64::from(self.sbuf_head) + u64::from(len)) % u64::from(self.sbuf_size)) as u32;
            segs
        };
        let remote_addr = self.charge(len);
        Ok(Chunk {
            len,
            sbuf,
            inline,
            remote_addr,
            rkey: target.key,
            signaled: self.take_signal(len),
        })
    }

    /// Charges a chunk of `len` bytes (no more than the target buffer's): ring space, a
    /// send-queue entry and a credit; takes `len` bytes of the current target buffer and
    /// returns where they start.
    fn charge(&mut self, len: u32) -> u64 {
        self.sbuf_bytes_avail -= len;
        self.sqe_avail -= 1;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        let slot = &mut self.target_sgl[self.target_index()];
        let remote_addr = slot.addr;
        slot.addr = slot.addr.wrapping_add(u64::from(len));
        slot.length -= len;
        if slot.length == 0 {
            self.target_sge = (self.target_sge + 1) % RS_SGL_SIZE;
        }
        remote_addr
    }

    /// Decide the next chunk of a zero-copy write with `remaining > 0` bytes left: it is sent
    /// straight from the caller's registered memory, so the ring head does not move, but the
    /// ring space is still charged until its completion (as for an inline chunk), which keeps
    /// the ring accounting unchanged.
    pub(crate) fn next_external_chunk(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<Chunk, WriteBlocked> {
        let (len, target) = self.chunk_len(call, remaining)?;
        let remote_addr = self.charge(len);
        // The caller's region comes back only with a completion: the chunk that ends the write
        // or after which the writer waits (for anything) is signaled, so the region is never
        // left waiting on a later send that may not come.
        let signaled =
            self.take_signal(len) || len as usize == remaining || self.blocked().is_some();
        if signaled {
            (self.unsignaled_run, self.unsignaled_bytes) = (0, 0);
        }
        Ok(Chunk {
            len,
            sbuf: Segments::EMPTY,
            inline: false,
            remote_addr,
            rkey: target.key,
            signaled,
        })
    }

    /// Whether the data write of `len` bytes just accounted for must be signaled: every
    /// `signal_interval`-th one, the one that brings the unsignaled writes to three quarters of
    /// the send ring (ring space comes back while the last quarter fills; at half a ring, 64 KiB
    /// streams signaled one chunk in eight, which with the reader's credit updates was more
    /// than an eighth per message), and the one after which the sender waits for a send
    /// completion (send queue or send ring used up) unless an earlier signaled write still in
    /// flight will free enough. Sends complete in order, so a completion releases every
    /// unsignaled write before it: a sender blocked on the send queue or ring always has a
    /// signaled write in flight whose completion unblocks it, and nothing in the ring is
    /// reused before the device is done with it. (Waiting for the peer's credits or buffers
    /// needs no completion.)
    fn take_signal(&mut self, len: u32) -> bool {
        let bytes = self.unsignaled_bytes.saturating_add(len);
        let run = self.unsignaled_run + 1;
        let signaled = run >= self.signal_interval
            || bytes >= self.signal_bytes
            || (self.blocked_by_own_sends() && !self.unblocked_by_earlier_signal(run, bytes));
        (self.unsignaled_run, self.unsignaled_bytes) = if signaled { (0, 0) } else { (run, bytes) };
        signaled
    }

    /// Whether the completion of the last signaled data write, still to come, frees enough
    /// send-queue entries and ring bytes to unblock the writer, were the `run` writes of
    /// `bytes` since it left unsignaled. Writes after it hold at most `run` entries and `bytes`
    /// ring bytes (a signaled control message may have completed some of them), so whatever
    /// else is held belongs to writes up to that signaled one, which is then still in flight.
    fn unblocked_by_earlier_signal(&self, run: u32, bytes: u32) -> bool {
        let entries_freed = (self.sqe_max - self.sqe_avail).saturating_sub(run);
        let bytes_freed = (self.sbuf_size - self.sbuf_bytes_avail).saturating_sub(bytes);
        entries_freed > 0 && self.sbuf_bytes_avail + bytes_freed >= RS_SNDLOWAT
    }

    /// A 0-byte DATA message (which C never sends, and a receiver accepts): it takes a
    /// send-queue entry and a credit like any chunk, but no ring bytes and no target buffer.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn next_empty_chunk(&mut self) -> Result<Chunk, WriteBlocked> {
        if let Some(reason) = self.blocked() {
            return Err(reason);
        }
        self.sqe_avail -= 1;
        self.sseq_no = self.sseq_no.wrapping_add(1);
        let target = self.target_sgl[self.target_index()];
        Ok(Chunk {
            len: 0,
            sbuf: Segments::EMPTY,
            inline: true,
            remote_addr: target.addr,
            rkey: target.key,
            signaled: self.take_signal(0),
        })
    }

    /// `writes` data writes of `bytes` bytes in all completed: their send-queue entries and
    /// send-buffer bytes are free again. A completion covers every unsignaled write before it,
    /// so they are given back at once, not one by one.
    pub(crate) fn complete(&mut self, writes: u32, bytes: u32) {
        self.sqe_avail = self.sqe_avail.saturating_add(writes).min(self.sqe_max);
        self.sbuf_bytes_avail = self
            .sbuf_bytes_avail
            .saturating_add(bytes)
            .min(self.sbuf_size);
    }

    /// The slot the peer's next SGL update must have been written to.
    pub(crate) fn next_update_slot(&self) -> usize {
        self.next_update_slot
    }

    /// Take an SGL update the peer wrote into our target SGL at `next_update_slot`.
    pub(crate) fn apply_sgl_update(&mut self, sge: RsSge) -> Result<usize, ProtoError> {
        let slot = self.next_update_slot;
        if sge.length == 0 {
            return Err(ProtoError::peer(format!(
                "SGL update into target SGL slot {slot} grants a 0-byte buffer"
            )));
        }
        if sge.end().is_none() {
            return Err(ProtoError::peer(format!(
                "SGL update into target SGL slot {slot}: addr {:#x} + length {} overflows",
                sge.addr, sge.length
            )));
        }
        let left = self.target_sgl[slot].length;
        if left != 0 {
            // The peer must not rewrite a slot before we filled the buffer it last put there
            // (rsocket-protocol.md §2.5); otherwise data we already placed could be lost.
            return Err(ProtoError::peer(format!(
                "SGL update overwrote target SGL slot {slot} while {left} bytes of the buffer \
                 previously granted there were still unused"
            )));
        }
        self.target_sgl[slot] = sge;
        self.next_update_slot = (slot + 1) % RS_SGL_SIZE;
        Ok(slot)
    }

    /// Take a new absolute send-sequence limit from an SGL or credit-only message.
    pub(crate) fn apply_limit(&mut self, limit: u16) -> Result<(), ProtoError> {
        // The peer sends (messages it consumed + its rq_size); it cannot have consumed more
        // than we sent, nor less than allowed us to send what we sent, so the new limit lies in
        // [sseq_no, sseq_no + credits] (mod 2^16).
        let ahead = limit.wrapping_sub(self.sseq_no);
        if ahead > self.peer_credits {
            return Err(ProtoError::peer(format!(
                "credit update sets the send limit to {limit}, outside [{}, {}] (we sent {} \
                 messages; the peer offered {} credits)",
                self.sseq_no,
                self.sseq_no.wrapping_add(self.peer_credits),
                self.sseq_no,
                self.peer_credits
            )));
        }
        self.sseq_comp = limit;
        Ok(())
    }

    /// Whether no data write is in flight.
    #[cfg(test)]
    pub(crate) fn idle(&self) -> bool {
        self.sqe_avail == self.sqe_max
    }

    /// Data messages sent so far (mod 2^16).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sseq_no(&self) -> u16 {
        self.sseq_no
    }

    /// Current send limit.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sseq_comp(&self) -> u16 {
        self.sseq_comp
    }

    /// Free send-buffer bytes.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sbuf_bytes_avail(&self) -> u32 {
        self.sbuf_bytes_avail
    }

    /// Free data send-queue entries.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sqe_avail(&self) -> u32 {
        self.sqe_avail
    }

    /// The credits the peer offered in its connection data: the send limit is never more
    /// than this ahead of `sseq_no`.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn peer_credits(&self) -> u16 {
        self.peer_credits
    }

    /// Data send-queue entries in all (the queue less the control slots).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sqe_max(&self) -> u32 {
        self.sqe_max
    }

    /// The send ring's size.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sbuf_size(&self) -> u32 {
        self.sbuf_size
    }

    /// The local copy of target SGL slot `slot` (what is left of the granted buffer).
    #[cfg(any(test, rdma_async_hooks))]
    pub(crate) fn target_slot(&self, slot: usize) -> Option<RsSge> {
        self.target_sgl.get(slot).copied()
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn largest_call_starts_at_the_maximum_transfer() {
        let mut call = WriteCall::largest();
        assert_eq!(call.take(100_000), RS_MAX_TRANSFER);
        assert_eq!(call.take(34_464), 34_464);
        let mut ramp = WriteCall::new();
        assert_eq!(ramp.take(100_000), RS_OLAP_START_SIZE);
    }

    use super::*;
    use crate::proto::config::DEFAULT_SQ_SIZE;
    use std::collections::VecDeque;

    fn sender(config: Config, half: u32) -> Sender {
        let mut s = Sender::new(&config);
        s.seed(
            RsSge {
                addr: 0x10_0000,
                key: 0x77,
                length: half,
            },
            384,
        );
        s
    }

    #[test]
    fn ramp_clips_and_wraps() {
        let mut s = sender(Config::new(), 65536);
        let mut call = WriteCall::new();
        let mut left = 100_000usize;
        let mut lens = Vec::new();
        while let Ok(c) = s.next_chunk(&mut call, left) {
            lens.push(c.len);
            left -= c.len as usize;
        }
        // Stops at the end of the first half; slot 1 has not been granted.
        assert_eq!(lens, [2048, 4096, 8192, 16384, 32768, 2048]);
        assert_eq!(s.blocked(), Some(WriteBlocked::TargetBuffer));
        assert_eq!(s.sseq_no(), 6);
        assert_eq!(s.sbuf_bytes_avail(), 131072 - 65536);
    }

    #[test]
    fn inline_chunks_charge_sbuf_without_moving_the_head() {
        let mut s = sender(Config::new(), 65536);
        let c = s.next_chunk(&mut WriteCall::new(), 64).unwrap();
        assert!(c.inline && c.sbuf.is_empty());
        assert_eq!(s.sbuf_bytes_avail(), 131072 - 64);
        let c = s.next_chunk(&mut WriteCall::new(), 65).unwrap();
        assert!(!c.inline);
        assert_eq!(c.sbuf.as_slice()[0].offset, 0);
        assert_eq!(c.remote_addr, 0x10_0000 + 64);
        s.complete(1, 64);
        s.complete(1, 65);
        assert!(s.idle());
        assert_eq!(s.sbuf_bytes_avail(), 131072);
    }

    #[test]
    fn external_chunks_use_no_ring_bytes() {
        let mut s = sender(Config::new(), 65536);
        let mut call = WriteCall::largest();
        let c = s.next_external_chunk(&mut call, 100_000).unwrap();
        assert_eq!((c.len, c.inline, c.sbuf.is_empty()), (65536, false, true));
        assert_eq!(s.blocked(), Some(WriteBlocked::TargetBuffer));
        assert_eq!(s.sbuf_bytes_avail(), 131072 - 65536);
        s.apply_sgl_update(RsSge {
            addr: 0x20_0000,
            key: 0x78,
            length: 65536,
        })
        .unwrap();
        // The ring head did not move: the next copied chunk starts at offset 0.
        let c = s.next_chunk(&mut WriteCall::new(), 200).unwrap();
        assert_eq!(c.sbuf.as_slice()[0].offset, 0);
        s.complete(1, 65536);
        s.complete(1, 200);
        assert!(s.idle());
        assert_eq!(s.sbuf_bytes_avail(), 131072);
    }

    #[test]
    fn external_chunks_are_signaled_when_the_write_ends_or_waits() {
        let mut s = sender(Config::new().with_sbuf_size(1 << 20), 1 << 20);
        let mut call = WriteCall::largest();
        // 3 chunks of 64 KiB, then the 16 KiB that ends the write.
        let flags: Vec<bool> = [212_992, 147_456, 81_920, 16_384]
            .iter()
            .map(|&remaining| {
                s.next_external_chunk(&mut call, remaining)
                    .unwrap()
                    .signaled
            })
            .collect();
        assert_eq!(flags, [false, false, false, true]);
        // A write the peer's buffer cannot take at once: the last chunk before the wait is
        // signaled even though the write is not over.
        let mut s = sender(Config::new(), 65536);
        let c = s
            .next_external_chunk(&mut WriteCall::largest(), 100_000)
            .unwrap();
        assert_eq!(s.blocked(), Some(WriteBlocked::TargetBuffer));
        assert!(c.signaled);
    }

    #[test]
    fn signals_every_interval_and_before_waiting_for_a_completion() {
        // Default depth: 380 data entries, every 95th write signaled.
        let mut s = sender(Config::new().with_sbuf_size(1 << 20), 1 << 20);
        let signaled: Vec<bool> = (0..190)
            .map(|_| s.next_chunk(&mut WriteCall::new(), 64).unwrap().signaled)
            .collect();
        let at: Vec<usize> = (0..190).filter(|&i| signaled[i]).collect();
        assert_eq!(at, [94, 189]);
        // Three quarters of a 1 MiB ring: the 12th 64 KiB chunk is signaled, before the
        // interval runs out. The 16th fills the ring but needs no signal: the 12th's
        // completion, still to come, frees three quarters.
        let mut s = sender(Config::new().with_sbuf_size(1 << 20), 4 << 20);
        let chunks = |s: &mut Sender, n: usize| -> Vec<bool> {
            (0..n)
                .map(|_| {
                    s.next_chunk(&mut WriteCall::largest(), 65536)
                        .unwrap()
                        .signaled
                })
                .collect()
        };
        let mut flags = chunks(&mut s, 16);
        assert_eq!(s.blocked(), Some(WriteBlocked::SendBuffer));
        (0..12).for_each(|_| s.complete(1, 65536));
        assert_eq!(s.blocked(), None);
        // Counting goes on from the 12th: the 24th is signaled, the 28th fills the ring again.
        flags.extend(chunks(&mut s, 12));
        assert_eq!(s.blocked(), Some(WriteBlocked::SendBuffer));
        let at: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
        assert_eq!(at, [11, 23]);
        // 38 data entries: every 9th write signaled; the one that takes the last entry is
        // not, as the 36th's completion is still to come.
        let mut s = sender(Config::new().with_sq_size(42), 1 << 20);
        let flags: Vec<bool> = std::iter::from_fn(|| {
            s.next_chunk(&mut WriteCall::new(), 1)
                .ok()
                .map(|c| c.signaled)
        })
        .collect();
        let at: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
        assert_eq!(at, [8, 17, 26, 35]);
        assert_eq!(flags.len(), 38);
        assert_eq!(s.blocked(), Some(WriteBlocked::SendQueue));
        // A small ring filled before any write was signaled: the write that fills it is.
        let mut s = sender(Config::new().with_sbuf_size(4096), 1 << 20);
        let flags: Vec<bool> = (0..3)
            .map(|_| s.next_chunk(&mut WriteCall::new(), 1000).unwrap().signaled)
            .collect();
        assert_eq!(flags, [false, false, true]);
        assert_eq!(s.blocked(), Some(WriteBlocked::SendBuffer));
    }

    /// Writes `count` chunks of the sizes in `lens` (in turn) with a peer that always grants
    /// more credits and buffers, completing sends only as a device would: in order, each
    /// signaled write's completion freeing it and every unsignaled one before it, and only when
    /// the writer waits for one. Panics if the writer waits on its own sends while none of
    /// them is signaled (it would never wake). Returns the signaled flags in order.
    fn stream_without_stalling(config: Config, lens: &[usize], count: usize) -> Vec<bool> {
        let mut s = sender(config, 1 << 20);
        let mut in_flight: VecDeque<(u32, bool)> = VecDeque::new();
        let mut flags = Vec::new();
        let mut call = WriteCall::new();
        while flags.len() < count {
            let len = lens[flags.len() % lens.len()];
            match s.next_chunk(&mut call, len) {
                Ok(c) => {
                    in_flight.push_back((c.len, c.signaled));
                    flags.push(c.signaled);
                }
                Err(WriteBlocked::SendQueue | WriteBlocked::SendBuffer) => {
                    let last = in_flight.iter().position(|&(_, signaled)| signaled);
                    let last = last.unwrap_or_else(|| {
                        panic!(
                            "stalled after {} writes: no signaled send in flight",
                            flags.len()
                        )
                    });
                    let done: Vec<_> = in_flight.drain(..=last).collect();
                    s.complete(done.len() as u32, done.iter().map(|&(len, _)| len).sum());
                }
                Err(WriteBlocked::Credits) => s.apply_limit(s.sseq_no.wrapping_add(384)).unwrap(),
                Err(WriteBlocked::TargetBuffer) => {
                    let sge = RsSge {
                        addr: 0x10_0000,
                        key: 0x77,
                        length: 1 << 20,
                    };
                    s.apply_sgl_update(sge).unwrap();
                }
            }
        }
        flags
    }

    #[test]
    fn signal_interval_scales_with_the_send_queue_and_never_stalls() {
        // (send-queue depth, interval): a quarter of the data entries (the depth less 4
        // control-message entries), at least 1.
        for (depth, interval) in [
            (16, 3),
            (17, 3),
            (20, 4),
            (42, 9),
            (DEFAULT_SQ_SIZE, 95),
            (1024, 255),
        ] {
            let big_ring = Config::new().with_sq_size(depth).with_sbuf_size(1 << 20);
            let flags = stream_without_stalling(big_ring, &[64], 4 * interval);
            let at: Vec<usize> = (0..flags.len()).filter(|&i| flags[i]).collect();
            let expected: Vec<usize> = (1..=4).map(|n| n * interval - 1).collect();
            assert_eq!(at, expected, "depth {depth}");
            // Every ring size and write size, including ones that fill the send queue or the
            // ring long before the interval runs out.
            for sbuf in [4096, 8192, 65536, 1 << 20] {
                for lens in [&[64][..], &[1, 3000, 64, 65536], &[65536], &[2048, 100]] {
                    let config = Config::new().with_sq_size(depth).with_sbuf_size(sbuf);
                    let flags = stream_without_stalling(config, lens, 2000);
                    // A signaled write at least every `interval` writes.
                    let longest_unsignaled_run =
                        flags.split(|&signaled| signaled).map(<[bool]>::len).max();
                    assert!(
                        longest_unsignaled_run < Some(interval),
                        "depth {depth}, ring {sbuf}, {lens:?}: {longest_unsignaled_run:?}"
                    );
                }
            }
        }
    }

    #[test]
    fn limit_must_stay_within_credits() {
        let mut s = sender(Config::new(), 65536);
        s.apply_limit(384).unwrap();
        s.apply_limit(10).unwrap();
        assert!(s.apply_limit(385).is_err());
        assert!(s.apply_limit(0xFFFF).is_err());
    }

    #[test]
    fn sgl_update_checks() {
        let mut s = sender(Config::new(), 65536);
        assert_eq!(s.next_update_slot(), 1);
        let sge = RsSge {
            addr: 0x20_0000,
            key: 0x78,
            length: 65536,
        };
        assert!(
            s.apply_sgl_update(RsSge { length: 0, ..sge })
                .unwrap_err()
                .to_string()
                .contains("0-byte")
        );
        assert_eq!(s.apply_sgl_update(sge).unwrap(), 1);
        // Slot 0 still holds the unused first half.
        let err = s.apply_sgl_update(sge).unwrap_err();
        assert!(err.to_string().contains("slot 0"), "{err}");
        assert_eq!(s.target_slot(1), Some(sge));
        assert_eq!(s.target_slot(2), None);
    }
}
