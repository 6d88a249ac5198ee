//! Target `stream_driver`: the stream driver itself (`StreamCore`, both ends) over the
//! in-process fake device, under a random interleaving of writes, reads, peeks and shutdowns
//! by either end, futures polled once and dropped, failed posts and polls, completions held
//! back and released, and disconnects; with the ring sizes, queue depths and the message
//! sequence numbers' start (near the 2^16 wrap) taken from the input.
//!
//! Futures are polled by hand with counting wakers, without a runtime's scheduler (a Tokio
//! runtime is only entered, for the stream's timer), so a run is deterministic and fast. Each
//! direction carries a known pattern (byte = f(direction, stream offset)), which makes the
//! invariants checkable:
//! - every byte read is the next one expected: none twice, none out of order, none invented,
//!   none beyond what the writer's calls reported written; a peek shows the same bytes;
//! - a write that returns `Pending` wrote nothing, and one that returns `Ready` wrote at least
//!   a byte; a write after the writer's shutdown writes nothing;
//! - end of stream comes only after the peer's shutdown, and only once every byte the peer
//!   reported written was read; it stays end of stream (or, once the wire broke, an error);
//! - an `io::Error` comes only after an injected failure, a disconnect, or (for a write) the
//!   writer's own shutdown, and never a panic;
//! - a future that was `Pending` and becomes `Ready` was woken in between (no lost wake-up);
//! - when nothing broke the wire, at the end (completions released) draining both ends
//!   finishes every pending write and shutdown and delivers every byte written, and end of
//!   stream after a finished shutdown.
//!
//! After every step (and after the final drain) it also reads the books of both drivers'
//! protocol state and of the fake device's queues ([`Run::check_books`]), whatever was
//! injected:
//! - send credits: a sender's limit is never behind the messages it sent (credits never
//!   negative) nor more than the peer's initial credits ahead of them (never above what was
//!   granted), and never ahead of the newest limit the peer's receiver gave;
//! - ring space and queue entries: a sender's free send-ring bytes and free data send-queue
//!   entries never exceed the ring and the queue, a receiver's ungranted ring bytes never
//!   exceed its ring;
//! - receives: every receive of an end is posted, or its completion is queued (being handled),
//!   or it is consumed and held back by the driver to go back with others (fewer than the
//!   spares the queue holds beyond the credits), never lost and never two of these: the three
//!   add up to the receive queue's depth while the end is connected, and never exceed it (after
//!   the end's connection ended it stops reposting, as C does);
//! - the send queue: the send work requests the fake holds (posted, and neither their own
//!   completion nor a later one polled, as a device frees entries) never exceed its depth.
//!
//! No lent buffer is reached: the fake refuses attached buffers and the rings do not lend
//! (checked at the end: no window was ever bound).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};

use tokio::io::ReadBuf;

use super::input::Input;
use crate::proto::Config;
use crate::stream::{FakeStreams, SPARE_RECVS};

/// At most this many steps of an input are run (a bigger input is the same run).
const MAX_STEPS: usize = 512;
/// Rounds of the final drain without progress before it gives up.
const DRAIN_ROUNDS: usize = 4096;

/// The period of the pattern: a prime, so no ring size or chunk length is a multiple of it,
/// and a misplaced or repeated chunk shows.
const PERIOD: usize = 65_521;

/// One period of the pattern, computed once.
fn table() -> &'static [u8; PERIOD] {
    static TABLE: std::sync::OnceLock<Box<[u8; PERIOD]>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = Box::new([0; PERIOD]);
        for (i, b) in table.iter_mut().enumerate() {
            *b = ((i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8;
        }
        table
    })
}

/// Fills `out` with direction `from`'s bytes from stream offset `at` on.
fn fill(from: usize, at: u64, out: &mut [u8]) {
    let table = table();
    let mut start = (at as usize + from * (PERIOD / 2)) % PERIOD;
    for chunk in out.chunks_mut(PERIOD) {
        let len = chunk.len();
        let first = len.min(PERIOD - start);
        chunk[..first].copy_from_slice(&table[start..start + first]);
        chunk[first..].copy_from_slice(&table[..len - first]);
        start = (start + len) % PERIOD;
    }
}

/// A waker that counts its wakes.
#[derive(Debug, Default)]
struct Count(AtomicUsize);

impl Wake for Count {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

/// A future polled once or more that returned `Pending`: its length (writes and reads) and
/// its waker.
#[derive(Debug)]
struct Pending {
    len: usize,
    wakes: Arc<Count>,
    /// The wakes counted when its last poll began: any after that (even during the poll) is
    /// one a runtime would have polled it again for.
    seen: usize,
    /// Another poll function call on the same side came after its last poll: as with Tokio's
    /// `TcpStream`, only the most recent caller's waker is kept, so it may not be woken.
    superseded: bool,
}

impl Pending {
    fn new(len: usize) -> Self {
        Pending {
            len,
            wakes: Arc::default(),
            seen: 0,
            superseded: false,
        }
    }

    fn woken(&self) -> bool {
        self.wakes.0.load(Ordering::Relaxed) > self.seen
    }

    /// Whether a runtime would have polled it again: woken since its last poll, or not
    /// promised a wake-up any more.
    fn may_be_polled(&self) -> bool {
        self.woken() || self.superseded
    }

    /// Its waker, for a poll that begins now.
    fn waker(&mut self) -> Waker {
        self.seen = self.wakes.0.load(Ordering::Relaxed);
        self.superseded = false;
        Waker::from(self.wakes.clone())
    }
}

/// The side of an end a poll function waits on.
#[derive(Debug, Clone, Copy)]
enum Side {
    Read,
    Write,
}

/// What the harness knows of one end.
#[derive(Debug, Default)]
struct End {
    /// Bytes this end's write calls reported written.
    written: u64,
    /// Bytes this end read of the peer's.
    read: u64,
    write: Option<Pending>,
    read_pending: Option<Pending>,
    shutdown: Option<Pending>,
    /// `poll_shutdown` was called (the SHUTDOWN is on its way from then on).
    shutdown_started: bool,
    shutdown_done: bool,
    /// This end read end of stream.
    eof: bool,
}

/// A length from 1 to about 256 KiB from the input, small ones as likely as large ones.
fn chunk_len(input: &mut Input<'_>) -> usize {
    let b = usize::from(input.byte());
    let unit = [1, 64, 512, 4096][b >> 6];
    (b & 63) * unit + 1
}

/// The configuration both ends use, from the input's first bytes: rings from a few bytes (so
/// they wrap often) to C's default, queues from the minimum up.
fn config(input: &mut Input<'_>) -> Config {
    let rbuf = [64, 256, 1000, 4096, 16384, 131_072][usize::from(input.byte()) % 6];
    let sbuf = [4096, 8192, 131_072][usize::from(input.byte()) % 3];
    let queues = input.byte();
    let inline = input.byte();
    Config::new()
        .with_rbuf_size(rbuf)
        .with_sbuf_size(sbuf)
        .with_rq_size(16 + u32::from(queues & 0x0f) * 4)
        .with_sq_size(16 + u32::from(queues >> 4) * 4)
        .with_inline_size(u32::from(inline))
}

struct Run {
    streams: FakeStreams,
    ends: [End; 2],
    /// A post failed or the wire was disconnected: errors may come from anywhere.
    broken: bool,
    /// A poll failure was injected: errors may come from anywhere too.
    poll_failed: bool,
    held: [bool; 2],
    /// A scratch buffer for reads.
    buf: Vec<u8>,
    /// A scratch buffer for the bytes a read should have got.
    expected: Vec<u8>,
}

/// One run of the two ends, decoded from `bytes`; panics when an invariant breaks.
pub fn stream_driver(bytes: &[u8]) {
    thread_local! {
        // The stream's timer (the blocked writer's probe) is a Tokio timer: it needs a
        // runtime to register with, never one that runs.
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("a Tokio runtime for the stream's timer");
    }
    RUNTIME.with(|runtime| {
        let _entered = runtime.enter();
        run(bytes);
    });
}

fn run(bytes: &[u8]) {
    let mut input = Input(bytes);
    let config = config(&mut input);
    // Within 255 messages of the wrap (0: no wrap soon).
    let start_seq = 0u16.wrapping_sub(u16::from(input.byte()));
    let streams = FakeStreams::connect(config, start_seq).expect("connecting over the fake");
    let mut run = Run {
        streams,
        ends: Default::default(),
        broken: false,
        poll_failed: false,
        held: [false; 2],
        buf: Vec::new(),
        expected: Vec::new(),
    };
    run.check_books();
    for _ in 0..MAX_STEPS {
        if input.is_empty() {
            break;
        }
        run.step(&mut input);
        run.check_books();
    }
    if !run.broken && !run.poll_failed {
        run.drain();
        run.check_books();
    }
    let wire = run.streams.wire();
    assert_eq!(
        wire.binds(0) + wire.binds(1),
        0,
        "no ring lends, so no window binds"
    );
}

impl Run {
    fn step(&mut self, input: &mut Input<'_>) {
        let op = input.byte();
        let end = usize::from(op >> 4) & 1;
        match op & 0x0f {
            0 | 13 => {
                let len = chunk_len(input);
                self.write(end, len);
            }
            1 | 14 => {
                let len = chunk_len(input);
                self.read(end, len);
            }
            2 => {
                let len = chunk_len(input);
                self.peek(end, len);
            }
            3 => {
                let len = chunk_len(input);
                self.try_write(end, len);
            }
            4 => {
                let len = chunk_len(input);
                self.try_read(end, len);
            }
            5 => {
                self.shutdown(end);
            }
            // Dropping a pending future: it is never polled again.
            6 => self.ends[end].write = None,
            7 => self.ends[end].read_pending = None,
            8 => {
                self.broken = true;
                self.streams.wire().fail_next_post(end);
            }
            9 => {
                self.poll_failed = true;
                self.streams.wire().fail_next_poll(end);
            }
            10 => {
                self.held[end] = !self.held[end];
                self.streams.wire().hold_completions(end, self.held[end]);
            }
            11 => {
                self.broken = true;
                self.streams.wire().disconnect();
            }
            _ => self.poll_woken(),
        }
    }

    /// The credit, ring and queue invariants of the module doc, on both ends.
    fn check_books(&self) {
        for end in 0..2 {
            let peer = 1 - end;
            let granted = self.streams.look(peer, |c| c.receiver().credit_limit());
            self.streams.look(end, |c| {
                let sender = c.sender();
                let (sent, limit, credits) =
                    (sender.sseq_no(), sender.sseq_comp(), sender.peer_credits());
                // Mod 2^16: a limit behind `sent` would be a distance near 2^16.
                assert!(
                    limit.wrapping_sub(sent) <= credits,
                    "end {end}: send limit {limit}, {sent} messages sent, {credits} credits \
                     offered: credits negative or above the grant"
                );
                assert!(
                    granted.wrapping_sub(limit) <= credits,
                    "end {end}: send limit {limit} ahead of the newest limit {granted} end \
                     {peer} gave"
                );
                assert!(
                    sender.sbuf_bytes_avail() <= sender.sbuf_size(),
                    "end {end}: {} free send-ring bytes of {}",
                    sender.sbuf_bytes_avail(),
                    sender.sbuf_size()
                );
                assert!(
                    sender.sqe_avail() <= sender.sqe_max(),
                    "end {end}: {} free data send-queue entries of {}",
                    sender.sqe_avail(),
                    sender.sqe_max()
                );
                let receiver = c.receiver();
                assert!(
                    receiver.rbuf_bytes_avail() <= receiver.rbuf_size(),
                    "end {end}: {} ungranted receive-ring bytes of {}",
                    receiver.rbuf_bytes_avail(),
                    receiver.rbuf_size()
                );
            });
            let queues = self.streams.wire().queues(end);
            let unposted = self.streams.unposted_recvs(end);
            assert!(
                unposted < SPARE_RECVS,
                "end {end}: {unposted} consumed receives held back, beyond the spares"
            );
            let receives = queues.recvs_posted + queues.recv_completions + unposted;
            assert!(
                receives <= queues.rq_depth,
                "end {end}: {queues:?}: receives posted, completed or held back beyond the queue"
            );
            if self.streams.look(end, |c| c.is_connected()) {
                assert_eq!(
                    receives, queues.rq_depth,
                    "end {end}: {queues:?}, {unposted} held back: a receive was lost while \
                     connected"
                );
            }
            assert_eq!(
                queues.looks_skipped, 0,
                "end {end}: a wait after an arm ahead slept without looking under the arm"
            );
            assert!(
                queues.sends_outstanding_max <= queues.sq_depth,
                "end {end}: {queues:?}: more send work requests outstanding than the send \
                 queue holds"
            );
        }
    }

    /// Polls every pending future that was woken, as a runtime would.
    fn poll_woken(&mut self) {
        for end in 0..2 {
            if self.ends[end].write.as_ref().is_some_and(Pending::woken) {
                self.write(end, 0);
            }
            if self.ends[end]
                .read_pending
                .as_ref()
                .is_some_and(Pending::woken)
            {
                self.read(end, 0);
            }
            if self.ends[end].shutdown.as_ref().is_some_and(Pending::woken) {
                self.shutdown(end);
            }
        }
    }

    /// A poll function call on `end`'s `side` begins: the futures pending there (taken out
    /// of `self` when it is their own poll) lose their promise of a wake-up.
    fn supersede(&mut self, end: usize, side: Side) {
        let state = &mut self.ends[end];
        let pending = match side {
            Side::Read => [state.read_pending.as_mut(), None],
            Side::Write => [state.write.as_mut(), state.shutdown.as_mut()],
        };
        for p in pending.into_iter().flatten() {
            p.superseded = true;
        }
    }

    /// Whether an error is a possible outcome now.
    fn may_fail(&self) -> bool {
        self.broken || self.poll_failed
    }

    fn unexpected(&self, what: &str, end: usize, e: &io::Error) -> ! {
        panic!("{what} of end {end} failed though nothing broke the wire: {e}")
    }

    /// Polls `end`'s pending write, or a new one of `len` bytes. Returns whether it made
    /// progress (it finished).
    fn write(&mut self, end: usize, len: usize) -> bool {
        let pending = self.ends[end].write.take();
        // A runtime would poll it now: it is new, woken, or superseded.
        let pollable = pending.as_ref().is_none_or(Pending::may_be_polled);
        let mut pending = pending.unwrap_or_else(|| Pending::new(len));
        self.supersede(end, Side::Write);
        let mut bytes = vec![0; pending.len];
        fill(end, self.ends[end].written, &mut bytes);
        let waker = pending.waker();
        let mut cx = Context::from_waker(&waker);
        match self.streams.poll_write(end, &mut cx, &bytes) {
            Poll::Pending => {
                self.ends[end].write = Some(pending);
                return false;
            }
            Poll::Ready(result) => {
                assert!(
                    pollable,
                    "end {end}'s pending write became ready without a wake-up"
                );
                self.wrote(end, pending.len, result, "a write");
            }
        }
        true
    }

    fn try_write(&mut self, end: usize, len: usize) {
        let mut bytes = vec![0; len];
        fill(end, self.ends[end].written, &mut bytes);
        match self.streams.try_write(end, &bytes) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            result => self.wrote(end, len, result, "a try_write"),
        }
    }

    /// Checks the outcome of a write of `len` bytes by `end`, and counts what it wrote.
    fn wrote(&mut self, end: usize, len: usize, result: io::Result<usize>, what: &str) {
        match result {
            Ok(n) => {
                assert!(
                    n > 0 && n <= len,
                    "{what} of {len} bytes by end {end} wrote {n}"
                );
                assert!(
                    !self.ends[end].shutdown_started,
                    "{what} by end {end} wrote {n} bytes after its shutdown"
                );
                self.ends[end].written += n as u64;
            }
            Err(_) if self.may_fail() || self.ends[end].shutdown_started => {}
            Err(e) => self.unexpected(what, end, &e),
        }
    }

    /// Polls `end`'s pending read, or a new one of up to `len` bytes. Returns whether it
    /// made progress (it finished).
    fn read(&mut self, end: usize, len: usize) -> bool {
        let pending = self.ends[end].read_pending.take();
        // A runtime would poll it now: it is new, woken, or superseded.
        let pollable = pending.as_ref().is_none_or(Pending::may_be_polled);
        let mut pending = pending.unwrap_or_else(|| Pending::new(len));
        self.supersede(end, Side::Read);
        let mut buf = std::mem::take(&mut self.buf);
        buf.resize(pending.len, 0);
        let mut read = ReadBuf::new(&mut buf);
        let waker = pending.waker();
        let mut cx = Context::from_waker(&waker);
        let progress = match self.streams.poll_read(end, &mut cx, &mut read, false) {
            Poll::Pending => {
                self.ends[end].read_pending = Some(pending);
                false
            }
            Poll::Ready(result) => {
                assert!(
                    pollable,
                    "end {end}'s pending read became ready without a wake-up"
                );
                let n = read.filled().len();
                self.got(end, &buf[..n], result, false, "a read");
                true
            }
        };
        self.buf = buf;
        progress
    }

    fn peek(&mut self, end: usize, len: usize) {
        self.supersede(end, Side::Read);
        let mut buf = vec![0; len];
        let mut read = ReadBuf::new(&mut buf);
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        // Pending: the peek is dropped.
        if let Poll::Ready(result) = self.streams.poll_read(end, &mut cx, &mut read, true) {
            let n = read.filled().len();
            self.got(end, &buf[..n], result, true, "a peek");
        }
    }

    fn try_read(&mut self, end: usize, len: usize) {
        let mut buf = vec![0; len];
        let mut read = ReadBuf::new(&mut buf);
        match self.streams.try_read(end, &mut read) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            result => {
                let n = read.filled().len();
                self.got(end, &buf[..n], result, false, "a try_read");
            }
        }
    }

    /// Checks what a read (or peek) by `end` returned, and counts what it read.
    fn got(&mut self, end: usize, bytes: &[u8], result: io::Result<()>, peek: bool, what: &str) {
        let peer = 1 - end;
        match result {
            Ok(()) if bytes.is_empty() => {
                // End of stream: only after the peer's shutdown, and after every byte.
                assert!(
                    self.ends[peer].shutdown_started,
                    "end {end} read end of stream, but end {peer} never shut down"
                );
                assert_eq!(
                    self.ends[end].read, self.ends[peer].written,
                    "end {end} read end of stream before every byte end {peer} wrote"
                );
                if !peek {
                    self.ends[end].eof = true;
                }
            }
            Ok(()) => {
                let at = self.ends[end].read;
                assert!(
                    !self.ends[end].eof,
                    "{what} by end {end} got {} bytes after end of stream",
                    bytes.len()
                );
                assert!(
                    at + bytes.len() as u64 <= self.ends[peer].written,
                    "{what} by end {end} got bytes {at}..{} of {} that end {peer} wrote",
                    at + bytes.len() as u64,
                    self.ends[peer].written,
                );
                // One comparison of the whole chunk (a loop over its bytes would be most of
                // a run's time); the first wrong byte only for the message.
                let mut expected = std::mem::take(&mut self.expected);
                expected.resize(bytes.len(), 0);
                fill(peer, at, &mut expected);
                if bytes != expected.as_slice() {
                    let wrong = bytes.iter().zip(&expected).position(|(b, e)| b != e);
                    panic!(
                        "{what} by end {end}: byte {} of the stream is wrong",
                        at + wrong.unwrap_or(0) as u64
                    );
                }
                self.expected = expected;
                if !peek {
                    self.ends[end].read += bytes.len() as u64;
                }
            }
            Err(_) if self.may_fail() => {}
            Err(e) => self.unexpected(what, end, &e),
        }
    }

    /// Polls `end`'s shutdown (pending or new). Returns whether it made progress (it
    /// finished).
    fn shutdown(&mut self, end: usize) -> bool {
        if self.ends[end].shutdown_done {
            return false;
        }
        let pending = self.ends[end].shutdown.take();
        // A runtime would poll it now: it is new, woken, or superseded.
        let pollable = pending.as_ref().is_none_or(Pending::may_be_polled);
        let mut pending = pending.unwrap_or_else(|| Pending::new(0));
        self.supersede(end, Side::Write);
        self.ends[end].shutdown_started = true;
        let waker = pending.waker();
        let mut cx = Context::from_waker(&waker);
        match self.streams.poll_shutdown(end, &mut cx) {
            Poll::Pending => {
                self.ends[end].shutdown = Some(pending);
                false
            }
            Poll::Ready(result) => {
                assert!(
                    pollable,
                    "end {end}'s pending shutdown became ready without a wake-up"
                );
                match result {
                    Ok(()) => self.ends[end].shutdown_done = true,
                    Err(_) if self.may_fail() => {}
                    Err(e) => self.unexpected("a shutdown", end, &e),
                }
                true
            }
        }
    }

    /// With the wire whole: completions released, both ends finish their pending writes and
    /// shutdowns and read until nothing more comes; every byte written was then read.
    fn drain(&mut self) {
        for end in 0..2 {
            if self.held[end] {
                self.held[end] = false;
                self.streams.wire().hold_completions(end, false);
            }
        }
        let mut idle = 0;
        while idle < 2 {
            let mut progress = false;
            for end in 0..2 {
                if self.ends[end].write.is_some() {
                    progress |= self.write(end, 0);
                }
                if self.ends[end].shutdown.is_some() {
                    progress |= self.shutdown(end);
                }
                // Read while bytes come (a pending read first).
                for _ in 0..DRAIN_ROUNDS {
                    let before = (self.ends[end].read, self.ends[end].eof);
                    let finished = self.read(end, 64 * 1024);
                    if !finished || (self.ends[end].read, self.ends[end].eof) == before {
                        break;
                    }
                    progress = true;
                }
            }
            idle = if progress { 0 } else { idle + 1 };
        }
        for end in 0..2 {
            let peer = 1 - end;
            let state = &self.ends[end];
            assert!(state.write.is_none(), "end {end}'s write never finished");
            assert!(
                state.shutdown.is_none(),
                "end {end}'s shutdown never finished"
            );
            assert_eq!(
                state.read, self.ends[peer].written,
                "end {end} read less than end {peer} wrote"
            );
            assert_eq!(
                state.eof, self.ends[peer].shutdown_done,
                "end {end} read end of stream: {}, end {peer} shut down: {}",
                state.eof, self.ends[peer].shutdown_done
            );
        }
    }
}
