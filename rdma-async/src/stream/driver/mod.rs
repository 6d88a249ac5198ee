//! [`StreamCore`]: the state every handle of one stream shares, behind one lock: the rsockets
//! protocol state machine (`crate::proto`), the queue pair and its registered rings.
//!
//! The protocol state machine decides what to post; this code copies bytes between the application and the
//! registered rings, posts the work requests, and feeds completions and CM events back. All
//! protocol state sits behind one lock, and the completion queue is polled only under it, so
//! completions are handled in the order the device produced them. The reading and the writing
//! side each wait through their own registrations of the channel descriptors
//! ([`ConnWaiter`](crate::cm::ConnWaiter)), and whichever side handles completions wakes the
//! other; every task waiting on a side is woken ([`SideWakers`]).
//!
//! The driver reaches its device only through [`StreamDevice`] (posting, polling, waiting, the
//! local rings, the connection's end): [`VerbsDevice`] on a real one, an in-process fake in the
//! host tests (`fake`, `tests`) and the fuzz harness (`crate::fuzzing::stream_driver`).
//!
//! A peer can keep the completion queue busy for ever (a flood of valid 0-byte messages or
//! credit updates), so the work per poll is bounded: every batch of up to [`BATCH`]
//! completions spends one unit of Tokio's cooperative budget (128 per task poll, so at most
//! 4096 completions before the task yields), and a call without a task context (`try_read`,
//! `try_write`, the keepalive) handles at most [`PUMP_BATCHES`] batches. Completions left
//! behind stay queued and are handled, in order, by the next call. A read of bytes already
//! delivered, or a write that posts at once, spends no budget: neither can go on for ever
//! without completions to refill the ring or return credits.

mod close;
mod completions;
mod counted_lock;
mod device;
#[cfg(any(test, rdma_async_fuzzing))]
mod fake;
#[cfg(rdma_async_hooks)]
mod hooks;
mod post;
mod read;
mod readiness;
mod region;
mod setup;
#[cfg(test)]
mod tests;
mod timeouts;
mod wait;
mod write;

use counted_lock::{CountedGuard, CountedLock};
pub(in crate::stream) use device::{PostChain, StreamDevice, VerbsDevice};
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use fake::FakeStreams;
pub(in crate::stream) use setup::{StreamParts, apply_peer_conn_data, build, pinned_bytes};

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::sync::Arc;
use std::task::Waker;

use crate::cm::link::CmLink;
use crate::device::DeviceContext;
use crate::error::StickyError;
use crate::proto::{Connection, ProtoError, ProtoErrorKind};
use crate::reactor::WaitYields;
use crate::stream::deadline_timer::DeadlineTimer;
use crate::stream::region_write::AttachedBuffer;
use crate::stream::side_wakers::SideWakers;
use crate::stream::stats::StreamStats;
use crate::verbs::UserBuffer;

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
/// Receives a stream posts beyond the `rq_size` its credits cover (where the device allows), so
/// that consumed ones can go back in chains of this many: a ping-pong's one receive a round trip
/// was a call of the provider's `ibv_post_recv` to itself (as C's is). With fewer than that held
/// back, the queue always holds at least as many receives as when each went back at once.
pub(crate) const SPARE_RECVS: usize = 8;

/// Which side of the stream is waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::stream) enum Side {
    Read,
    Write,
}

#[derive(Debug)]
struct CoreState {
    conn: Connection,
    /// The first transport failure, which explains the protocol's later "failed" state.
    transport_error: StickyError,
    shutdown_started: bool,
    /// Wakes the writers when the protocol's next deadline (`Connection::poll_timeout`) is
    /// due.
    timer: DeadlineTimer,
    stats: StreamStats,
    /// Caller buffers attached to the queue pair by zero-copy writes, in post order of their last
    /// send.
    attached: VecDeque<AttachedBuffer>,
    /// Attached buffers the device is done with, for their writes to pick up (by attach id).
    returned: HashMap<u64, UserBuffer>,
    /// Attach ids of writes that were dropped: their buffers are freed when they come back.
    abandoned: HashSet<u64>,
    /// An `ibv_post_send` failed: requests the protocol counts as outstanding may never have
    /// been posted, so their completions (and the buffers they would free) may never come.
    post_failed: bool,
    /// The last look at the completion queue in this hold of the lock (every look is made
    /// under it) found the queue empty: it returned less than a full batch. A wait then need
    /// not look again under an arm made earlier ([`WaitHints::exclusive`](crate::reactor::WaitHints::exclusive)).
    queue_empty: bool,
    /// A wait went to sleep and no look has been made since: the next look first takes the
    /// event that woke it ([`StreamDevice::take_wake_event`]) if `reads_until_empty`.
    slept: bool,
    /// The last call that moved bytes was a read that took some.
    took_bytes: bool,
    /// The reader reads until it finds nothing (hyper's does): after it took bytes, its next
    /// read slept, with no write in between (a ping-pong writes first). Its wake-ups then take
    /// their event and arm again before the bytes are handed up, so that the read that finds
    /// nothing after them sleeps with no system call ([`StreamDevice::take_wake_event`]); a
    /// ping-pong's reader reads it as its next wait starts, which gives the answer that much
    /// longer to come before it sleeps (and makes no arm whose event would come while it is
    /// awake).
    reads_until_empty: bool,
    /// The yields of the current wait for completions, by either side.
    yields: WaitYields,
    /// Receives consumed and not posted again yet: they go back once there are `repost_batch`.
    unposted_recvs: usize,
    /// The spare receives the queue holds beyond the credits ([`StreamDevice::spare_recvs`]),
    /// at least 1: consumed receives go back in chains of this many.
    repost_batch: usize,
}

/// One stream connection's queue pair, protocol state and wake-ups, over the device `D`
/// (the real one, [`VerbsDevice`], unless a test drives it over a fake).
#[derive(Debug)]
pub(in crate::stream) struct StreamCore<D: StreamDevice = VerbsDevice> {
    // Drop order: the device (disconnect, then destroy the queue pair, then free rings and
    // queues), then the rest.
    device: D,
    /// The tasks waiting on each side (indexed by [`Side`]).
    wakers: [Arc<SideWakers>; 2],
    /// What each side's registration and timers wake: every task waiting on that side.
    side_wakers: [Waker; 2],
    /// Its blocked lockers counted: a task that busy-polls while holding it stops spinning
    /// when there is one (the other half of a split stream, on another worker, wants to go on).
    state: CountedLock<CoreState>,
}

impl StreamCore {
    pub(in crate::stream) fn new(parts: StreamParts, link: CmLink) -> io::Result<Self> {
        let (device, conn) = VerbsDevice::new(parts, link)?;
        StreamCore::over(device, conn)
    }

    pub(in crate::stream) fn link(&self) -> &CmLink {
        &self.device.link
    }

    /// The device context of the stream's queue pair and rings.
    pub(in crate::stream) fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.device.qp.pd().clone())
    }

    pub(in crate::stream) fn stats(&self) -> StreamStats {
        let mut stats = self.lock().stats;
        stats.busy_polls_yielded = self.device.cq.spins_yielded();
        stats.waits_yielded = self.device.cq.waits_yielded();
        stats.cq_arms = self.device.cq.arms();
        stats
    }
}

impl<D: StreamDevice> StreamCore<D> {
    /// The stream over `device`, whose protocol state is `conn` (connected: the peer's
    /// connection data applied, the first receives posted).
    pub(in crate::stream) fn over(device: D, conn: Connection) -> io::Result<Self> {
        let wakers: [Arc<SideWakers>; 2] = Default::default();
        let repost_batch = device.spare_recvs().max(1);
        let core = StreamCore {
            side_wakers: [wakers[0].waker(), wakers[1].waker()],
            wakers,
            device,
            state: CountedLock::new(CoreState {
                conn,
                transport_error: StickyError::default(),
                shutdown_started: false,
                timer: DeadlineTimer::default(),
                stats: StreamStats::default(),
                attached: VecDeque::new(),
                returned: HashMap::new(),
                abandoned: HashSet::new(),
                post_failed: false,
                queue_empty: false,
                slept: false,
                took_bytes: false,
                reads_until_empty: false,
                yields: WaitYields::default(),
                unposted_recvs: 0,
                repost_batch,
            }),
        };
        // The first SGL update (the second half of our ring) goes out at once.
        let mut state = core.lock();
        core.post_controls(&mut state)?;
        drop(state);
        Ok(core)
    }

    fn lock(&self) -> CountedGuard<'_, CoreState> {
        // Every update keeps the state consistent before anything that could panic.
        let mut state = self.state.lock();
        // Only a look made under this hold of the lock counts for its waits.
        state.queue_empty = false;
        state
    }

    fn wake_all(&self) {
        for wakers in &self.wakers {
            wakers.wake_all();
        }
    }

    /// Records a local failure that broke the connection and returns it.
    fn fatal(&self, state: &mut CoreState, err: io::Error) -> io::Error {
        let first = !state.transport_error.is_set();
        if first {
            tracing::warn!(parent: self.device.span(), error = %err, "connection failed");
        }
        state
            .conn
            .handle_fatal(ProtoError::new(ProtoErrorKind::SendFailed, err.to_string()));
        let err = state.transport_error.record(err);
        if first {
            // Tasks waiting on either side wait for completions that may never come now (a
            // reader, while a write's post failed): they learn of the failure at once.
            self.wake_all();
        }
        err
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
                    self.device.peer_addr(),
                    e.message()
                ),
            ),
            // No send failed with a status of its own (that would be the transport error
            // above): ours were flushed because the peer disconnected. Say that, not which
            // internal message was in flight.
            Some(e) if e.kind() == ProtoErrorKind::SendFailed && self.device.is_disconnected() => {
                io::Error::new(
                    e.io_kind(),
                    format!(
                        "connection with {} reset: the peer disconnected while our sends were \
                         in flight (they were flushed)",
                        self.device.peer_addr()
                    ),
                )
            }
            Some(e) => e.into(),
            None => io::Error::new(
                io::ErrorKind::BrokenPipe,
                format!(
                    "connection to {} is closed for writing",
                    self.device.peer_addr()
                ),
            ),
        }
    }
}
