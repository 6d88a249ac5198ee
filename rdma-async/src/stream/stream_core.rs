//! [`StreamCore`]: the state every handle of one stream shares, behind one lock: the rsockets
//! protocol state machine (`crate::proto`), the queue pair and its registered rings.
//!
//! The protocol state machine decides what to post; this code copies bytes between the application and the
//! registered rings, posts the work requests, and feeds completions and CM events back. All
//! protocol state sits behind one lock, and the completion queue is polled only under it, so
//! completions are handled in the order the device produced them. The reading and the writing
//! side each wait through their own registrations of the channel descriptors ([`ConnWaiter`]),
//! and whichever side handles completions wakes the other; every task waiting on a side is
//! woken ([`SideWakers`]).
//!
//! A peer can keep the completion queue busy for ever (a flood of valid 0-byte messages or
//! credit updates), so the work per poll is bounded: every batch of up to [`BATCH`]
//! completions spends one unit of Tokio's cooperative budget (128 per task poll, so at most
//! 4096 completions before the task yields), and a call without a task context (`try_read`,
//! `try_write`, flush, the keepalive) handles at most [`PUMP_BATCHES`] batches. Completions
//! left behind stay queued and are handled, in order, by the next call.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::future::poll_fn;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, TryLockError};
use std::task::{Context, Poll, Waker, ready};

use tokio::io::ReadBuf;
use tokio::task::coop;

use super::gather::Gather;
use super::lending_ring::{INITIAL_RANGE, WINDOW_RANGE, WINDOW_WRS, lending_ring};
use super::lent_bytes::LentBytes;
use super::options::RStreamOptions;
use super::region_write::{LentBuffer, RegionWrite};
use super::side_wakers::{Polling, Reading, SideWakers, Waiter};
use super::stats::StreamStats;
use super::write_probe::WriteProbe;
use crate::cm::link::CmLink;
use crate::device::DeviceContext;
use crate::error::{StickyError, wc_error};
use crate::proto::{
    ConnData, Connection, DataWrite, LendStep, LocalLayout, ProtoError, ProtoErrorKind, ReadStatus,
    TARGET_SGL_BYTES, WR_ID_RECV_FLAG, WriteBlocked, WriteCall, WriteError,
};
use crate::reactor::{AsyncCq, BeforeSleep, ConnWaiter, WaitHints, WaitYields, Woken};
use crate::verbs::{
    Access, CmId, CompletionBatch, Opcode, OwnedBufferQueuePair, Payload, QpCaps, RegisteredBuffer,
    Segment, SendChain, UserBuffer, WcStatus, WorkCompletion, WorkRequest,
};

/// The queue pair's buffers, by index.
const SBUF: usize = 0;
const RBUF: usize = 1;
const TARGET_SGL: usize = 2;
const CTRL: usize = 3;
/// Control messages go from 16-byte slots when they cannot go inline.
const CTRL_SLOT: usize = 16;
const CTRL_SLOTS: usize = 4;
/// Completions polled at once; each batch spends one unit of Tokio's budget.
const BATCH: usize = 32;
/// Batches one call handles at most when it has no task context to spend budget from.
const PUMP_BATCHES: usize = 4;

/// What the handshake builds before connecting or accepting.
pub(super) struct StreamParts {
    qp: OwnedBufferQueuePair,
    cq: AsyncCq,
    conn: Connection,
}

/// Creates the queue pair, rings and protocol state on `id`'s device; returns them with the
/// 40-byte rsockets connection data to send.
pub(super) fn build(
    id: &Arc<CmId>,
    opts: &RStreamOptions,
) -> io::Result<(StreamParts, Option<Vec<u8>>)> {
    let config = opts.config();
    let pd = opts.dial.context_for(id)?.pd().clone();
    let async_cq = AsyncCq::create(id, config.sq_size() + config.rq_size(), opts.busy_poll)?;
    let cq = async_cq.queue();
    let remote_write = Access {
        remote_write: true,
        ..Access::default()
    };
    let sbuf = RegisteredBuffer::new(pd.clone(), config.sbuf_size() as usize, Access::default())?;
    let (rbuf, windows, ring_keys) = if opts.zero_copy_reads {
        lending_ring(&pd, config.rbuf_size() as usize)?
    } else {
        let rbuf = RegisteredBuffer::new(pd.clone(), config.rbuf_size() as usize, remote_write)?;
        (rbuf, Vec::new(), None)
    };
    let target_sgl = RegisteredBuffer::new(pd.clone(), TARGET_SGL_BYTES, remote_write)?;
    let ctrl = RegisteredBuffer::new(pd.clone(), CTRL_SLOT * CTRL_SLOTS, Access::default())?;
    let layout = LocalLayout {
        rbuf_addr: rbuf.addr(0),
        rbuf_rkey: rbuf.rkey(),
        target_sgl_addr: target_sgl.addr(0),
        target_sgl_rkey: target_sgl.rkey(),
        ring_keys,
    };
    // Room for the window binds and invalidations besides rsockets' own sends.
    let window_wrs = if ring_keys.is_some() { WINDOW_WRS } else { 0 };
    let caps = QpCaps {
        max_send_wr: config.sq_size() + window_wrs,
        max_recv_wr: config.rq_size(),
        max_inline_data: config.inline_size(),
        max_send_sge: 2,
    };
    let qp = OwnedBufferQueuePair::new(
        id.clone(),
        pd,
        cq.clone(),
        cq.clone(),
        caps,
        vec![sbuf, rbuf, target_sgl, ctrl],
        windows,
    )?;
    // The provider may grant more inline room than asked; rsockets uses what it got.
    let config = config.with_inline_size(qp.max_inline_data());
    let conn = Connection::new(config, layout);
    // RDMA writes with immediate need receives without buffers; all are posted before the
    // peer can send anything.
    qp.post_empty_recvs(WR_ID_RECV_FLAG, config.rq_size() as usize)?;
    let conn_data = conn.local_conn_data().encode().to_vec();
    Ok((
        StreamParts {
            qp,
            cq: async_cq,
            conn,
        },
        Some(conn_data),
    ))
}

/// Decodes and applies the peer's connection data.
pub(super) fn apply_peer_conn_data(
    parts: &mut StreamParts,
    data: &[u8],
    peer: SocketAddr,
) -> io::Result<()> {
    let peer_data = ConnData::decode(data).map_err(|e| invalid_conn_data(e, peer))?;
    parts
        .conn
        .handle_peer_conn_data(&peer_data)
        .map_err(|e| invalid_conn_data(e, peer))
}

fn invalid_conn_data(err: ProtoError, peer: SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{peer} sent invalid rsockets connection data: {err}"),
    )
}

/// What [`StreamCore::poll_lend`] found.
enum LendOutcome {
    /// Bytes of the ring to view: nothing but the CPU can write them until consumed.
    View { offset: usize, len: usize },
    /// Bytes copied out and consumed (empty: end of stream).
    Copied(Vec<u8>),
}

/// Which side of the stream is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Read,
    Write,
}

#[derive(Debug)]
struct CoreState {
    conn: Connection,
    /// The first transport failure, which explains the protocol's later "failed" state.
    transport_error: StickyError,
    shutdown_started: bool,
    /// Probes the peer while the writer waits for credits.
    write_probe: WriteProbe,
    stats: StreamStats,
    /// Caller buffers lent to the queue pair by zero-copy writes, in post order of their last
    /// send.
    lent: VecDeque<LentBuffer>,
    /// Lent buffers the device is done with, for their writes to pick up (by lend id).
    returned: HashMap<u64, UserBuffer>,
    /// Lend ids of writes that were dropped: their buffers are freed when they come back.
    abandoned: HashSet<u64>,
    /// An `ibv_post_send` failed: requests the protocol counts as outstanding may never have
    /// been posted, so their completions (and the buffers they would free) may never come.
    post_failed: bool,
    /// The last look at the completion queue in this hold of the lock (every look is made
    /// under it) found the queue empty: it returned less than a full batch. A wait then need
    /// not look again under an arm made earlier ([`WaitHints::exclusive`]).
    queue_empty: bool,
    /// The yields of the current wait for completions, by either side.
    yields: WaitYields,
}

/// One stream connection's queue pair, protocol state and wake-ups.
#[derive(Debug)]
pub(super) struct StreamCore {
    // Drop order: disconnect, then destroy the queue pair, then free rings and queues.
    link: CmLink,
    qp: OwnedBufferQueuePair,
    cq: AsyncCq,
    /// The reading and the writing side's registrations (indexed by [`Side`]).
    waiters: [ConnWaiter; 2],
    /// The tasks waiting on each side (indexed by [`Side`]).
    wakers: [Arc<SideWakers>; 2],
    /// What each side's registration and timers wake: every task waiting on that side.
    side_wakers: [Waker; 2],
    state: Mutex<CoreState>,
    /// Threads blocked on `state`: a task that busy-polls while holding it stops spinning
    /// when there is one (the other half of a split stream, on another worker, wants to go on).
    lock_waiters: AtomicU32,
}

impl StreamCore {
    pub(super) fn new(parts: StreamParts, link: CmLink) -> io::Result<Self> {
        let wakers: [Arc<SideWakers>; 2] = Default::default();
        let core = StreamCore {
            waiters: [
                ConnWaiter::new(&parts.cq, Some(&link))?,
                ConnWaiter::new(&parts.cq, Some(&link))?,
            ],
            side_wakers: [wakers[0].waker(), wakers[1].waker()],
            wakers,
            link,
            qp: parts.qp,
            cq: parts.cq,
            state: Mutex::new(CoreState {
                conn: parts.conn,
                transport_error: StickyError::default(),
                shutdown_started: false,
                write_probe: WriteProbe::new(),
                stats: StreamStats::default(),
                lent: VecDeque::new(),
                returned: HashMap::new(),
                abandoned: HashSet::new(),
                post_failed: false,
                queue_empty: false,
                yields: WaitYields::default(),
            }),
            lock_waiters: AtomicU32::new(0),
        };
        // The first SGL update (the second half of our ring) goes out at once.
        let mut state = core.lock();
        core.post_controls(&mut state)?;
        drop(state);
        Ok(core)
    }

    pub(super) fn link(&self) -> &CmLink {
        &self.link
    }

    /// The device context of the stream's queue pair and rings.
    pub(super) fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.qp.pd().clone())
    }

    fn lock(&self) -> MutexGuard<'_, CoreState> {
        // Every update keeps the state consistent before anything that could panic.
        let mut state = match self.state.try_lock() {
            Ok(state) => state,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            Err(TryLockError::WouldBlock) => {
                // Counted while blocked, so that a holder spinning in `wait` lets go soon.
                self.lock_waiters.fetch_add(1, Ordering::Relaxed);
                let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                self.lock_waiters.fetch_sub(1, Ordering::Relaxed);
                state
            }
        };
        // Only a look made under this hold of the lock counts for its waits.
        state.queue_empty = false;
        state
    }

    /// Handles the completions already queued, up to [`PUMP_BATCHES`] batches. With `cx`, each
    /// batch spends a unit of the task's budget; once it is spent, this wakes the task and
    /// returns `Pending`, leaving the rest queued for the next poll. `reading`: whether (and how)
    /// the caller reads (or waits for readability): it looks at the stream again after this.
    fn pump(
        &self,
        state: &mut CoreState,
        mut cx: Option<&mut Context<'_>>,
        reading: Reading,
    ) -> Poll<io::Result<()>> {
        let mut batch = CompletionBatch::<BATCH>::new();
        for _ in 0..PUMP_BATCHES {
            let coop = match cx.as_deref_mut() {
                Some(cx) => Some(ready!(coop::poll_proceed(cx))),
                None => None,
            };
            let wcs = self.cq.try_poll_batch(&mut batch)?;
            state.queue_empty = wcs.len() < BATCH;
            if wcs.is_empty() {
                // Dropping `coop` unused gives the unit back.
                return Poll::Ready(Ok(()));
            }
            if let Some(coop) = &coop {
                coop.made_progress();
            }
            self.cq.end_wait(&state.yields);
            let reader = cx
                .as_deref()
                .filter(|_| reading != Reading::No)
                .map(|cx| Polling {
                    waker: cx.waker(),
                    reading,
                });
            let drained = state.queue_empty;
            self.handle(state, wcs, reader)?;
            if drained {
                // Less than a batch: the queue was empty after it, and polling it again now
                // (C's loop does) would most often find nothing. What arrives later is seen
                // by the next call, or by a waiter, which polls again after arming.
                return Poll::Ready(Ok(()));
            }
        }
        Poll::Ready(Ok(()))
    }

    /// [`Self::pump`] for calls without a task context: at most [`PUMP_BATCHES`] batches.
    fn pump_some(&self, state: &mut CoreState) -> io::Result<()> {
        // Without a context there is no budget to wait for: this is always `Ready`.
        match self.pump(state, None, Reading::No) {
            Poll::Ready(result) => result,
            Poll::Pending => Ok(()),
        }
    }

    /// Handles the completions in the queue, as many as it can hold: for the end of a
    /// connection, when the order of events must be settled. Once the queue pair is in the
    /// error state that is all of them; while it is not (a wait failed for another reason), a
    /// peer could keep the queue full for ever, so the bound keeps this from looping for ever.
    fn drain(&self, state: &mut CoreState) -> io::Result<()> {
        let mut batch = CompletionBatch::<BATCH>::new();
        let mut left = self.cq.queue().capacity();
        loop {
            let wcs = self.cq.try_poll_batch(&mut batch)?;
            if wcs.is_empty() {
                state.queue_empty = true;
                return Ok(());
            }
            self.handle(state, wcs, None)?;
            left = left.saturating_sub(wcs.len());
            if left == 0 {
                return Ok(());
            }
        }
    }

    fn wake_all(&self) {
        for wakers in &self.wakers {
            wakers.wake_all();
        }
    }

    /// Handles a batch of completions and wakes the waiters of both sides. Receives that
    /// cannot be posted again end the connection once the whole batch is handled: those
    /// completions are out of the queue, and the protocol's count of sends and receives must
    /// include them.
    ///
    /// `reader`: the task reading now (and how), which looks at the stream again before it
    /// returns. It is not woken on the reading side (every reader waits for the same thing,
    /// readable bytes, so it sees what the others would); waking it would only poll it again
    /// for nothing, once per message of a ping-pong (see [`SideWakers::wake_all_but`]). On the
    /// writing side it is woken as any other: it may wait there for something else, polled
    /// earlier in this same poll.
    fn handle(
        &self,
        state: &mut CoreState,
        wcs: &[WorkCompletion],
        reader: Option<Polling<'_>>,
    ) -> io::Result<()> {
        let mut reposts = 0;
        for wc in wcs {
            if wc.wr_id & WR_ID_RECV_FLAG != 0 {
                state.stats.recv_completions += 1;
                reposts += usize::from(self.handle_recv(state, wc));
            } else {
                state.stats.send_completions += 1;
                let ok = wc.status.is_success();
                if !ok && wc.status != WcStatus::FLUSH && !state.transport_error.is_set() {
                    let err = wc_error(wc, self.link.peer_addr(), true);
                    tracing::warn!(parent: self.link.span(), error = %err, "send failed");
                    state.transport_error.set(err);
                }
                // A lending ring's invalidations unbind their windows in the queue pair's
                // books too (it decides what may be viewed).
                self.qp.window_completed(wc);
                if let Err(e) = state.conn.handle_send_completion(wc.wr_id, ok) {
                    tracing::debug!(parent: self.link.span(), error = %e, "send completion ended the connection");
                }
            }
        }
        // The batch's receives go back with one post, before any control message that
        // returns their credits. If they cannot be posted the connection ends there: what the
        // batch delivered is still read first, then the failure, by every reader and writer.
        if let Err(e) = self.qp.post_empty_recvs(WR_ID_RECV_FLAG, reposts) {
            self.fatal(state, e);
        }
        self.reclaim_lent(state);
        let posted = self.post_controls(state);
        self.wakers[Side::Read as usize].wake_all_but(reader);
        self.wakers[Side::Write as usize].wake_all();
        posted
    }

    /// Takes back from the queue pair every lent buffer whose last send has completed.
    fn reclaim_lent(&self, state: &mut CoreState) {
        while let Some(&lent) = state.lent.front() {
            if state.conn.is_send_outstanding(lent.last_send) {
                return;
            }
            state.lent.pop_front();
            if let Some(buffer) = self.qp.reclaim(lent.lend_id)
                && !state.abandoned.remove(&lent.lend_id)
            {
                state.returned.insert(lent.lend_id, buffer);
            }
        }
    }

    /// Hands a receive completion to the protocol; returns whether its receive is to be
    /// posted again.
    fn handle_recv(&self, state: &mut CoreState, wc: &WorkCompletion) -> bool {
        if !wc.status.is_success() {
            // Flushed or failed receives carry nothing; rsockets skips them too.
            return false;
        }
        let target_sgl = self.qp.buffer(TARGET_SGL);
        let read_slot = |slot: usize| {
            let mut entry = [0u8; 16];
            // An out-of-range slot reads as an empty entry, which the protocol rejects.
            let _ = target_sgl.read_at(slot * 16, &mut entry);
            entry
        };
        match state
            .conn
            .handle_recv_completion(wc.imm_data, wc.byte_len, read_slot)
        {
            Ok(action) => action.repost,
            Err(e) => {
                tracing::warn!(parent: self.link.span(), error = %e, "rsockets protocol violation");
                false
            }
        }
    }

    /// Posts every control message the protocol has due (credits, buffer grants, CTRL), with
    /// one `ibv_post_send`.
    fn post_controls(&self, state: &mut CoreState) -> io::Result<()> {
        if !state.conn.control_wanted() {
            return Ok(()); // most calls: nothing is due
        }
        let mut chain = SendChain::new(&self.qp);
        self.push_due_controls(state, &mut chain)?;
        self.post_chain(state, &mut chain)
    }

    /// Adds every control message the protocol has due to `chain`.
    #[inline]
    fn push_controls(&self, state: &mut CoreState, chain: &mut SendChain<'_>) -> io::Result<()> {
        if !state.conn.control_wanted() {
            return Ok(()); // most calls: nothing is due
        }
        self.push_due_controls(state, chain)
    }

    /// [`Self::push_controls`] once something is due: out of line, as most calls find nothing.
    #[inline(never)]
    fn push_due_controls(
        &self,
        state: &mut CoreState,
        chain: &mut SendChain<'_>,
    ) -> io::Result<()> {
        while let Some(cw) = state.conn.poll_control() {
            if let Some(bind) = cw.bind {
                // Posted alone, after what was planned before it, so the window's new key can
                // be recorded once the provider has read the old one.
                self.post_chain(state, chain)?;
                let target = (RBUF, WINDOW_RANGE[bind.half]);
                if let Err(e) = self.qp.post_bind(bind.wr_id, bind.half, target, bind.rkey) {
                    state.post_failed = true;
                    return Err(self.fatal(state, e));
                }
                state.stats.post_send_calls += 1;
            }
            let segment;
            let bytes = cw.payload.unwrap_or_default();
            let payload = match cw.payload {
                Some(_) if cw.inline => Payload::Inline(&bytes),
                Some(_) => {
                    let offset = cw.ctrl_slot * CTRL_SLOT;
                    self.qp.buffer(CTRL).write_at(offset, &bytes)?;
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
    fn push(
        &self,
        state: &mut CoreState,
        chain: &mut SendChain<'_>,
        req: &WorkRequest<'_>,
    ) -> io::Result<()> {
        let posts = chain.posts();
        let pushed = chain.push(req);
        state.stats.post_send_calls += chain.posts() - posts;
        pushed.map_err(|e| {
            state.post_failed = true;
            self.fatal(state, e)
        })
    }

    /// Posts what `chain` holds with one `ibv_post_send`; a failure ends the connection.
    fn post_chain(&self, state: &mut CoreState, chain: &mut SendChain<'_>) -> io::Result<()> {
        if chain.is_empty() {
            return Ok(()); // most calls: nothing was due
        }
        let posts = chain.posts();
        let posted = chain.post();
        state.stats.post_send_calls += chain.posts() - posts;
        posted.map_err(|e| {
            state.post_failed = true;
            self.fatal(state, e)
        })
    }

    /// Records a local failure that broke the connection and returns it.
    fn fatal(&self, state: &mut CoreState, err: io::Error) -> io::Error {
        if !state.transport_error.is_set() {
            tracing::warn!(parent: self.link.span(), error = %err, "connection failed");
        }
        state
            .conn
            .handle_fatal(ProtoError::new(ProtoErrorKind::SendFailed, err.to_string()));
        state.transport_error.record(err)
    }

    /// Takes the data write `write`'s bytes from `source`, copied into the send ring or sent
    /// inline, and adds the write to `chain`.
    fn push_data(
        &self,
        state: &mut CoreState,
        chain: &mut SendChain<'_>,
        write: &DataWrite,
        source: &mut Gather<'_>,
    ) -> io::Result<()> {
        if write.len > source.remaining() {
            let err = io::Error::other("a chunk was planned longer than the bytes left to write");
            return Err(self.fatal(state, err));
        }
        if write.inline {
            let gathered;
            let bytes = match source.take_contiguous(write.len) {
                Some(bytes) => bytes,
                // Spread over several of the call's buffers: the device takes inline bytes as
                // one range. Rare: only small vectored writes go inline.
                None => {
                    gathered = source.take_vec(write.len);
                    &gathered[..]
                }
            };
            return self.push_data_write(state, chain, write, Payload::Inline(bytes));
        }
        let mut segments = [Segment {
            buffer: SBUF,
            offset: 0,
            len: 0,
        }; 2];
        let ring = write.sbuf.as_slice();
        for (dst, seg) in segments.iter_mut().zip(ring) {
            let mut at = seg.offset;
            while at < seg.offset + seg.len {
                // Not empty: the source holds at least the chunk's bytes (checked above).
                let piece = source.next_piece(seg.offset + seg.len - at);
                self.qp.buffer(SBUF).write_at(at, piece)?;
                at += piece.len();
            }
            *dst = Segment {
                buffer: SBUF,
                offset: seg.offset,
                len: seg.len,
            };
        }
        self.push_data_write(
            state,
            chain,
            write,
            Payload::Segments(&segments[..ring.len()]),
        )
    }

    /// Adds the data write `write` (an RDMA write with its DATA immediate) from `payload` to
    /// `chain`; a failure ends the connection.
    fn push_data_write(
        &self,
        state: &mut CoreState,
        chain: &mut SendChain<'_>,
        write: &DataWrite,
        payload: Payload<'_>,
    ) -> io::Result<()> {
        let req = WorkRequest {
            wr_id: write.wr_id,
            opcode: Opcode::Write {
                remote_addr: write.remote_addr,
                rkey: write.rkey,
                imm: Some(write.imm),
            },
            payload,
            signaled: write.signaled,
        };
        self.push(state, chain, &req)?;
        state.stats.data_writes += 1;
        state.stats.inline_writes += u64::from(matches!(payload, Payload::Inline(_)));
        state.stats.signaled_sends += u64::from(write.signaled);
        state.stats.bytes_sent += write.len as u64;
        Ok(())
    }

    /// Moves the write's buffer into the queue pair, sends as much of it as the peer's grants
    /// allow straight from there, waiting for more, and once all of it is posted waits for the
    /// device to be done with it: `op.buffer` then holds it again. On an error the buffer is
    /// back in `op.buffer` too, unless a failed `ibv_post_send` left it unknown whether the
    /// device still reads it (it then stays with the queue pair until the stream is dropped).
    pub(super) fn poll_write_region(
        &self,
        cx: &mut Context<'_>,
        op: &mut RegionWrite,
    ) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        ready!(self.pump(&mut state, Some(cx), Reading::No))?;
        loop {
            // A buffer the device is done with comes back first: the next chunks lend it
            // again, under a new id.
            self.reclaim_lent(&mut state);
            if let Some(id) = op.lent
                && let Some(buffer) = state.returned.remove(&id)
            {
                op.buffer = Some(buffer);
                op.lent = None;
            }
            if op.failure.is_none() && op.remaining() > 0 {
                self.post_region(&mut state, op)?;
                self.reclaim_lent(&mut state);
                if let Some(id) = op.lent
                    && let Some(buffer) = state.returned.remove(&id)
                {
                    op.buffer = Some(buffer);
                    op.lent = None;
                }
            }
            if op.lent.is_none() {
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
                self.reclaim_lent(&mut state);
                if let Some(id) = op.lent
                    && let Some(buffer) = state.returned.remove(&id)
                {
                    op.buffer = Some(buffer);
                    op.lent = None;
                }
                return Poll::Ready(Err(op.failure.take().unwrap_or(e)));
            }
        }
    }

    /// Lends the write's buffer to the queue pair (unless it already is) and posts as many of
    /// its chunks as the peer's grants allow, then the control messages due.
    /// Records a refusal of the protocol in `op.failure`.
    fn post_region(&self, state: &mut CoreState, op: &mut RegionWrite) -> io::Result<()> {
        if let Err(WriteError::Blocked(_)) = state.conn.write_readiness() {
            return Ok(()); // nothing can be posted yet
        }
        let lend_id = match (op.lent, op.buffer.take()) {
            (Some(id), _) => id,
            (None, Some(buffer)) => match self.qp.lend(buffer) {
                Ok(id) => {
                    op.lent = Some(id);
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
        let mut chain = SendChain::new(&self.qp);
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
            let payload = Payload::Lent {
                id: lend_id,
                offset: op.start + op.done,
                len: write.len,
            };
            if let Err(e) = self.push_data_write(state, &mut chain, &write, payload) {
                op.failure = Some(e);
                break;
            }
            state.stats.zero_copy_bytes += write.len as u64;
            state.write_probe.disarm();
            op.done += write.len;
            last_send = Some(write.wr_id);
        }
        let posted = self
            .push_controls(state, &mut chain)
            .and_then(|()| self.post_chain(state, &mut chain));
        match last_send {
            Some(last_send) => {
                // The buffer's entry moves to the back: its last send is now the newest.
                state.lent.retain(|l| l.lend_id != lend_id);
                state.lent.push_back(LentBuffer { lend_id, last_send });
            }
            None if !state.lent.iter().any(|l| l.lend_id == lend_id) => {
                // No send of it was ever posted: the device never saw it.
                op.buffer = self.qp.reclaim(lend_id);
                op.lent = None;
            }
            None => {}
        }
        if let Err(e) = posted {
            op.failure.get_or_insert(e);
        }
        Ok(())
    }

    /// A zero-copy write was dropped: its buffer is freed when the device is done with it.
    pub(super) fn abandon_region_write(&self, op: &mut RegionWrite) {
        let Some(lend_id) = op.lent.take() else {
            return;
        };
        let mut state = self.lock();
        if state.returned.remove(&lend_id).is_none() {
            if state.lent.iter().any(|l| l.lend_id == lend_id) {
                state.abandoned.insert(lend_id);
            } else {
                drop(self.qp.reclaim(lend_id));
            }
        }
    }

    /// The error a failed connection reports: the transport's cause if there was one.
    fn failure(&self, state: &CoreState, proto: Option<ProtoError>) -> io::Error {
        if let Some(e) = state.transport_error.report() {
            return e;
        }
        match proto {
            Some(e) if e.kind() == ProtoErrorKind::Reset => io::Error::new(
                e.io_kind(),
                format!(
                    "connection with {} reset: {}",
                    self.link.peer_addr(),
                    e.message()
                ),
            ),
            // No send failed with a status of its own (that would be the transport error
            // above): ours were flushed because the peer disconnected. Say that, not which
            // internal message was in flight.
            Some(e) if e.kind() == ProtoErrorKind::SendFailed && self.link.is_disconnected() => {
                io::Error::new(
                    e.io_kind(),
                    format!(
                        "connection with {} reset: the peer disconnected while our sends were \
                         in flight (they were flushed)",
                        self.link.peer_addr()
                    ),
                )
            }
            Some(e) => e.into(),
            None => io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!(
                    "connection to {} is closed for writing",
                    self.link.peer_addr()
                ),
            ),
        }
    }

    /// Sleeps until a completion or a CM event may have changed the state (`Ready(Ok)`: look
    /// again), or registers `cx` as `waiter` on `side` to be woken (`Pending`).
    fn wait(
        &self,
        state: &mut CoreState,
        side: Side,
        cx: &mut Context<'_>,
        waiter: Waiter<'_, '_>,
    ) -> Poll<io::Result<()>> {
        let reading = waiter.reading_on(side);
        let task = cx.waker();
        // Registered only once the wait is about to sleep: a wait that finds completions or
        // yields is polled again without it.
        let waiter = Cell::new(Some(waiter));
        let register = || {
            if let Some(waiter) = waiter.take() {
                self.wakers[side as usize].register(waiter, task);
            }
        };
        // The registration wakes every waiter of the side, not only this task.
        let mut side_cx = Context::from_waker(&self.side_wakers[side as usize]);
        let mut batch = CompletionBatch::<BATCH>::new();
        let registration = &self.waiters[side as usize];
        // Every caller looks at the queue (`pump`, or the batch of an earlier wait) before it
        // waits, so the wait need not look again before spinning or arming; both sides wait
        // under this lock, so neither needs to look again under an arm made earlier after a
        // look that found the queue empty.
        let hints = WaitHints {
            lock_waiters: Some(&self.lock_waiters),
            just_polled: true,
            exclusive: state.queue_empty,
            yields: Some(&state.yields),
            task: Some(task),
            before_sleep: Some(BeforeSleep(&register)),
        };
        let polled =
            registration.poll_wait(&self.cq, Some(&self.link), &mut side_cx, &mut batch, hints);
        // A wait that returns nothing ended with a look that found nothing, or needed none
        // (or ran out of budget before looking: this hold of the lock ends here).
        state.queue_empty = match &polled {
            Poll::Pending => true,
            Poll::Ready(Woken::Completions(Ok(n))) => *n < BATCH,
            Poll::Ready(_) => false,
        };
        match ready!(polled) {
            Woken::Completions(Ok(_)) => {
                let reader = (reading != Reading::No).then_some(Polling {
                    waker: task,
                    reading,
                });
                Poll::Ready(self.handle(state, batch.as_slice(), reader))
            }
            Woken::Completions(Err(e)) | Woken::Closed(Err(e)) => Poll::Ready(Err(e)),
            // Not an orderly close: readers get the removal, never EOF.
            Woken::Closed(Ok(())) if self.link.is_device_removed() => {
                let err = self.fatal(state, self.link.closed_error(false));
                self.wake_all();
                Poll::Ready(Err(err))
            }
            Woken::Closed(Ok(())) if !state.conn.is_disconnected() => {
                tracing::debug!(parent: self.link.span(), "stream disconnected by rdma_cm");
                // Whatever the peer sent before it disconnected is in the queue by now: handle
                // all of it first, or a read could see end-of-stream ahead of the last bytes.
                self.drain(state)?;
                state.conn.handle_disconnected();
                self.wake_all();
                Poll::Ready(Ok(()))
            }
            // Already disconnected and still blocked: nothing more will arrive.
            Woken::Closed(Ok(())) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("connection closed by {}", self.link.peer_addr()),
            ))),
        }
    }

    /// [`Self::wait`] for a writer blocked on the peer's credits or ring space, probing the
    /// peer meanwhile (see [`WriteProbe`]): a dead peer then fails the probe and the writer.
    /// `blocked`: why nothing can be written, counted in the stats once per wait (`None`: the
    /// writer waits for something else, a lent buffer's return).
    fn wait_to_write(
        &self,
        state: &mut CoreState,
        cx: &mut Context<'_>,
        waiter: Waiter<'_, '_>,
        blocked: Option<WriteBlocked>,
    ) -> Poll<io::Result<()>> {
        // A wait yields and is polled again; only its first poll counts.
        if let Some(reason) = blocked
            && !state.write_probe.waiting()
        {
            state.stats.count_writer_wait(reason);
        }
        // The timer wakes every writer, so whichever polls next sends the probe.
        let mut side_cx = Context::from_waker(&self.side_wakers[Side::Write as usize]);
        if state.write_probe.poll_due(&mut side_cx) {
            tracing::trace!(parent: self.link.span(), "writer blocked on credits: probing the peer");
            state.conn.queue_keepalive();
            state.stats.write_probes += 1;
            self.post_controls(state)?;
        }
        self.wait(state, Side::Write, cx, waiter)
    }

    /// Copies readable bytes into `buf`, consuming them unless `peek`.
    fn copy_out(&self, state: &mut CoreState, buf: &mut ReadBuf<'_>, peek: bool) -> io::Result<()> {
        let ring = self.qp.buffer(RBUF);
        self.take_readable(state, buf.remaining(), peek, |offset, n| {
            ring.read_at(offset, &mut buf.initialize_unfilled_to(n)[..n])?;
            buf.advance(n);
            Ok(())
        })
    }

    /// Copies up to `max` readable bytes to the end of `out` and consumes them.
    fn copy_out_to_vec(
        &self,
        state: &mut CoreState,
        max: usize,
        out: &mut Vec<u8>,
    ) -> io::Result<()> {
        let ring = self.qp.buffer(RBUF);
        self.take_readable(state, max, false, |offset, n| {
            ring.append_to(offset, n, out)
        })
    }

    /// Hands up to `max` readable bytes, piece by piece (ring offset, length), to `put`; then,
    /// unless peeking, consumes them.
    fn take_readable(
        &self,
        state: &mut CoreState,
        max: usize,
        peek: bool,
        mut put: impl FnMut(usize, usize) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut taken = 0;
        for seg in state.conn.readable_segments().as_slice() {
            let n = seg.len.min(max - taken);
            if n == 0 {
                break;
            }
            put(seg.offset, n)?;
            taken += n;
        }
        if !peek {
            state.conn.consume(taken).map_err(io::Error::from)?;
            state.stats.bytes_received += taken as u64;
            // Consuming is what returns credits and buffer halves to the peer.
            self.post_controls(state)?;
        }
        Ok(())
    }

    /// Waits for readable bytes and hands out up to `max` of them, lent when their half of the
    /// ring can be (the peer's access to it is revoked first), copied out otherwise (their half
    /// is still being filled, or the ring was not set up for lending).
    ///
    /// With `whole`, it first waits for the whole piece: `max` bytes, or the bytes to the end
    /// of the half if fewer; end of stream before that is `UnexpectedEof`.
    fn poll_lend(
        &self,
        cx: &mut Context<'_>,
        max: usize,
        whole: bool,
    ) -> Poll<io::Result<LendOutcome>> {
        let coop = ready!(coop::poll_proceed(cx));
        let mut state = self.lock();
        let outcome = loop {
            ready!(self.pump(&mut state, Some(cx), Reading::PollFn))?;
            if whole && state.conn.read_status_len() < max.min(state.conn.lend_limit()) {
                match state.conn.read_status() {
                    ReadStatus::Failed(e) => {
                        return Poll::Ready(Err(self.failure(&state, Some(e))));
                    }
                    ReadStatus::Eof => {
                        return Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            format!(
                                "{} closed the stream before the {max} bytes asked for came",
                                self.link.peer_addr()
                            ),
                        )));
                    }
                    ReadStatus::Data(_) | ReadStatus::Blocked => {
                        ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                        continue;
                    }
                }
            }
            match state.conn.lend() {
                LendStep::Ready { offset, len } => {
                    break LendOutcome::View {
                        offset,
                        len: len.min(max),
                    };
                }
                LendStep::Copy => {
                    let len = state.conn.read_status_len().min(max);
                    let mut bytes = Vec::with_capacity(len);
                    self.copy_out_to_vec(&mut state, len, &mut bytes)?;
                    break LendOutcome::Copied(bytes);
                }
                LendStep::Deregister { half, key } => {
                    if let Err(e) = self.qp.deregister_range(RBUF, INITIAL_RANGE[half]) {
                        return Poll::Ready(Err(self.fatal(&mut state, e)));
                    }
                    state.conn.deregistered(half, key);
                }
                LendStep::Invalidate { wr_id, half, key } => {
                    if let Err(e) = self.qp.post_invalidate(wr_id, half, key) {
                        state.post_failed = true;
                        return Poll::Ready(Err(self.fatal(&mut state, e)));
                    }
                    state.stats.post_send_calls += 1;
                    state.stats.signaled_sends += 1;
                }
                LendStep::Wait => {
                    ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                }
                LendStep::Empty => match state.conn.read_status() {
                    ReadStatus::Eof
                        if state.transport_error.is_set() && state.conn.is_disconnected() =>
                    {
                        return Poll::Ready(Err(self.failure(&state, None)));
                    }
                    ReadStatus::Eof => break LendOutcome::Copied(Vec::new()),
                    ReadStatus::Failed(e) => {
                        return Poll::Ready(Err(self.failure(&state, Some(e))));
                    }
                    // Data appeared since `lend` looked: look again.
                    ReadStatus::Data(_) => {}
                    ReadStatus::Blocked => {
                        ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?;
                    }
                },
            }
        };
        coop.made_progress();
        Poll::Ready(Ok(outcome))
    }

    /// See [`super::RStream::read_lent`].
    pub(super) async fn read_lent(&self, max: usize, whole: bool) -> io::Result<LentBytes<'_>> {
        match poll_fn(|cx| self.poll_lend(cx, max, whole)).await? {
            LendOutcome::Copied(bytes) => Ok(LentBytes::copied(bytes)),
            LendOutcome::View { offset, len } => {
                let view = self.qp.view(RBUF, offset, len).map_err(|e| {
                    let mut state = self.lock();
                    self.fatal(&mut state, e)
                })?;
                Ok(LentBytes::lent(view, self))
            }
        }
    }

    /// Lent bytes came back: consumed, which may return ring space and credits to the peer.
    pub(super) fn consume_lent(&self, len: usize) {
        let mut state = self.lock();
        if let Err(e) = state.conn.consume(len) {
            tracing::warn!(parent: self.link.span(), error = %e, "giving lent bytes back");
            return;
        }
        state.stats.bytes_received += len as u64;
        state.stats.lent_bytes += len as u64;
        // An error ends the connection; the next call reports it.
        let _ = self.post_controls(&mut state);
    }

    /// Reads (or peeks) into `buf`; with no `cx`, returns `WouldBlock` instead of waiting.
    fn read(
        &self,
        mut cx: Option<&mut Context<'_>>,
        buf: &mut ReadBuf<'_>,
        peek: bool,
    ) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        loop {
            // Like rsockets' rrecv, the queue is polled only when nothing is readable: bytes a
            // batch of completions delivered are read without polling it again for each read.
            if state.conn.read_status_len() == 0 {
                ready!(self.pump(&mut state, cx.as_deref_mut(), Reading::PollFn))?;
            }
            match state.conn.read_status() {
                ReadStatus::Data(_) => return Poll::Ready(self.copy_out(&mut state, buf, peek)),
                // Our own sends failed (not merely flushed): report that, not end-of-stream.
                ReadStatus::Eof
                    if state.transport_error.is_set() && state.conn.is_disconnected() =>
                {
                    return Poll::Ready(Err(self.failure(&state, None)));
                }
                ReadStatus::Eof => return Poll::Ready(Ok(())),
                ReadStatus::Failed(e) => return Poll::Ready(Err(self.failure(&state, Some(e)))),
                ReadStatus::Blocked => match cx.as_deref_mut() {
                    Some(cx) => ready!(self.wait(&mut state, Side::Read, cx, Waiter::Poll))?,
                    None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
                },
            }
        }
    }

    pub(super) fn poll_read(
        &self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
        peek: bool,
    ) -> Poll<io::Result<()>> {
        let coop = ready!(coop::poll_proceed(cx));
        let result = ready!(self.read(Some(cx), buf, peek));
        coop.made_progress();
        Poll::Ready(result)
    }

    /// Reads without waiting: `WouldBlock` when nothing is buffered.
    pub(super) fn try_read(&self, buf: &mut ReadBuf<'_>) -> io::Result<()> {
        match self.read(None, buf, false) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Waits until a read would not block (data, EOF or an error). Only the waker of the most
    /// recent call on the reading side (this or `poll_read`) is woken.
    pub(super) fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Side::Read, cx, Waiter::Poll)
    }

    /// Waits until a write would not block (room to send, or an error to report). Only the
    /// waker of the most recent call on the writing side is woken.
    pub(super) fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_ready(Side::Write, cx, Waiter::Poll)
    }

    /// Waits until `side` would not block; every task awaiting this at once is woken.
    pub(super) async fn ready(&self, side: Side) -> io::Result<()> {
        let mut registration = self.wakers[side as usize].registration();
        poll_fn(|cx| {
            let coop = ready!(coop::poll_proceed(cx));
            let result = ready!(self.poll_ready(side, cx, Waiter::Future(&mut registration)));
            coop.made_progress();
            Poll::Ready(result)
        })
        .await
    }

    fn poll_ready(
        &self,
        side: Side,
        cx: &mut Context<'_>,
        mut waiter: Waiter<'_, '_>,
    ) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        loop {
            ready!(self.pump(&mut state, Some(&mut *cx), waiter.reading_on(side)))?;
            let waiter = waiter.reborrow();
            match side {
                Side::Read if state.conn.read_status() == ReadStatus::Blocked => {
                    ready!(self.wait(&mut state, side, cx, waiter))?;
                }
                Side::Write => match state.conn.write_readiness() {
                    Err(WriteError::Blocked(reason)) => {
                        ready!(self.wait_to_write(&mut state, cx, waiter, Some(reason)))?;
                    }
                    _ => {
                        state.write_probe.disarm();
                        return Poll::Ready(Ok(()));
                    }
                },
                Side::Read => return Poll::Ready(Ok(())),
            }
        }
    }

    /// Writes from `bufs` in order, as much as fits now; with no `cx`, returns `WouldBlock`
    /// instead of waiting when nothing fits.
    fn write(
        &self,
        mut cx: Option<&mut Context<'_>>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let mut state = self.lock();
        // Like rsockets' rsend, completions are reaped only once the write cannot go on: a
        // write that can post goes straight to the device (a 64 B round trip polled the queue
        // for nothing here first).
        let mut pumped = false;
        let mut written = 0;
        // Every chunk of the call, and the control messages due after them, go to the device
        // with one `ibv_post_send`. Only a call that has written nothing yet returns or waits
        // below, so the chain is empty whenever it does.
        let mut chain = SendChain::new(&self.qp);
        // The call's buffers are one run of bytes (see `Gather`): rsockets ramps chunk sizes up
        // from 2 KiB in every write call; we send the largest chunks at once (fewer work
        // requests; the peer cannot tell the difference).
        let mut source = Gather::new(bufs);
        let mut call = WriteCall::largest();
        while source.remaining() > 0 {
            match state.conn.prepare_write(&mut call, source.remaining()) {
                Ok(write) => {
                    self.push_data(&mut state, &mut chain, &write, &mut source)?;
                    state.write_probe.disarm();
                    written += write.len;
                }
                Err(_) if written > 0 => break,
                Err(_) if !pumped => {
                    debug_assert!(chain.is_empty(), "a write waits with chunks unposted");
                    pumped = true;
                    ready!(self.pump(&mut state, cx.as_deref_mut(), Reading::No))?;
                }
                Err(WriteError::Blocked(reason)) => match cx.as_deref_mut() {
                    Some(cx) => {
                        ready!(self.wait_to_write(&mut state, cx, Waiter::Poll, Some(reason)))?
                    }
                    None => return Poll::Ready(Err(io::ErrorKind::WouldBlock.into())),
                },
                Err(WriteError::Closed) => return Poll::Ready(Err(self.failure(&state, None))),
                Err(WriteError::Failed(e)) => {
                    return Poll::Ready(Err(self.failure(&state, Some(e))));
                }
            }
        }
        self.push_controls(&mut state, &mut chain)?;
        self.post_chain(&mut state, &mut chain)?;
        Poll::Ready(Ok(written))
    }

    pub(super) fn poll_write(
        &self,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Poll::Ready(Ok(0));
        }
        let coop = ready!(coop::poll_proceed(cx));
        let result = ready!(self.write(Some(cx), bufs));
        coop.made_progress();
        Poll::Ready(result)
    }

    /// Writes without waiting: `WouldBlock` when nothing fits now.
    pub(super) fn try_write(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        if bufs.iter().all(|b| b.is_empty()) {
            return Ok(0);
        }
        match self.write(None, bufs) {
            Poll::Ready(result) => result,
            Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Everything written is already posted: this only posts control messages that are due,
    /// and reports a failure already known. Like `TcpStream`'s, it does not look for new ones:
    /// a send that failed is reported by the next read, or by the write that waits for the
    /// ring space or credits it holds. (Reaping completions here cost a completion-queue poll
    /// on every flush, a tenth of the instructions of a streamed 64 B message.)
    pub(super) fn poll_flush(&self) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        if let Some(e) = state.conn.error().cloned() {
            return Poll::Ready(Err(self.failure(&state, Some(e))));
        }
        self.post_controls(&mut state)?;
        Poll::Ready(Ok(()))
    }

    /// Sends rsockets' SHUTDOWN (or DISCONNECT when reading is over too) and waits until every
    /// send completed. The peer reads EOF and may keep writing to us.
    pub(super) fn poll_shutdown(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut state = self.lock();
        if !state.shutdown_started {
            state.shutdown_started = true;
            state.conn.shutdown_write();
        }
        loop {
            ready!(self.pump(&mut state, Some(&mut *cx), Reading::No))?;
            self.post_controls(&mut state)?;
            if state.conn.all_sends_done() || state.conn.is_disconnected() {
                return Poll::Ready(Ok(()));
            }
            if let Some(e) = state.conn.error().cloned() {
                return Poll::Ready(Err(self.failure(&state, Some(e))));
            }
            ready!(self.wait(&mut state, Side::Write, cx, Waiter::Poll))?;
        }
    }

    /// Posts a 0-byte RDMA write with immediate `imm`, outside the protocol (unsignaled, so the
    /// protocol never sees a completion for it): how tests play a peer that breaks the protocol.
    #[cfg(feature = "test-hooks")]
    pub(super) fn send_raw_immediate(&self, imm: u32) -> io::Result<()> {
        let _state = self.lock();
        self.qp.post(&WorkRequest {
            wr_id: 0,
            opcode: Opcode::Write {
                remote_addr: 0,
                rkey: 0,
                imm: Some(imm),
            },
            payload: Payload::Empty,
            signaled: false,
        })
    }

    /// Bytes received and not yet read, after handling what the completion queue holds (see
    /// `RStream::__readable_len`).
    #[cfg(feature = "test-hooks")]
    pub(super) fn readable_len(&self) -> io::Result<usize> {
        let mut state = self.lock();
        self.pump_some(&mut state)?;
        Ok(state.conn.read_status_len())
    }

    /// Where the peer's grant in our target SGL slot `slot` would take the next byte, and its
    /// key (see `RStream::__peer_grant`).
    #[cfg(feature = "test-hooks")]
    pub(super) fn peer_grant(&self, slot: usize) -> Option<(u64, u32)> {
        let state = self.lock();
        state.conn.target_slot(slot).map(|sge| (sge.addr, sge.key))
    }

    /// Writes `bytes` (inline, at most the inline size) to `remote_addr` under `rkey`, outside
    /// the protocol (see `RStream::__raw_write`); returns once the write completed.
    #[cfg(feature = "test-hooks")]
    pub(super) async fn raw_write(
        &self,
        remote_addr: u64,
        rkey: u32,
        bytes: &[u8],
    ) -> io::Result<()> {
        {
            let _state = self.lock();
            self.qp.post(&WorkRequest {
                wr_id: 0,
                opcode: Opcode::Write {
                    remote_addr,
                    rkey,
                    imm: None,
                },
                payload: Payload::Inline(bytes),
                signaled: true,
            })?;
        }
        // Its completion (or the error that breaks the connection) shows in the stream's state.
        let mut probe = [0u8; 1];
        let _ = poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut probe);
            self.poll_read(cx, &mut buf, true)
        })
        .await;
        Ok(())
    }

    /// Makes the next receive post fail (see `RStream::__fail_next_post_recv`).
    #[cfg(feature = "test-hooks")]
    pub(super) fn fail_next_post_recv(&self) {
        self.qp.fail_next_post_recv();
    }

    /// Posts up to `max` 0-byte DATA messages, as many as the peer's credits and the send
    /// queue allow now (valid rsockets messages that carry nothing): how tests flood a peer.
    /// Returns how many were posted; 0 means wait for `writable()`.
    #[cfg(feature = "test-hooks")]
    pub(super) fn send_empty_messages(&self, max: usize) -> io::Result<usize> {
        let mut state = self.lock();
        self.pump_some(&mut state)?;
        let mut sent = 0;
        let mut chain = SendChain::new(&self.qp);
        let mut refused = None;
        while sent < max {
            match state.conn.prepare_empty_write() {
                Ok(write) => {
                    self.push_data(&mut state, &mut chain, &write, &mut Gather::new(&[]))?;
                    sent += 1;
                }
                Err(WriteError::Blocked(_)) => break,
                Err(WriteError::Closed) => {
                    refused = Some(self.failure(&state, None));
                    break;
                }
                Err(WriteError::Failed(e)) => {
                    refused = Some(self.failure(&state, Some(e)));
                    break;
                }
            }
        }
        // What was planned is posted either way: the protocol counts it as sent.
        self.push_controls(&mut state, &mut chain)?;
        self.post_chain(&mut state, &mut chain)?;
        if let Some(e) = refused {
            return Err(e);
        }
        Ok(sent)
    }

    /// Moves the queue pair to the error state without a word to the peer: from then on this
    /// end drops the peer's packets, as a host that vanished would.
    #[cfg(feature = "test-hooks")]
    pub(super) fn vanish(&self) -> io::Result<()> {
        self.qp.set_error()
    }

    /// Posts rsockets' keepalive write now. A failed transport shows up in its completion.
    pub(super) fn send_keepalive(&self) -> io::Result<()> {
        let mut state = self.lock();
        state.conn.queue_keepalive();
        self.pump_some(&mut state)?;
        self.post_controls(&mut state)
    }

    pub(super) fn stats(&self) -> StreamStats {
        let mut stats = self.lock().stats;
        stats.busy_polls_yielded = self.cq.spins_yielded();
        stats.waits_yielded = self.cq.waits_yielded();
        stats
    }

    /// Queues rsockets' SHUTDOWN without waiting for it (dropping a write half).
    pub(super) fn begin_shutdown(&self) {
        let mut state = self.lock();
        if !state.shutdown_started {
            state.shutdown_started = true;
            state.conn.shutdown_write();
            let _ = self.pump_some(&mut state);
            let _ = self.post_controls(&mut state);
        }
    }

    /// Starts closing: queues rsockets' DISCONNECT. Returns whether sends are still in flight.
    pub(super) fn begin_close(&self) -> bool {
        let mut state = self.lock();
        state.conn.close();
        let _ = self.pump_some(&mut state);
        let _ = self.post_controls(&mut state);
        !Self::close_settled(&state)
    }

    /// Whether closing has nothing left to wait for: every send queued before the close
    /// completed, or the connection is already down.
    fn close_settled(state: &CoreState) -> bool {
        state.conn.all_sends_done() || state.conn.is_disconnected() || state.conn.error().is_some()
    }

    /// [`Self::linger`] without a runtime: polls the completion queue from this thread,
    /// sleeping a little between looks, until the sends queued before close completed or
    /// `deadline` passed (as rsockets' `rclose` blocks). Returns whether they completed.
    pub(super) fn linger_blocking(&self, deadline: std::time::Instant) -> bool {
        const FIRST_NAP: std::time::Duration = std::time::Duration::from_micros(50);
        const LONGEST_NAP: std::time::Duration = std::time::Duration::from_millis(1);
        let mut nap = FIRST_NAP;
        loop {
            {
                let mut state = self.lock();
                let handled = state.stats.send_completions + state.stats.recv_completions;
                if self.pump_some(&mut state).is_err() {
                    return false;
                }
                let _ = self.post_controls(&mut state);
                if Self::close_settled(&state) {
                    return state.conn.all_sends_done();
                }
                if state.stats.send_completions + state.stats.recv_completions != handled {
                    nap = FIRST_NAP;
                }
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return false;
            }
            std::thread::sleep(nap.min(deadline - now));
            nap = (nap * 2).min(LONGEST_NAP);
        }
    }

    /// Waits (boundedly, by the caller) until the sends queued before close completed.
    pub(super) async fn linger(self: Arc<Self>) {
        std::future::poll_fn(|cx| {
            let mut state = self.lock();
            loop {
                match self.pump(&mut state, Some(&mut *cx), Reading::No) {
                    Poll::Ready(Ok(())) => {}
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
                let _ = self.post_controls(&mut state);
                if Self::close_settled(&state) {
                    return Poll::Ready(());
                }
                match self.wait(&mut state, Side::Write, cx, Waiter::Poll) {
                    Poll::Ready(Ok(())) => continue,
                    Poll::Ready(Err(_)) => return Poll::Ready(()),
                    Poll::Pending => return Poll::Pending,
                }
            }
        })
        .await;
    }
}
