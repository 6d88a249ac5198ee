//! A simulated pair of rsockets peers for testing [`crate::proto`] without RDMA hardware.
//!
//! Each side has plain `Vec<u8>`s for its send ring, receive ring and target SGL at fake
//! addresses with fake rkeys, and a driver loop that uses the protocol core the way the real
//! stream's driver (`StreamCore` in `stream/driver/`) does: copy into the send ring,
//! post, handle completions, repost receives, post control messages, copy out of the receive
//! ring.
//!
//! The fabric executes the posted writes with RC semantics: writes from one side arrive in post
//! order, a write-with-immediate needs a posted receive at the target (otherwise it waits, like
//! an RNR retry), and the send completion is queued at the sender after delivery. Delivery and
//! completion polling are separate steps a test interleaves freely.
//!
//! Every remote write is checked against what the receiver had **granted at that moment**: the
//! rkey, the region, that data lands exactly at the next unfilled byte of the oldest grant, that
//! a grant only covers bytes the application already consumed, that an SGL update never
//! overwrites a slot whose buffer is not completely filled, and that a send-ring region is not
//! reused before its completion was handled. A violation panics: the test fails.

#![forbid(unsafe_code)]

mod hostile_prop;
mod prop;
mod tests;
mod timeouts;

use std::collections::{HashMap, VecDeque};

use crate::proto::grant_queue::GrantQueue;
use crate::proto::{
    Config, ConnData, Connection, ControlKind, ControlWrite, CtrlCode, DataWrite, LocalLayout,
    ProtoError, RS_SGL_SIZE, ReadStatus, RecvEvent, RsSge, TARGET_SGL_BYTES, WriteBlocked,
    WriteCall, WriteError,
};

/// Fake addresses and keys, different per side so mix-ups are caught.
const RBUF_ADDR: [u64; 2] = [0x7f00_1000_0000, 0x7f80_2000_0000];
const RBUF_RKEY: [u32; 2] = [0x1001, 0x2001];
const TSGL_ADDR: [u64; 2] = [0x7f00_9000_0000, 0x7f80_a000_0000];
const TSGL_RKEY: [u32; 2] = [0x1002, 0x2002];

/// What a byte of a receive ring holds, from the simulator's independent point of view.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ByteState {
    /// Consumed (or never used) and not granted: nobody may write it.
    Free,
    /// Granted to the peer and not yet written.
    Granted,
    /// Written by the peer and not yet consumed by the application.
    Filled,
}

/// A completion queue entry.
#[derive(Debug, Clone, Copy)]
enum Cqe {
    Send { wr_id: u64, ok: bool },
    Recv { imm: Option<u32>, byte_len: u32 },
}

/// A posted work request travelling on the wire.
#[derive(Debug, Clone)]
enum Wr {
    /// A data write; `inline` holds the bytes copied at post time (IBV_SEND_INLINE), otherwise
    /// the payload is gathered from the send ring at delivery, like a DMA.
    Data {
        write: DataWrite,
        inline: Option<Vec<u8>>,
    },
    Control(ControlWrite),
}

/// One simulated peer: the protocol core plus its memory and driver bookkeeping.
#[derive(Debug)]
pub(crate) struct SimSide {
    pub(crate) conn: Connection,
    sbuf: Vec<u8>,
    /// How many posted-but-not-completed writes use each send-ring byte (must stay ≤ 1).
    sbuf_busy: Vec<u8>,
    /// Send-ring segments per outstanding data wr_id, released when its completion (or that of
    /// a later send: they complete in order) is handled.
    sbuf_of_wr: HashMap<u64, Vec<(usize, usize)>>,
    /// Every send posted and not yet known complete, in post order, with whether it was
    /// signaled (only signaled sends produce a completion).
    posted: VecDeque<(u64, bool)>,
    rbuf: Vec<u8>,
    rbuf_state: Vec<ByteState>,
    grants: GrantQueue,
    tsgl: Vec<u8>,
    cq: VecDeque<Cqe>,
    recv_posted: u32,
    /// Receive completions handled (for tests).
    pub(crate) recv_events: Vec<RecvEvent>,
    /// Control messages posted (for tests).
    pub(crate) controls_posted: Vec<ControlWrite>,
    /// Data writes posted (for tests).
    pub(crate) data_posted: Vec<DataWrite>,
}

impl SimSide {
    fn new(index: usize, config: Config) -> Self {
        let layout = LocalLayout {
            rbuf_addr: RBUF_ADDR[index],
            rbuf_rkey: RBUF_RKEY[index],
            target_sgl_addr: TSGL_ADDR[index],
            target_sgl_rkey: TSGL_RKEY[index],
            ring_keys: None,
        };
        let conn = Connection::new(config, layout);
        let c = *conn.config();
        Self {
            sbuf: vec![0; c.sbuf_size() as usize],
            sbuf_busy: vec![0; c.sbuf_size() as usize],
            sbuf_of_wr: HashMap::new(),
            posted: VecDeque::new(),
            rbuf: vec![0; c.rbuf_size() as usize],
            rbuf_state: vec![ByteState::Free; c.rbuf_size() as usize],
            grants: GrantQueue::default(),
            tsgl: vec![0; TARGET_SGL_BYTES],
            cq: VecDeque::new(),
            recv_posted: c.rq_size(),
            recv_events: Vec::new(),
            controls_posted: Vec::new(),
            data_posted: Vec::new(),
            conn,
        }
    }

    /// Record that this side's receive ring granted `[start, start + len)` in the peer's target
    /// SGL `slot` (the conn data for slot 0, or an SGL update as it lands).
    fn grant(&mut self, slot: usize, start: usize, len: usize) {
        assert!(
            start + len <= self.rbuf.len(),
            "grant [{start}, {}) outside the {}-byte receive ring",
            start + len,
            self.rbuf.len()
        );
        self.grants.push(slot, start, len);
        for (i, st) in self.rbuf_state[start..start + len].iter_mut().enumerate() {
            assert_eq!(
                *st,
                ByteState::Free,
                "granted receive-ring byte {} that is not free (unconsumed or already granted)",
                start + i
            );
            *st = ByteState::Granted;
        }
    }

    /// A data write of `len` bytes at ring offset `start` arrives from the peer.
    fn land_data(&mut self, start: usize, payload: &[u8]) {
        let len = payload.len();
        self.grants.fill(start, len);
        for (i, st) in self.rbuf_state[start..start + len].iter_mut().enumerate() {
            assert_eq!(
                *st,
                ByteState::Granted,
                "wrote ungranted byte {}",
                start + i
            );
            *st = ByteState::Filled;
        }
        self.rbuf[start..start + len].copy_from_slice(payload);
    }

    fn post_data(&mut self, write: DataWrite, src: &[u8], wire: &mut VecDeque<Wr>) {
        assert_eq!(src.len(), write.len);
        let inline = if write.inline {
            assert!(write.sbuf.is_empty());
            assert!(write.len <= self.conn.config().inline_size() as usize);
            Some(src.to_vec())
        } else {
            assert_eq!(write.sbuf.total(), write.len);
            let mut copied = 0;
            let mut segs = Vec::new();
            for seg in write.sbuf.as_slice() {
                for b in &mut self.sbuf_busy[seg.offset..seg.offset + seg.len] {
                    assert_eq!(*b, 0, "send-ring region reused before its completion");
                    *b = 1;
                }
                self.sbuf[seg.offset..seg.offset + seg.len]
                    .copy_from_slice(&src[copied..copied + seg.len]);
                copied += seg.len;
                segs.push((seg.offset, seg.len));
            }
            self.sbuf_of_wr.insert(write.wr_id, segs);
            None
        };
        self.data_posted.push(write);
        self.posted.push_back((write.wr_id, write.signaled));
        wire.push_back(Wr::Data { write, inline });
    }

    fn payload_of(&self, write: &DataWrite, inline: &Option<Vec<u8>>) -> Vec<u8> {
        match inline {
            Some(bytes) => bytes.clone(),
            None => {
                let mut out = Vec::with_capacity(write.len);
                for seg in write.sbuf.as_slice() {
                    for &b in &self.sbuf_busy[seg.offset..seg.offset + seg.len] {
                        assert_eq!(
                            b, 1,
                            "gathering from a send-ring region not owned by this write"
                        );
                    }
                    out.extend_from_slice(&self.sbuf[seg.offset..seg.offset + seg.len]);
                }
                out
            }
        }
    }

    /// A completion for `wr_id` was polled: the device is done with it and with every send
    /// posted before it, so their send-ring bytes are free.
    fn release_through(&mut self, wr_id: u64) {
        if !self.posted.iter().any(|&(id, _)| id == wr_id) {
            return;
        }
        while let Some((id, _)) = self.posted.pop_front() {
            if let Some(segs) = self.sbuf_of_wr.remove(&id) {
                for (off, len) in segs {
                    for b in &mut self.sbuf_busy[off..off + len] {
                        *b = 0;
                    }
                }
            }
            if id == wr_id {
                break;
            }
        }
    }

    /// Whether a posted send will still produce a completion (one signaled and not yet
    /// polled): what a writer waiting for send-queue or send-ring space needs.
    fn completion_pending(&self) -> bool {
        self.posted.iter().any(|&(_, signaled)| signaled)
    }

    /// Bytes in the receive ring the simulator thinks are filled and unconsumed.
    fn filled_bytes(&self) -> usize {
        self.rbuf_state
            .iter()
            .filter(|s| **s == ByteState::Filled)
            .count()
    }
}

/// The result of an application write call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WriteOutcome {
    /// Bytes accepted (posted).
    pub(crate) written: usize,
    /// Why it stopped before `data.len()`, if it did.
    pub(crate) stopped: Option<WriteError>,
}

/// The result of an application read call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadOutcome {
    Data(Vec<u8>),
    Blocked,
    Eof,
    Failed(ProtoError),
}

/// Two connected peers and the wires between them (`wires[i]` carries side `i`'s writes).
#[derive(Debug)]
pub(crate) struct Pair {
    pub(crate) sides: [SimSide; 2],
    wires: [VecDeque<Wr>; 2],
}

impl Pair {
    /// Two sides with these configs, connected: conn data exchanged through its 40-byte
    /// encoding, as the CM would carry it.
    pub(crate) fn new(a: Config, b: Config) -> Self {
        let mut sides = [SimSide::new(0, a), SimSide::new(1, b)];
        let data = [
            sides[0].conn.local_conn_data().encode(),
            sides[1].conn.local_conn_data().encode(),
        ];
        for i in 0..2 {
            let peer = ConnData::decode(&data[1 - i]).expect("valid conn data");
            sides[i]
                .conn
                .handle_peer_conn_data(&peer)
                .expect("peer conn data accepted");
            // SimSide i granted its first half to the peer in its conn data (peer slot 0).
            let half = sides[i].conn.config().rbuf_size() as usize / 2;
            sides[i].grant(0, 0, half);
        }
        Self {
            sides,
            wires: [VecDeque::new(), VecDeque::new()],
        }
    }

    /// Execute the oldest write `from` posted, if the target has a receive posted for it.
    /// Returns whether something was delivered.
    pub(crate) fn deliver(&mut self, from: usize) -> bool {
        let to = 1 - from;
        let Some(wr) = self.wires[from].front() else {
            return false;
        };
        let needs_recv = match wr {
            Wr::Data { .. } => true,
            Wr::Control(c) => c.imm.is_some(),
        };
        if needs_recv && self.sides[to].recv_posted == 0 {
            // RNR: the hardware retries; the write stays first on the wire.
            return false;
        }
        let Some(wr) = self.wires[from].pop_front() else {
            return false;
        };
        let (sender, receiver) = if from == 0 {
            let [a, b] = &mut self.sides;
            (a, b)
        } else {
            let [a, b] = &mut self.sides;
            (b, a)
        };
        let (wr_id, signaled, recv) = match wr {
            Wr::Data { write, inline } => {
                let payload = sender.payload_of(&write, &inline);
                assert_eq!(
                    write.rkey, RBUF_RKEY[to],
                    "data write with the wrong rkey {:#x}",
                    write.rkey
                );
                let start = offset(
                    write.remote_addr,
                    RBUF_ADDR[to],
                    "data write below the receive ring",
                );
                assert!(
                    start + write.len <= receiver.rbuf.len(),
                    "data write past the end of the receive ring"
                );
                receiver.land_data(start, &payload);
                (
                    write.wr_id,
                    write.signaled,
                    Some(Cqe::Recv {
                        imm: Some(write.imm),
                        byte_len: write.len as u32,
                    }),
                )
            }
            Wr::Control(c) => {
                let byte_len = match (c.kind, c.payload) {
                    (ControlKind::SglUpdate { slot, .. }, Some(payload)) => {
                        assert_eq!(c.rkey, TSGL_RKEY[to], "SGL update with the wrong rkey");
                        let off = offset(
                            c.remote_addr,
                            TSGL_ADDR[to],
                            "SGL update below the target SGL",
                        );
                        assert!(
                            off.is_multiple_of(RsSge::LEN) && off + RsSge::LEN <= TARGET_SGL_BYTES,
                            "SGL update at target SGL offset {off} is not an entry"
                        );
                        assert_eq!(off / RsSge::LEN, slot as usize);
                        // The payload is in the receiver's (our) native order.
                        let sge = RsSge::from_bytes(payload, crate::proto::ByteOrder::native());
                        assert_eq!(
                            sge.key, RBUF_RKEY[from],
                            "granted buffer with the wrong key"
                        );
                        let start = offset(
                            sge.addr,
                            RBUF_ADDR[from],
                            "granted buffer below the receive ring",
                        );
                        sender.grant(slot as usize, start, sge.length as usize);
                        receiver.tsgl[off..off + RsSge::LEN].copy_from_slice(&payload);
                        RsSge::LEN as u32
                    }
                    (ControlKind::SglUpdate { .. }, None) => panic!("SGL update without payload"),
                    (_, Some(_)) => panic!("{:?} with a payload", c.kind),
                    (ControlKind::Ctrl(CtrlCode::Keepalive), None) => {
                        assert_eq!((c.remote_addr, c.rkey, c.imm), (0, 0, None));
                        0
                    }
                    (_, None) => {
                        assert_eq!((c.remote_addr, c.rkey), (0, 0));
                        0
                    }
                };
                (
                    c.wr_id,
                    c.signaled,
                    c.imm.map(|imm| Cqe::Recv {
                        imm: Some(imm),
                        byte_len,
                    }),
                )
            }
        };
        if let Some(cqe) = recv {
            receiver.recv_posted -= 1;
            receiver.cq.push_back(cqe);
        }
        // Like a device without `sq_sig_all`: unsignaled sends complete silently.
        if signaled {
            sender.cq.push_back(Cqe::Send { wr_id, ok: true });
        }
        true
    }

    /// Deliver everything deliverable from `from`.
    pub(crate) fn deliver_all(&mut self, from: usize) -> usize {
        let mut n = 0;
        while self.deliver(from) {
            n += 1;
        }
        n
    }

    /// Inject a raw receive completion at `side` (for tests of hostile peers).
    pub(crate) fn inject_recv(&mut self, side: usize, imm: Option<u32>, byte_len: u32) {
        self.sides[side].cq.push_back(Cqe::Recv { imm, byte_len });
    }

    /// Inject a failed send completion for `side`'s oldest outstanding send.
    pub(crate) fn fail_next_send(&mut self, side: usize, wr_id: u64) {
        self.sides[side]
            .cq
            .push_back(Cqe::Send { wr_id, ok: false });
    }

    /// The driver polls up to `max` completions of `side`, then posts due control messages.
    /// Returns the first protocol error.
    pub(crate) fn poll_cq(&mut self, side: usize, max: usize) -> Result<usize, ProtoError> {
        let mut n = 0;
        let mut first_err = None;
        while n < max {
            let Some(cqe) = self.sides[side].cq.pop_front() else {
                break;
            };
            n += 1;
            let s = &mut self.sides[side];
            match cqe {
                Cqe::Send { wr_id, ok } => {
                    let r = s.conn.handle_send_completion(wr_id, ok);
                    // The device is done with the send-ring bytes either way.
                    s.release_through(wr_id);
                    if let Err(e) = r {
                        first_err.get_or_insert(e);
                    }
                }
                Cqe::Recv { imm, byte_len } => {
                    let tsgl = s.tsgl.clone();
                    let r = s.conn.handle_recv_completion(imm, byte_len, |slot| {
                        assert!(slot < RS_SGL_SIZE);
                        let mut b = [0u8; 16];
                        b.copy_from_slice(&tsgl[slot * 16..slot * 16 + 16]);
                        b
                    });
                    match r {
                        Ok(action) => {
                            s.recv_events.push(action.event);
                            if action.repost {
                                s.recv_posted += 1;
                            }
                        }
                        Err(e) => {
                            first_err.get_or_insert(e);
                        }
                    }
                }
            }
        }
        self.pump_control(side);
        match first_err {
            Some(e) => Err(e),
            None => Ok(n),
        }
    }

    /// Post every control message the core wants now.
    pub(crate) fn pump_control(&mut self, side: usize) -> usize {
        let mut n = 0;
        while let Some(c) = self.sides[side].conn.poll_control() {
            self.sides[side].controls_posted.push(c);
            self.sides[side].posted.push_back((c.wr_id, c.signaled));
            self.wires[side].push_back(Wr::Control(c));
            n += 1;
        }
        // The signaling rule for control messages: one waiting for a slot has a completion
        // coming that frees it.
        let s = &self.sides[side];
        assert!(
            !s.conn.control_waiting_for_slot() || s.completion_pending(),
            "a control message waits for a slot with no signaled send outstanding"
        );
        n
    }

    /// One application write call (one `poll_write`): as many chunks as the core allows now.
    pub(crate) fn app_write(&mut self, side: usize, data: &[u8]) -> WriteOutcome {
        let mut call = WriteCall::new();
        let mut written = 0;
        let mut stopped = None;
        while written < data.len() {
            let s = &mut self.sides[side];
            match s.conn.prepare_write(&mut call, data.len() - written) {
                Ok(w) => {
                    let src = &data[written..written + w.len];
                    s.post_data(w, src, &mut self.wires[side]);
                    written += w.len;
                }
                Err(e) => {
                    if let WriteError::Blocked(WriteBlocked::SendQueue | WriteBlocked::SendBuffer) =
                        e
                    {
                        // The signaling rule: only a completion frees send-queue entries and
                        // ring space, so one must be on its way.
                        assert!(
                            s.completion_pending(),
                            "writer blocked on {e:?} with no signaled send outstanding"
                        );
                    }
                    stopped = Some(e);
                    break;
                }
            }
        }
        self.pump_control(side);
        WriteOutcome { written, stopped }
    }

    /// One application read call of at most `max` bytes.
    pub(crate) fn app_read(&mut self, side: usize, max: usize) -> ReadOutcome {
        let s = &mut self.sides[side];
        let out = match s.conn.read_status() {
            ReadStatus::Data(_) => {
                let mut out = Vec::new();
                for seg in s.conn.readable_segments().as_slice() {
                    let take = seg.len.min(max - out.len());
                    for (i, st) in s.rbuf_state[seg.offset..seg.offset + take]
                        .iter_mut()
                        .enumerate()
                    {
                        assert_eq!(
                            *st,
                            ByteState::Filled,
                            "reader told to read byte {} which was never written",
                            seg.offset + i
                        );
                        *st = ByteState::Free;
                    }
                    out.extend_from_slice(&s.rbuf[seg.offset..seg.offset + take]);
                    if out.len() == max {
                        break;
                    }
                }
                s.conn
                    .consume(out.len())
                    .expect("consume what was readable");
                ReadOutcome::Data(out)
            }
            ReadStatus::Blocked => ReadOutcome::Blocked,
            ReadStatus::Eof => ReadOutcome::Eof,
            ReadStatus::Failed(e) => ReadOutcome::Failed(e),
        };
        self.pump_control(side);
        out
    }

    /// Whether some pending event could unblock a write of `side`: one of its signaled sends
    /// has not completed (its completion returns send-queue and send-ring space of it and of
    /// every unsignaled send before it), a message to it is on the wire or in its CQ, data of
    /// its is on the wire to the peer (once read, it produces a credit update), or the peer has
    /// a credit update due or unread data whose reading will produce one. This is the "no
    /// lost wake-up" condition.
    pub(crate) fn write_wakeup_pending(&self, side: usize) -> bool {
        let me = &self.sides[side];
        let peer = &self.sides[1 - side];
        if me.completion_pending() || !me.cq.is_empty() || !self.wires[1 - side].is_empty() {
            return true;
        }
        if self.wires[side]
            .iter()
            .any(|wr| matches!(wr, Wr::Data { .. }))
        {
            return true;
        }
        if peer.conn.readable_segments().total() > 0 || !peer.cq.is_empty() {
            return true;
        }
        let mut probe = peer.conn.clone();
        probe.poll_control().is_some()
    }

    /// Whether anything at all can still happen without an application call.
    pub(crate) fn busy(&self) -> bool {
        (0..2).any(|i| !self.wires[i].is_empty() || !self.sides[i].cq.is_empty())
    }

    /// Deliver and poll everything on both sides until nothing moves (no application calls).
    pub(crate) fn settle(&mut self) -> Result<(), ProtoError> {
        for _ in 0..100_000 {
            let mut moved = 0;
            for i in 0..2 {
                moved += self.pump_control(i);
                moved += self.deliver_all(i);
                moved += self.poll_cq(i, usize::MAX)?;
            }
            if moved == 0 && !self.busy() {
                return Ok(());
            }
        }
        panic!("simulation did not settle");
    }

    /// Test hook: the simulator's count of filled-but-unconsumed bytes at `side`.
    pub(crate) fn filled_bytes(&self, side: usize) -> usize {
        self.sides[side].filled_bytes()
    }

    /// Test hook: the 16 bytes of `side`'s target SGL slot.
    pub(crate) fn tsgl_slot(&self, side: usize, slot: usize) -> [u8; 16] {
        let mut b = [0u8; 16];
        b.copy_from_slice(&self.sides[side].tsgl[slot * 16..slot * 16 + 16]);
        b
    }
}

/// The deterministic byte stream side `side` writes: byte `k` of it.
pub(crate) fn stream_byte(side: usize, k: u64) -> u8 {
    (k.wrapping_mul(31) ^ (k >> 9) ^ (side as u64 * 0x5b)) as u8
}

/// `len` bytes of side `side`'s stream starting at byte `from`.
pub(crate) fn stream_bytes(side: usize, from: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| stream_byte(side, from + i))
        .collect()
}

/// Where `addr` lies past `base`, for a write the simulated device checks; `below` is the panic
/// message when it lies before it.
fn offset(addr: u64, base: u64, below: &str) -> usize {
    addr.checked_sub(base).expect(below) as usize
}
