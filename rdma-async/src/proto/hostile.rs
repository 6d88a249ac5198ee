//! A hostile rsockets peer against one honest [`Connection`], driven by a byte string.
//!
//! The same bytes drive the simulator's property tests (`sim/hostile_prop.rs`: weighted steps,
//! and random bytes) and the coverage-guided fuzz target of the receive path (`fuzz/`, through
//! `crate::__fuzz`), so a crash the fuzzer finds replays as a unit test.
//!
//! The peer does what a real peer can do over an RC queue pair and rdma_cm, with arbitrary
//! values: connection data (any 40 bytes, or valid data with odd fields), RDMA writes with
//! immediate of any length at any offset of our receive ring (the device only lets a peer write
//! inside the region its rkey names), 0-byte writes with any immediate word, SGL updates (any 16
//! bytes anywhere in our target SGL, then an SGL immediate with any limit), completing or
//! failing our sends, and disconnecting. The local application writes, reads, shuts down and
//! closes in between.
//!
//! Our side's memory is one flat array with guard zones around the send ring, the receive ring
//! and the target SGL; the driver's every access goes through it. Checked after every step (a
//! violation panics, so the property test or the fuzzer reports it):
//! - no panic in the core, whatever the peer sends;
//! - the error is sticky: once the connection reports an error it reports that same error for
//!   ever (reads after the readable bytes, writes, the state);
//! - local accesses stay inside their region and the guard zones never change;
//! - a read returns only bytes of DATA messages the core accepted, oldest first, from the ring
//!   positions the buffers we granted put them at (an independent model of our grants and the
//!   unread bytes), and at most what the peer announced: never a byte outside the ring, never
//!   one not granted and filled, never one twice; since the device reports no write address, a
//!   peer that wrote elsewhere than it announced only garbles its own data;
//! - grants never cover unread or already granted bytes, and no DATA is accepted past a grant
//!   or past the send limit we gave;
//! - everything we write lands inside what the peer granted: data inside a buffer it gave us
//!   (with its rkey) and never past its send limit, SGL updates inside its advertised target
//!   SGL; and a send-ring byte is not reused before its write completed;
//! - with a lending ring (zero-copy reads), every grant names a key that reaches that half,
//!   a window is bound before the grant that names it, and bytes are lent only from a half no
//!   key reaches any more (its first registration deregistered, its window's invalidation
//!   completed); the peer's device writes only through keys that still reach a half.

use std::collections::VecDeque;

use super::config::{Config, RS_SGL_SIZE};
use super::conn_data::{CONN_DATA_LEN, ConnData};
use super::connection::{Connection, LocalLayout, ReadStatus, RecvEvent, TARGET_SGL_BYTES};
use super::error::{ProtoError, ProtoErrorKind};
use super::grant_queue::GrantQueue;
use super::imm::Op;
use super::plan::{ControlKind, ControlWrite, DataWrite, LendStep};
use super::ring_access::RingKeys;
use super::sender::WriteCall;
use super::sge::{ByteOrder, RsSge};

const RBUF_ADDR: u64 = 0x7f00_1000_0000;
const RBUF_RKEY: u32 = 0x1001;
const TSGL_ADDR: u64 = 0x7f00_9000_0000;
const TSGL_RKEY: u32 = 0x1002;
/// Where the honest-looking parts of the peer's memory are.
const PEER_ARENA: u64 = 0x5500_0000_0000;
const PEER_RBUF_KEY: u32 = 0x2001;
const PEER_TSGL_KEY: u32 = 0x2002;
/// A lending ring's keys: each half's first registration, and each half's window.
const RING_KEYS: RingKeys = RingKeys {
    initial: [0x1100, 0x1200],
    window: [0x3300, 0x3400],
};

/// Bytes of guard zone around each local region.
const GUARD: usize = 256;
/// The guard zones' content.
const GUARD_BYTE: u8 = 0xA5;
/// Steps per run: bounds the work per input.
const MAX_STEPS: usize = 4000;

/// What one run did, for tests that want to know a path was reached.
#[derive(Debug, Clone, Default)]
pub(crate) struct Outcome {
    /// The peer's connection data was accepted.
    pub(crate) connected: bool,
    /// Receive completions the core accepted, by what they were.
    pub(crate) data_events: usize,
    pub(crate) sgl_events: usize,
    pub(crate) credit_events: usize,
    pub(crate) ctrl_events: usize,
    /// Bytes the application read.
    pub(crate) bytes_read: usize,
    /// Of those, bytes lent from the ring (a lending ring's zero-copy reads).
    pub(crate) bytes_lent: usize,
    /// Window invalidations a lending ring posted (halves lent after a grant through a window).
    pub(crate) invalidations: usize,
    /// Data writes we posted.
    pub(crate) data_writes: usize,
    /// The sticky error at the end.
    pub(crate) error: Option<ProtoError>,
}

/// Reads the input as little values; past the end everything is 0.
struct Input<'a> {
    bytes: &'a [u8],
}

impl Input<'_> {
    fn u8(&mut self) -> u8 {
        match self.bytes.split_first() {
            Some((&b, rest)) => {
                self.bytes = rest;
                b
            }
            None => 0,
        }
    }

    fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A region of our flat memory.
#[derive(Debug, Clone, Copy)]
struct Region {
    base: usize,
    len: usize,
}

/// Our side: the core, its memory with guard zones, and the model the checks compare with.
struct Local {
    conn: Connection,
    config: Config,
    mem: Vec<u8>,
    sbuf: Region,
    rbuf: Region,
    tsgl: Region,
    /// Posted writes not completed, oldest first (a completion frees its send-ring bytes).
    posted: VecDeque<(u64, Vec<(usize, usize)>)>,
    recv_posted: u32,
    /// The model of the receive ring: the unread bytes of accepted DATA are `filled` bytes from
    /// ring offset `read_pos` (wrapping); the granted and not yet filled bytes are the unfilled
    /// tails of `grants`; every other byte is free.
    read_pos: usize,
    grants: GrantQueue,
    /// Unread bytes of accepted DATA.
    filled: usize,
    /// DATA messages accepted (mod 2^16), and the newest send limit we gave the peer.
    data_accepted: u16,
    our_limit: u16,
    error: Option<ProtoError>,
    outcome: Outcome,
    /// With a lending ring: which keys reach which half.
    keys: Option<Vec<RingKey>>,
}

/// A key of a lending ring, and whether the peer's device can still write through it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RingKey {
    half: usize,
    key: u32,
    state: KeyState,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    Live,
    /// Its invalidation was posted with this id and has not completed successfully.
    Invalidating(u64),
    Dead,
}

/// The peer: what it advertised, so our writes can be checked against it.
struct Peer {
    order: ByteOrder,
    credits: u16,
    target_sgl: (u64, u32, u64),
    /// Every buffer the peer granted us: (addr, key, length).
    granted: Vec<(u64, u32, u64)>,
    /// DATA messages it received from us (its honest send limit is this plus its credits).
    data_received: u16,
    /// The newest send limit we took from it (its credits until the first update).
    limit: u16,
    /// Honest-looking buffers handed out so far.
    fresh: u64,
}

impl Local {
    fn new(config: Config, lending: bool) -> Self {
        let sbuf_len = config.sbuf_size() as usize;
        let rbuf_len = config.rbuf_size() as usize;
        let sbuf = Region {
            base: GUARD,
            len: sbuf_len,
        };
        let rbuf = Region {
            base: sbuf.base + sbuf_len + GUARD,
            len: rbuf_len,
        };
        let tsgl = Region {
            base: rbuf.base + rbuf_len + GUARD,
            len: TARGET_SGL_BYTES,
        };
        let total = tsgl.base + TARGET_SGL_BYTES + GUARD;
        let layout = LocalLayout {
            rbuf_addr: RBUF_ADDR,
            rbuf_rkey: RBUF_RKEY,
            target_sgl_addr: TSGL_ADDR,
            target_sgl_rkey: TSGL_RKEY,
            ring_keys: lending.then_some(RING_KEYS),
        };
        let conn = Connection::new(config, layout);
        let config = *conn.config();
        let mut local = Self {
            conn,
            config,
            mem: vec![GUARD_BYTE; total],
            sbuf,
            rbuf,
            tsgl,
            posted: VecDeque::new(),
            recv_posted: config.rq_size(),
            read_pos: 0,
            data_accepted: 0,
            our_limit: config.credits(),
            grants: GrantQueue::default(),
            filled: 0,
            error: None,
            outcome: Outcome::default(),
            keys: lending.then(|| {
                (0..2)
                    .map(|half| RingKey {
                        half,
                        key: RING_KEYS.initial[half],
                        state: KeyState::Live,
                    })
                    .collect()
            }),
        };
        for r in [sbuf, rbuf, tsgl] {
            local.mem[r.base..r.base + r.len].fill(0);
        }
        local
    }

    /// The flat range of `len` bytes at `offset` of `region`; panics outside it.
    fn span(region: Region, offset: usize, len: usize, what: &str) -> std::ops::Range<usize> {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= region.len),
            "{what}: [{offset}, +{len}) is outside its {}-byte region",
            region.len
        );
        region.base + offset..region.base + offset + len
    }

    /// Runs after every step: each zone is one slice comparison (a `memcmp`), not a loop the
    /// fuzzer's instrumentation counts byte by byte, which made this most of a step's cost.
    fn check_guards(&self) {
        const ZONE: [u8; GUARD] = [GUARD_BYTE; GUARD];
        let regions = [self.sbuf, self.rbuf, self.tsgl];
        let mut at = 0;
        for r in regions {
            assert!(
                self.mem[at..r.base] == ZONE[..r.base - at],
                "a guard zone before byte {} changed",
                r.base
            );
            at = r.base + r.len;
        }
        assert!(
            self.mem[at..] == ZONE[..self.mem.len() - at],
            "the last guard zone changed"
        );
    }

    /// Model: we granted `[start, start + len)` of the ring into the peer's slot `slot`.
    fn model_grant(&mut self, slot: u32, start: usize, len: usize) {
        assert!(
            start.checked_add(len).is_some_and(|e| e <= self.rbuf.len),
            "granted [{start}, +{len}) outside the {}-byte receive ring",
            self.rbuf.len
        );
        let ring = self.rbuf.len;
        let busy = self
            .grants
            .iter()
            .map(|g| (g.start + g.filled, g.len - g.filled))
            .chain([(self.read_pos, self.filled)]);
        for (from, n) in busy {
            assert!(
                !ring_overlap(ring, (start, len), (from, n)),
                "granted [{start}, +{len}) of the receive ring over unread or granted bytes \
                 [{from}, +{n})"
            );
        }
        self.grants.push(slot as usize, start, len);
    }

    /// Model: the core accepted `len` bytes of DATA at ring offset `offset`.
    fn model_data(&mut self, offset: usize, len: usize) {
        let ahead = self.our_limit.wrapping_sub(self.data_accepted);
        assert!(
            ahead != 0 && ahead <= self.config.credits(),
            "DATA message {} accepted past the send limit {} we gave",
            self.data_accepted,
            self.our_limit
        );
        self.data_accepted = self.data_accepted.wrapping_add(1);
        if len == 0 {
            return;
        }
        self.grants.fill(offset, len);
        assert_eq!(
            offset,
            (self.read_pos + self.filled) % self.rbuf.len,
            "DATA accepted at ring offset {offset}, not right after the unread bytes"
        );
        self.filled += len;
    }

    /// The sticky-error check: once there is an error, it never changes.
    fn check_error(&mut self, returned: Option<&ProtoError>) {
        let now = self.conn.error().cloned();
        match (&self.error, &now) {
            (Some(first), Some(now)) => {
                assert_eq!(first, now, "the sticky error changed");
            }
            (Some(first), None) => panic!("the error {first} went away"),
            (None, _) => self.error = now.clone(),
        }
        if let Some(err) = returned {
            assert!(
                self.error.is_some(),
                "a call returned {err} but the connection has no error"
            );
        }
        if let Some(err) = &self.error {
            // Writes report it at once; reads after the readable bytes.
            match self.conn.prepare_write(&mut WriteCall::new(), 1) {
                Err(super::connection::WriteError::Failed(e)) => assert_eq!(&e, err),
                other => panic!("write on a failed connection: {other:?}"),
            }
            if self.conn.readable_segments().as_slice().is_empty() {
                assert_eq!(self.conn.read_status(), ReadStatus::Failed(err.clone()));
            }
            assert!(
                self.conn.poll_control().is_none(),
                "a failed connection posts"
            );
        }
    }

    /// Post what the core wants to send now, checking each write against the peer's grants.
    fn pump_control(&mut self, peer: &mut Peer) {
        while let Some(c) = self.conn.poll_control() {
            self.post_control(c, peer);
        }
    }

    fn post_control(&mut self, c: ControlWrite, peer: &mut Peer) {
        if let ControlKind::SglUpdate { limit, .. } | ControlKind::Credits { limit } = c.kind {
            self.our_limit = limit;
        }
        if let Some(bind) = c.bind {
            let keys = self
                .keys
                .as_mut()
                .expect("a window bind on a ring that does not lend");
            assert!(
                matches!(c.kind, ControlKind::SglUpdate { .. }),
                "a bind without a grant"
            );
            assert!(
                keys.iter()
                    .all(|k| k.half != bind.half || k.state != KeyState::Live),
                "half {} bound again while a key still reaches it",
                bind.half
            );
            keys.push(RingKey {
                half: bind.half,
                key: bind.rkey,
                state: KeyState::Live,
            });
            // Before the grant in the send queue.
            self.posted.push_back((bind.wr_id, Vec::new()));
        }
        match (c.kind, c.payload) {
            (ControlKind::SglUpdate { slot, limit }, Some(payload)) => {
                let (addr, key, bytes) = peer.target_sgl;
                assert_eq!(c.rkey, key, "SGL update with another rkey than the peer's");
                let end = c.remote_addr.checked_add(RsSge::LEN as u64);
                assert!(
                    c.remote_addr >= addr && end.is_some_and(|e| e <= addr + bytes),
                    "SGL update at {:#x} outside the peer's target SGL [{addr:#x}, +{bytes})",
                    c.remote_addr
                );
                assert_eq!(c.remote_addr, addr + u64::from(slot) * RsSge::LEN as u64);
                assert_eq!(c.imm, Some(Op::Sgl(limit).encode()));
                let sge = RsSge::from_bytes(payload, peer.order);
                let start = sge
                    .addr
                    .checked_sub(RBUF_ADDR)
                    .expect("granted a buffer below the receive ring")
                    as usize;
                match &self.keys {
                    Some(keys) => {
                        let half = start / (self.rbuf.len / 2);
                        assert!(
                            keys.iter().any(|k| k.half == half
                                && k.key == sge.key
                                && k.state == KeyState::Live),
                            "half {half} granted with key {:#x}, which does not reach it",
                            sge.key
                        );
                    }
                    None => assert_eq!(sge.key, RBUF_RKEY, "granted a buffer of another region"),
                }
                self.model_grant(slot, start, sge.length as usize);
            }
            (ControlKind::SglUpdate { .. }, None) => panic!("SGL update without payload"),
            (_, Some(_)) => panic!("{:?} with a payload", c.kind),
            (_, None) => assert_eq!((c.remote_addr, c.rkey), (0, 0), "{:?}", c.kind),
        }
        self.posted.push_back((c.wr_id, Vec::new()));
    }

    fn post_data(&mut self, w: DataWrite, peer: &mut Peer) {
        assert!(w.len > 0);
        let granted = peer.granted.iter().any(|&(addr, key, len)| {
            key == w.rkey
                && w.remote_addr >= addr
                && w.remote_addr
                    .checked_add(w.len as u64)
                    .is_some_and(|end| end <= addr.saturating_add(len))
        });
        assert!(
            granted,
            "data write of {} bytes at {:#x} (rkey {:#x}) outside every buffer the peer granted",
            w.len, w.remote_addr, w.rkey
        );
        assert_eq!(w.imm, Op::Data(w.len as u32).encode());
        let ahead = peer.limit.wrapping_sub(peer.data_received);
        assert!(
            (1..=peer.credits).contains(&ahead),
            "DATA message {} sent past the peer's send limit {}",
            peer.data_received,
            peer.limit
        );
        let mut segs = Vec::new();
        if w.inline {
            assert!(w.sbuf.as_slice().is_empty());
            assert!(w.len <= self.config.inline_size() as usize);
        } else {
            let mut total = 0;
            for seg in w.sbuf.as_slice() {
                let span = Self::span(self.sbuf, seg.offset, seg.len, "send-ring copy");
                let end = seg.offset + seg.len;
                for (_, busy) in &self.posted {
                    for &(off, len) in busy {
                        assert!(
                            end <= off || off + len <= seg.offset,
                            "send-ring bytes [{}, {end}) reused before the completion of the \
                             write that holds [{off}, {})",
                            seg.offset,
                            off + len
                        );
                    }
                }
                // What the bytes are does not matter to the checks; that they land here does.
                self.mem[span].fill(0x5a);
                total += seg.len;
                segs.push((seg.offset, seg.len));
            }
            assert_eq!(total, w.len);
        }
        peer.data_received = peer.data_received.wrapping_add(1);
        self.outcome.data_writes += 1;
        self.posted.push_back((w.wr_id, segs));
    }

    fn app_write(&mut self, len: usize, peer: &mut Peer) {
        let mut call = WriteCall::new();
        let mut left = len;
        while left > 0 {
            match self.conn.prepare_write(&mut call, left) {
                Ok(w) => {
                    left -= w.len;
                    self.post_data(w, peer);
                }
                Err(_) => break,
            }
        }
        self.check_error(None);
    }

    fn app_read(&mut self, max: usize) {
        let status = self.conn.read_status();
        let ReadStatus::Data(n) = status else {
            if let ReadStatus::Failed(e) = &status {
                assert_eq!(Some(e), self.error.as_ref());
            }
            return;
        };
        let mut got = 0;
        for seg in self.conn.readable_segments().as_slice() {
            let take = seg.len.min(max - got);
            // The reader is told about accepted DATA only, oldest byte first.
            assert_eq!(
                seg.offset,
                (self.read_pos + got) % self.rbuf.len,
                "the reader was told to read ring offset {} but the oldest unread byte is at {}",
                seg.offset,
                (self.read_pos + got) % self.rbuf.len
            );
            let span = Self::span(self.rbuf, seg.offset, take, "receive-ring read");
            // What the application gets: ring bytes only.
            let _ = &self.mem[span];
            got += take;
            if got == max {
                break;
            }
        }
        assert!(
            got <= n && n <= self.filled,
            "{n} bytes readable but only {} of accepted DATA are unread",
            self.filled
        );
        self.read_pos = (self.read_pos + got) % self.rbuf.len;
        self.filled -= got;
        self.conn.consume(got).expect("consume what was readable");
        self.outcome.bytes_read += got;
    }

    /// A zero-copy read of up to `max` bytes (a lending ring): carries out what the core asks
    /// (deregistering a half's first key, posting an invalidation) and, once it lends, checks
    /// that no key reaches the lent bytes' half; copies where the core says to copy.
    fn app_lend(&mut self, max: usize) {
        for _ in 0..3 {
            let step = self.conn.lend();
            let keys = self
                .keys
                .as_mut()
                .expect("lending on a ring that does not lend");
            match step {
                LendStep::Ready { offset, len } => {
                    let half_len = self.rbuf.len / 2;
                    let half = offset / half_len;
                    assert!(
                        keys.iter()
                            .all(|k| k.half != half || k.state == KeyState::Dead),
                        "lent bytes of half {half}, which a key still reaches: {keys:?}"
                    );
                    assert_eq!(offset, self.read_pos, "lent bytes other than the oldest");
                    assert!(len > 0 && len <= self.filled && offset + len <= (half + 1) * half_len);
                    let take = len.min(max);
                    let _ = &self.mem[Self::span(self.rbuf, offset, take, "lent bytes")];
                    self.read_pos = (self.read_pos + take) % self.rbuf.len;
                    self.filled -= take;
                    self.conn.consume(take).expect("consume lent bytes");
                    self.outcome.bytes_read += take;
                    self.outcome.bytes_lent += take;
                    return;
                }
                LendStep::Deregister { half, key } => {
                    let k = keys
                        .iter_mut()
                        .find(|k| (k.half, k.key) == (half, key))
                        .expect("deregistering a key the ring never had");
                    assert_eq!(k.state, KeyState::Live);
                    assert_eq!(key, RING_KEYS.initial[half], "deregistering a window's key");
                    k.state = KeyState::Dead;
                    self.conn.deregistered(half, key);
                }
                LendStep::Invalidate { wr_id, half, key } => {
                    let k = keys
                        .iter_mut()
                        .find(|k| (k.half, k.key) == (half, key) && k.state == KeyState::Live)
                        .expect("invalidating a key that does not reach the half");
                    k.state = KeyState::Invalidating(wr_id);
                    self.posted.push_back((wr_id, Vec::new()));
                    self.outcome.invalidations += 1;
                }
                LendStep::Copy => return self.app_read(max),
                LendStep::Wait | LendStep::Empty => return,
            }
        }
    }

    /// Whether the peer's device can write `len` bytes at ring offset `at`: a key must still
    /// reach every half they touch (always, on a ring that does not lend).
    fn reachable(&self, at: usize, len: usize) -> bool {
        let Some(keys) = &self.keys else {
            return true;
        };
        let half_len = self.rbuf.len / 2;
        let last = (at + len.max(1) - 1) / half_len;
        (at / half_len..=last).all(|half| {
            keys.iter()
                .any(|k| k.half == half && k.state != KeyState::Dead)
        })
    }

    /// The device delivers a write with immediate from the peer (if a receive is posted).
    fn recv(&mut self, peer: &mut Peer, imm: Option<u32>, byte_len: u32) {
        if self.recv_posted == 0 {
            // RNR: the peer's hardware retries; nothing arrives.
            return;
        }
        self.recv_posted -= 1;
        let tsgl = self.tsgl;
        let mem = &self.mem;
        let read_slot = |slot: usize| {
            let span = Self::span(tsgl, slot * RsSge::LEN, RsSge::LEN, "target SGL read");
            let mut b = [0u8; 16];
            b.copy_from_slice(&mem[span]);
            b
        };
        // The driver's entry, which handles plain DATA without the full decode, must leave the
        // connection exactly as the full handling does, and answer the same.
        let mut driver_view = self.conn.clone();
        let driver_result = driver_view.recv_completed(imm, byte_len, read_slot);
        let mut slot_read = None;
        let result = self.conn.handle_recv_completion(imm, byte_len, |slot| {
            let b = read_slot(slot);
            slot_read = Some(b);
            b
        });
        assert_eq!(
            driver_result,
            result
                .as_ref()
                .map(|action| action.repost)
                .map_err(Clone::clone),
            "the driver's receive entry answered otherwise than the full handling"
        );
        assert_eq!(
            format!("{driver_view:?}"),
            format!("{:?}", self.conn),
            "the driver's receive entry left the connection otherwise than the full handling"
        );
        match result {
            Ok(action) => {
                if action.repost {
                    self.recv_posted += 1;
                }
                match action.event {
                    RecvEvent::Data { offset, len } => {
                        self.outcome.data_events += 1;
                        self.model_data(offset, len);
                    }
                    RecvEvent::SglUpdate { limit, .. } => {
                        peer.limit = limit;
                        // What the peer granted is what its writes left in the slot.
                        let b = slot_read.expect("an SGL update read its slot");
                        let sge = RsSge::from_bytes(b, ByteOrder::native());
                        peer.granted
                            .push((sge.addr, sge.key, u64::from(sge.length)));
                        self.outcome.sgl_events += 1;
                    }
                    RecvEvent::Credits { limit } => {
                        peer.limit = limit;
                        self.outcome.credit_events += 1;
                    }
                    RecvEvent::Ctrl(_) => self.outcome.ctrl_events += 1,
                    RecvEvent::Ignored => {}
                }
                self.check_error(None);
            }
            Err(e) => {
                assert_eq!(e.kind(), ProtoErrorKind::PeerViolation, "{e}");
                self.check_error(Some(&e));
            }
        }
    }

    fn complete(&mut self, n: usize, ok: bool) {
        for _ in 0..n {
            // Its send-ring bytes are free again once it leaves `posted`.
            let Some((wr_id, _)) = self.posted.pop_front() else {
                return;
            };
            // A successful invalidation ends its key.
            if let Some(k) = self
                .keys
                .iter_mut()
                .flatten()
                .find(|k| ok && k.state == KeyState::Invalidating(wr_id))
            {
                k.state = KeyState::Dead;
            }
            let r = self.conn.handle_send_completion(wr_id, ok);
            self.check_error(r.as_ref().err());
        }
    }
}

/// The sizes, and whether the ring lends its bytes (the same byte's top bit).
fn config(input: &mut Input<'_>) -> (Config, bool) {
    let choice = input.u8();
    let config = match choice % 4 {
        0 => Config::new(),
        1 => Config::new()
            .with_sbuf_size(8192)
            .with_rbuf_size(8192)
            .with_sq_size(16)
            .with_rq_size(16),
        2 => Config::new()
            .with_sbuf_size(4096)
            .with_rbuf_size(256)
            .with_sq_size(16)
            .with_rq_size(16)
            .with_inline_size(0),
        _ => Config::new()
            .with_sbuf_size(4096 + u32::from(input.u16()))
            .with_rbuf_size(64 + u32::from(input.u16()))
            .with_sq_size(u32::from(input.u8()))
            .with_rq_size(u32::from(input.u8()))
            .with_inline_size(u32::from(input.u8())),
    };
    (config, choice & 0x80 != 0)
}

/// The peer's connection data: valid with odd values most of the time, sometimes raw bytes.
fn peer_conn_data(input: &mut Input<'_>) -> ([u8; CONN_DATA_LEN], Peer) {
    let kind = input.u8();
    let net = kind & 0x10 != 0;
    let mut data = ConnData {
        version: 1,
        flags: u8::from(net),
        credits: 16,
        target_iomap_size: 0,
        target_sgl: RsSge {
            addr: PEER_ARENA,
            key: PEER_TSGL_KEY,
            length: 2,
        },
        data_buf: RsSge {
            addr: PEER_ARENA + 0x1000,
            key: PEER_RBUF_KEY,
            length: 4096,
        },
    };
    match kind % 8 {
        0 => {
            let mut raw = [0u8; CONN_DATA_LEN];
            raw.iter_mut().for_each(|b| *b = input.u8());
            let peer = Peer::from_conn_data(ConnData::decode(&raw).ok());
            return (raw, peer);
        }
        1 => data.credits = input.u16(),
        2 => data.target_sgl.length = u32::from(input.u8()),
        3 => data.data_buf.length = input.u32(),
        4 => data.data_buf.addr = input.u64(),
        5 => data.target_sgl.addr = input.u64(),
        _ => {}
    }
    (data.encode(), Peer::from_conn_data(Some(data)))
}

impl Peer {
    fn from_conn_data(data: Option<ConnData>) -> Self {
        let data = data.unwrap_or(ConnData {
            version: 0,
            flags: 0,
            credits: 0,
            target_iomap_size: 0,
            target_sgl: RsSge::default(),
            data_buf: RsSge::default(),
        });
        Peer {
            order: data.sgl_byte_order(),
            credits: data.credits,
            target_sgl: (
                data.target_sgl.addr,
                data.target_sgl.key,
                u64::from(data.target_sgl.length) * RsSge::LEN as u64,
            ),
            granted: vec![(
                data.data_buf.addr,
                data.data_buf.key,
                u64::from(data.data_buf.length),
            )],
            data_received: 0,
            limit: data.credits,
            fresh: 0,
        }
    }

    /// A buffer that looks like a real one: in the arena, the peer's key, `len` bytes.
    fn fresh_buffer(&mut self, len: u32) -> RsSge {
        self.fresh += 1;
        RsSge {
            addr: PEER_ARENA + 0x10_0000 * self.fresh,
            key: PEER_RBUF_KEY,
            length: len,
        }
    }
}

/// One hostile run. Panics when an invariant breaks.
pub(crate) fn run(bytes: &[u8]) -> Outcome {
    let mut input = Input { bytes };
    let (config, lending) = config(&mut input);
    let mut local = Local::new(config, lending);
    let (raw, mut peer) = peer_conn_data(&mut input);
    match ConnData::decode(&raw) {
        Ok(data) => match local.conn.handle_peer_conn_data(&data) {
            Ok(()) => {
                local.outcome.connected = true;
                // Our conn data granted the first half of the ring (the peer's slot 0).
                let half = local.config.rbuf_size() as usize / 2;
                local.model_grant(0, 0, half);
            }
            Err(e) => panic!("decoded conn data refused: {e}"),
        },
        Err(e) => {
            assert_eq!(e.kind(), ProtoErrorKind::InvalidConnData, "{e}");
            // The driver rejects the connection; the core stays unconnected and refuses use.
            assert!(local.conn.prepare_write(&mut WriteCall::new(), 1).is_err());
            assert_eq!(local.conn.read_status(), ReadStatus::Blocked);
            local.outcome.error = local.conn.error().cloned();
            return local.outcome;
        }
    }
    local.pump_control(&mut peer);
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        step(&mut local, &mut peer, &mut input);
        local.pump_control(&mut peer);
        local.check_error(None);
        local.check_guards();
        assert_eq!(
            local.filled,
            local
                .conn
                .readable_segments()
                .as_slice()
                .iter()
                .map(|s| s.len)
                .sum::<usize>(),
            "the core's readable bytes differ from the accepted DATA not yet read"
        );
    }
    // Drain: everything readable can be read, then the sticky error (if any) shows.
    local.app_read(usize::MAX);
    local.check_error(None);
    local.check_guards();
    local.outcome.error = local.error.clone();
    local.outcome
}

fn step(local: &mut Local, peer: &mut Peer, input: &mut Input<'_>) {
    let rbuf_len = local.rbuf.len;
    // Mostly what a peer may do, with odd values; now and then something no peer may do (which
    // ends the connection, so it must not be the common case or nothing deep is reached).
    match input.u8() % 40 {
        // A DATA write where it belongs, with the honest immediate.
        0..=9 => {
            let (at, left) = local
                .grants
                .front()
                .map_or((0, 0), |g| (g.start + g.filled, g.len - g.filled));
            let len = match u32::try_from(left) {
                // At most 4 KiB: the model's checks cost a step per byte.
                Ok(left) if left > 0 && !input.u8().is_multiple_of(32) => {
                    1 + u32::from(input.u16()) % left.min(4096)
                }
                _ => u32::from(input.u16()),
            };
            if let Some(written) = peer_write(local, at, len) {
                local.recv(peer, Some(Op::Data(written).encode()), written);
            }
        }
        // A write of any length anywhere in the ring, with any immediate.
        10 => {
            let at = input.u32() as usize % rbuf_len.max(1);
            let len = input.u32() % (rbuf_len as u32 + 1);
            let word = match input.u8() % 3 {
                0 => Op::Data(len).encode(),
                1 => Op::Data(input.u32() & 0x1fff_ffff).encode(),
                _ => input.u32(),
            };
            if let Some(written) = peer_write(local, at, len) {
                local.recv(peer, Some(word), written);
            }
        }
        // A 0-byte write with any immediate, or a receive without one.
        11 => {
            let word = input.u32();
            let imm = (!input.u8().is_multiple_of(16)).then_some(word);
            let byte_len = if input.u8().is_multiple_of(8) {
                input.u32()
            } else {
                0
            };
            local.recv(peer, imm, byte_len);
        }
        // A control message: SHUTDOWN, DISCONNECT, or a keepalive sent with an immediate.
        12 => {
            let code = u32::from(input.u8() % 3);
            local.recv(peer, Some(0xE000_0000 | code), 0);
        }
        // Credits only: an honest limit or any limit.
        13..=15 => {
            let limit = if input.u8().is_multiple_of(2) {
                peer.data_received.wrapping_add(peer.credits)
            } else {
                input.u16()
            };
            local.recv(peer, Some(Op::Sgl(limit).encode()), 0);
        }
        // An SGL update: 16 bytes into our target SGL, then the immediate.
        16..=19 => {
            let choice = input.u8();
            let sge = match choice % 4 {
                0 | 1 => peer.fresh_buffer(1 + u32::from(input.u16())),
                2 => RsSge {
                    addr: input.u64(),
                    key: input.u32(),
                    length: input.u32(),
                },
                _ => peer.fresh_buffer(input.u32()),
            };
            let slot_off = if choice & 0xC0 != 0xC0 {
                // The slot the protocol says is next (1, 0, 1, ...), as an honest peer writes.
                (local.outcome.sgl_events + 1) % RS_SGL_SIZE * RsSge::LEN
            } else {
                usize::from(input.u8()) % (TARGET_SGL_BYTES - RsSge::LEN + 1)
            };
            let span = Local::span(local.tsgl, slot_off, RsSge::LEN, "peer SGL write");
            local.mem[span].copy_from_slice(&sge.to_bytes(ByteOrder::native()));
            let limit = if choice & 0x30 != 0x30 {
                peer.data_received.wrapping_add(peer.credits)
            } else {
                input.u16()
            };
            let byte_len = if choice & 0x0C != 0x0C {
                16
            } else {
                u32::from(input.u8())
            };
            local.recv(peer, Some(Op::Sgl(limit).encode()), byte_len);
        }
        20..=26 => {
            let len = usize::from(input.u16());
            local.app_write(len, peer);
        }
        27..=32 => {
            let max = 1 + usize::from(input.u16());
            if local.keys.is_some() && input.u8().is_multiple_of(2) {
                local.app_lend(max);
            } else {
                local.app_read(max);
            }
        }
        33..=36 => {
            let n = usize::from(input.u8() % 16);
            let ok = !input.u8().is_multiple_of(32);
            local.complete(n, ok);
        }
        37 => match input.u8() % 8 {
            0 => local.conn.shutdown_write(),
            1 => local.conn.close(),
            2 => local.conn.handle_disconnected(),
            3 => local.conn.queue_keepalive(),
            _ => local.app_read(usize::MAX),
        },
        _ => local.complete(usize::MAX, true),
    }
}

/// Whether two ranges `(start, len)` of a ring of `ring` bytes share a byte.
fn ring_overlap(ring: usize, a: (usize, usize), b: (usize, usize)) -> bool {
    let linear = |(start, len): (usize, usize)| {
        let start = start % ring;
        let first = len.min(ring - start);
        [(start, start + first), (0, len - first)]
    };
    linear(a).iter().any(|&(a0, a1)| {
        linear(b)
            .iter()
            .any(|&(b0, b1)| a0 < a1 && b0 < b1 && a0 < b1 && b0 < a1)
    })
}

/// The peer's device writes `len` bytes at ring offset `at`; the region's bounds stop it at the
/// end of the ring (a longer write fails at the device and nothing arrives, so clip it).
/// Returns the bytes written, or `None` when no key reaches them any more (a lending ring's
/// revoked half): the device refuses the write and nothing arrives.
fn peer_write(local: &mut Local, at: usize, len: u32) -> Option<u32> {
    let at = at.min(local.rbuf.len);
    let len = (len as usize).min(local.rbuf.len - at);
    if !local.reachable(at, len) {
        return None;
    }
    let span = Local::span(local.rbuf, at, len, "peer data write");
    local.mem[span].fill(0x3c);
    Some(len as u32)
}
