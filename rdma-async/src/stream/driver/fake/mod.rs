//! An in-process fake of the device under a stream ([`FakeDevice`]): two ends in one process
//! carry bytes between two [`StreamCore`]s, as smoltcp tests its sockets over a loopback device
//! and quinn-proto its connections over a test `Pair`. Test code only, not a transport.
//!
//! The host tests (`super::tests`) drive the two drivers `pair` returns; the fuzz harness,
//! outside `stream`, drives them through [`FakeStreams`].
//!
//! Both ends share one state behind a `Mutex`. Each end has plain `Vec<u8>` buffers standing
//! in for the registered ones, at made-up addresses and keys. Posting a chain executes its
//! requests at once, as the device would: an RDMA write copies into the peer's buffer at the
//! target address, with an immediate it also completes one of the peer's posted receives (or
//! waits for one, as a receiver-not-ready retry would), and every signaled request gives a
//! local send completion. A queued completion wakes its end's waiters. [`FakeWire`] injects
//! failures (the next post, the next poll), holds completions back, and disconnects (after
//! which posts are flushed).

mod chain;
mod streams;

use std::collections::VecDeque;
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Poll, Waker};

use self::chain::FakeChain;
pub(crate) use self::streams::FakeStreams;
use crate::cm::Woken;
use crate::proto::{
    Config, ConnData, Connection, LocalLayout, TARGET_SGL_BYTES, WR_ID_RECV_FLAG, WindowBind,
};
use crate::reactor::{BeforeSleep, WaitYields};
use crate::verbs::{CompletionBatch, PolledCompletion, UserBuffer, WorkCompletion};

use super::device::SideWait;
use super::{BATCH, CTRL_SLOT, CTRL_SLOTS, SPARE_RECVS, StreamCore, StreamDevice};

/// Where each end's receive ring and target SGL seem to be, and their keys (plus the end's
/// index): what the peer's RDMA writes name.
const RBUF_ADDR: u64 = 0x1000_0000;
const TARGET_SGL_ADDR: u64 = 0x2000_0000;
const RBUF_RKEY: u32 = 0x100;
const TARGET_SGL_RKEY: u32 = 0x200;

/// One end's side of the shared state.
#[derive(Debug, Default)]
struct End {
    /// SBUF, RBUF, TARGET_SGL, CTRL.
    buffers: [Vec<u8>; 4],
    /// Receives posted and not yet consumed.
    recvs: usize,
    /// The work request id of the receives posted.
    recv_wr_id: u64,
    /// Writes with immediate that found no receive posted: (immediate, length), delivered as
    /// receives are posted.
    unreceived: VecDeque<(u32, u32)>,
    /// The completion queue.
    completions: VecDeque<WorkCompletion>,
    /// For each send completion in `completions`, in order: the send work requests it
    /// retires (itself and the unsignaled ones posted before it), as a device frees their
    /// send-queue entries once it is polled.
    retires: VecDeque<usize>,
    /// Send work requests posted since the last one that queues a completion.
    unsignaled: usize,
    /// Send work requests occupying the send queue: posted, and their completion (or a later
    /// one's) not polled yet.
    sends_outstanding: usize,
    /// The most `sends_outstanding` ever was.
    sends_outstanding_max: usize,
    /// The send queue's depth (as `setup::build` asks the device for).
    sq_depth: usize,
    /// The receive queue's depth: receives posted at the start.
    rq_depth: usize,
    /// Calls that posted receives.
    recv_posts: u64,
    /// While set, polls find no completions (they stay queued).
    held: bool,
    fail_next_post: bool,
    fail_next_poll: bool,
    /// Looks at the completion queue (polls and waits).
    looks: u64,
    /// For each take of a wake-up's event, the looks made before it.
    wake_event_takes: Vec<u64>,
    /// The looks made before each arm ahead of a wait (`StreamDevice::arm_ahead`).
    arms_ahead: Vec<u64>,
    /// An arm ahead was made and no look since: a completion between the look before it and
    /// the arm raised no event on a device, so the next wait must look.
    look_owed: bool,
    /// Waits that skipped that look (`WaitHints::exclusive` while `look_owed`).
    looks_skipped: u64,
    /// The wakers of the reading and the writing side's waits.
    wakers: [Option<Waker>; 2],
    /// Memory windows bound: (window, buffer, range, key).
    binds: Vec<(usize, usize, usize, u32)>,
    /// A peer that writes a message with this immediate into every receive the moment it is
    /// posted, `flood_left` more times.
    flood: Option<u32>,
    flood_left: usize,
}

/// What the fake's queues of one end hold, for the fuzz harness's invariants.
#[cfg(any(test, rdma_async_fuzzing))]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FakeQueues {
    /// Receives posted and not consumed.
    pub(crate) recvs_posted: usize,
    /// Receive completions queued, not yet polled by the driver.
    pub(crate) recv_completions: usize,
    /// Writes with immediate that found no receive posted (a device would retry them).
    pub(crate) unreceived: usize,
    /// The receive queue's depth.
    pub(crate) rq_depth: usize,
    /// Calls that posted receives.
    pub(crate) recv_posts: u64,
    /// Send work requests occupying the send queue now, and the most ever.
    pub(crate) sends_outstanding: usize,
    pub(crate) sends_outstanding_max: usize,
    /// The send queue's depth.
    pub(crate) sq_depth: usize,
    /// Waits that skipped the look owed after an arm ahead (a device would sleep through a
    /// completion that came just before the arm).
    pub(crate) looks_skipped: u64,
}

impl End {
    /// The wakers to wake now that something changed for this end.
    fn take_wakers(&mut self) -> impl Iterator<Item = Waker> + use<> {
        let [read, write] = std::mem::take(&mut self.wakers);
        read.into_iter().chain(write)
    }

    /// Queues a completion of one of this end's send work requests: it retires the
    /// unsignaled ones posted before it too.
    fn complete_send(&mut self, wc: WorkCompletion) {
        self.completions.push_back(wc);
        self.retires
            .push_back(std::mem::take(&mut self.unsignaled) + 1);
    }

    /// One more send work request takes a send-queue entry.
    fn occupy_send(&mut self) {
        self.sends_outstanding += 1;
        self.sends_outstanding_max = self.sends_outstanding_max.max(self.sends_outstanding);
    }

    /// Completes every posted receive with the flooding peer's message, while it floods.
    fn deliver_flood(&mut self) {
        let Some(imm) = self.flood else { return };
        while self.recvs > 0 && self.flood_left > 0 {
            self.recvs -= 1;
            self.flood_left -= 1;
            self.completions.push_back(WorkCompletion {
                wr_id: self.recv_wr_id,
                imm_data: Some(imm),
                ..WorkCompletion::EMPTY
            });
        }
    }

    /// Completes posted receives for the writes with immediate waiting for them.
    fn deliver_unreceived(&mut self) {
        while self.recvs > 0
            && let Some((imm, len)) = self.unreceived.pop_front()
        {
            self.recvs -= 1;
            self.completions.push_back(WorkCompletion {
                wr_id: self.recv_wr_id,
                byte_len: len,
                imm_data: Some(imm),
                ..WorkCompletion::EMPTY
            });
        }
    }
}

/// The state both ends share.
#[derive(Debug, Default)]
struct Shared {
    ends: [End; 2],
    /// rdma_cm's view: the connection was disconnected.
    disconnected: bool,
}

/// Locks `shared`, whatever a panicking test left behind.
fn lock(shared: &Mutex<Shared>) -> MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Wakes `wakers`, once the shared state's lock is released.
fn wake(wakers: impl IntoIterator<Item = Waker>) {
    for waker in wakers {
        waker.wake();
    }
}

/// One end of the fake device.
#[derive(Debug)]
pub(super) struct FakeDevice {
    shared: Arc<Mutex<Shared>>,
    /// This end's index (0 or 1); the peer's is the other.
    end: usize,
    max_inline: usize,
    capacity: usize,
    span: tracing::Span,
}

/// The test's handle on the wire between the two ends: failure injection and control.
#[derive(Debug, Clone)]
pub(crate) struct FakeWire {
    shared: Arc<Mutex<Shared>>,
}

impl FakeWire {
    /// Makes `end`'s next post of a send chain fail, posting nothing.
    pub(crate) fn fail_next_post(&self, end: usize) {
        lock(&self.shared).ends[end].fail_next_post = true;
    }

    /// Makes `end`'s next poll of its completion queue (or wait on it) fail.
    pub(crate) fn fail_next_poll(&self, end: usize) {
        let wakers: Vec<Waker> = {
            let mut shared = lock(&self.shared);
            shared.ends[end].fail_next_poll = true;
            shared.ends[end].take_wakers().collect()
        };
        wake(wakers);
    }

    /// Holds `end`'s completions back (polls find none) while `held`; releasing wakes it.
    pub(crate) fn hold_completions(&self, end: usize, held: bool) {
        let wakers: Vec<Waker> = {
            let mut shared = lock(&self.shared);
            shared.ends[end].held = held;
            shared.ends[end].take_wakers().collect()
        };
        wake(wakers);
    }

    /// Disconnects the connection as rdma_cm would: both ends' waits see it closed, and
    /// whatever is posted from now on is flushed.
    pub(crate) fn disconnect(&self) {
        let wakers: Vec<Waker> = {
            let mut shared = lock(&self.shared);
            shared.disconnected = true;
            let [a, b] = &mut shared.ends;
            a.take_wakers().chain(b.take_wakers()).collect()
        };
        wake(wakers);
    }

    /// Makes `end`'s peer write an empty message with immediate `imm` into each of `end`'s
    /// receives as soon as it is posted, `messages` in all: a peer sending without pause.
    #[cfg(test)]
    pub(super) fn flood(&self, end: usize, imm: u32, messages: usize) {
        let wakers: Vec<Waker> = {
            let mut shared = lock(&self.shared);
            let end = &mut shared.ends[end];
            end.flood = Some(imm);
            end.flood_left = messages;
            end.deliver_flood();
            end.take_wakers().collect()
        };
        wake(wakers);
    }

    /// Completions queued for `end`, not yet polled.
    #[cfg(test)]
    pub(super) fn queued(&self, end: usize) -> usize {
        lock(&self.shared).ends[end].completions.len()
    }

    /// What `end`'s queues hold.
    pub(crate) fn queues(&self, end: usize) -> FakeQueues {
        let shared = lock(&self.shared);
        let end = &shared.ends[end];
        FakeQueues {
            recvs_posted: end.recvs,
            recv_completions: end
                .completions
                .iter()
                .filter(|wc| wc.wr_id & WR_ID_RECV_FLAG != 0)
                .count(),
            unreceived: end.unreceived.len(),
            rq_depth: end.rq_depth,
            recv_posts: end.recv_posts,
            sends_outstanding: end.sends_outstanding,
            sends_outstanding_max: end.sends_outstanding_max,
            sq_depth: end.sq_depth,
            looks_skipped: end.looks_skipped,
        }
    }

    /// How many times `end` looked at its completion queue (polls and waits).
    #[cfg(test)]
    pub(super) fn looks(&self, end: usize) -> u64 {
        lock(&self.shared).ends[end].looks
    }

    /// For each take of a wake-up's event at `end`, how many looks came before it.
    #[cfg(test)]
    pub(super) fn wake_event_takes(&self, end: usize) -> Vec<u64> {
        lock(&self.shared).ends[end].wake_event_takes.clone()
    }

    /// How many looks `end` had made before each of its arms ahead of a wait.
    #[cfg(test)]
    pub(super) fn arms_ahead(&self, end: usize) -> Vec<u64> {
        lock(&self.shared).ends[end].arms_ahead.clone()
    }

    /// Memory window binds `end` posted.
    pub(crate) fn binds(&self, end: usize) -> usize {
        lock(&self.shared).ends[end].binds.len()
    }
}

/// Two stream drivers connected over the fake device, with `config` on both ends (index 0
/// and 1), and the wire between them; the message sequence numbers start at 0.
#[cfg(test)]
pub(super) fn pair(
    config: Config,
) -> io::Result<(StreamCore<FakeDevice>, StreamCore<FakeDevice>, FakeWire)> {
    pair_from(config, 0)
}

/// Two stream drivers connected over the fake device, with `config` on both ends (index 0
/// and 1), and the wire between them; both directions' message sequence numbers start at
/// `start_seq`.
///
/// # Errors
///
/// The ends' connection data do not fit together, or posting the first controls failed.
fn pair_from(
    config: Config,
    start_seq: u16,
) -> io::Result<(StreamCore<FakeDevice>, StreamCore<FakeDevice>, FakeWire)> {
    let shared = Arc::new(Mutex::new(Shared::default()));
    let layout = |end: usize| LocalLayout {
        rbuf_addr: RBUF_ADDR,
        rbuf_rkey: RBUF_RKEY + end as u32,
        target_sgl_addr: TARGET_SGL_ADDR,
        target_sgl_rkey: TARGET_SGL_RKEY + end as u32,
        ring_keys: None,
    };
    let mut conns = [0, 1].map(|end| Connection::new(config, layout(end)));
    let datas = [0, 1].map(|end| conns[end].local_conn_data().encode());
    for (end, conn) in conns.iter_mut().enumerate() {
        let peer = ConnData::decode(&datas[1 - end]).map_err(io::Error::from)?;
        conn.handle_peer_conn_data(&peer).map_err(io::Error::from)?;
        conn.start_sequences_at(start_seq);
    }
    let devices = [0, 1].map(|end| {
        let mut state = lock(&shared);
        state.ends[end].buffers = [
            vec![0; config.sbuf_size() as usize],
            vec![0; config.rbuf_size() as usize],
            vec![0; TARGET_SGL_BYTES],
            vec![0; CTRL_SLOT * CTRL_SLOTS],
        ];
        // No windows on the fake (no lending ring): the send queue is `sq_size` deep.
        state.ends[end].sq_depth = config.sq_size() as usize;
        state.ends[end].rq_depth = config.rq_size() as usize + SPARE_RECVS;
        drop(state);
        FakeDevice {
            shared: shared.clone(),
            end,
            max_inline: config.inline_size() as usize,
            capacity: (config.sq_size() + config.rq_size()) as usize + SPARE_RECVS,
            span: tracing::Span::none(),
        }
    });
    // As `setup::build` does: every receive is posted before the peer can send anything.
    for device in &devices {
        device.post_empty_recvs(WR_ID_RECV_FLAG, config.rq_size() as usize + SPARE_RECVS)?;
    }
    let [conn_a, conn_b] = conns;
    let [device_a, device_b] = devices;
    let a = StreamCore::over(device_a, conn_a)?;
    let b = StreamCore::over(device_b, conn_b)?;
    Ok((a, b, FakeWire { shared }))
}

fn unsupported(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("the fake device has no {what}"),
    )
}

impl FakeDevice {
    fn peer(&self) -> usize {
        1 - self.end
    }
}

impl StreamDevice for FakeDevice {
    type Chain<'a> = FakeChain<'a>;

    fn chain(&self) -> FakeChain<'_> {
        FakeChain::new(self)
    }

    fn post_empty_recvs(&self, wr_id: u64, count: usize) -> io::Result<()> {
        if count == 0 {
            return Ok(());
        }
        let wakers: Vec<Waker> = {
            let mut shared = lock(&self.shared);
            let end = &mut shared.ends[self.end];
            end.recv_wr_id = wr_id;
            end.recvs += count;
            end.recv_posts += 1;
            end.deliver_unreceived();
            end.deliver_flood();
            end.take_wakers().collect()
        };
        wake(wakers);
        Ok(())
    }

    fn post_bind(&self, bind: WindowBind, target: (usize, usize)) -> io::Result<()> {
        let mut shared = lock(&self.shared);
        shared.ends[self.end]
            .binds
            .push((bind.half, target.0, target.1, bind.rkey));
        Ok(())
    }

    fn post_invalidate(&self, _: u64, _: usize, _: u32) -> io::Result<()> {
        Err(unsupported("memory windows to invalidate"))
    }

    fn deregister_range(&self, _: usize, _: usize) -> io::Result<()> {
        Err(unsupported("range registrations"))
    }

    fn window_completed(&self, _: &WorkCompletion) {}

    fn reclaim(&self, _: u64) -> Option<UserBuffer> {
        // Nothing is ever attached to the fake (`Payload::Attached` is refused).
        None
    }

    fn write_at(&self, buffer: usize, offset: usize, src: &[u8]) -> io::Result<()> {
        let mut shared = lock(&self.shared);
        let dst = shared.ends[self.end].buffers[buffer]
            .get_mut(offset..offset + src.len())
            .ok_or_else(out_of_range)?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn read_at(&self, buffer: usize, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        let shared = lock(&self.shared);
        let src = shared.ends[self.end].buffers[buffer]
            .get(offset..offset + dst.len())
            .ok_or_else(out_of_range)?;
        dst.copy_from_slice(src);
        Ok(())
    }

    fn append_to(&self, buffer: usize, range: Range<usize>, out: &mut Vec<u8>) -> io::Result<()> {
        let shared = lock(&self.shared);
        let src = shared.ends[self.end].buffers[buffer]
            .get(range)
            .ok_or_else(out_of_range)?;
        out.extend_from_slice(src);
        Ok(())
    }

    fn try_poll_batch<'b>(
        &self,
        batch: &'b mut CompletionBatch<BATCH>,
    ) -> io::Result<&'b [PolledCompletion]> {
        let mut shared = lock(&self.shared);
        let end = &mut shared.ends[self.end];
        end.looks += 1;
        end.look_owed = false;
        if std::mem::take(&mut end.fail_next_poll) {
            return Err(io::Error::other("fake device: injected poll failure"));
        }
        take_batch(end, batch);
        Ok(batch.as_slice())
    }

    fn end_wait(&self, _: &WaitYields) {}

    fn queue_capacity(&self) -> usize {
        self.capacity
    }

    fn spare_recvs(&self) -> usize {
        SPARE_RECVS
    }

    fn poll_wait(&self, wait: SideWait<'_, '_>, out: &mut CompletionBatch<BATCH>) -> Poll<Woken> {
        let mut shared = lock(&self.shared);
        let disconnected = shared.disconnected;
        let end = &mut shared.ends[self.end];
        end.looks += 1;
        if std::mem::take(&mut end.look_owed) && wait.hints.exclusive {
            end.looks_skipped += 1;
        }
        if std::mem::take(&mut end.fail_next_poll) {
            let err = io::Error::other("fake device: injected poll failure");
            return Poll::Ready(Woken::Completions(Err(err)));
        }
        if !end.held && !end.completions.is_empty() {
            take_batch(end, out);
            return Poll::Ready(Woken::Completions(Ok(out.as_slice().len())));
        }
        if disconnected {
            return Poll::Ready(Woken::Closed(Ok(())));
        }
        // Under the shared lock: whoever queues a completion next finds this waker.
        if let Some(BeforeSleep(register)) = wait.hints.before_sleep {
            register();
        }
        end.wakers[wait.side as usize] = Some(wait.cx.waker().clone());
        Poll::Pending
    }

    fn take_wake_event(&self) -> io::Result<bool> {
        // The fake wakes its waiters directly, with no event to take: it only records when
        // (as if each wake-up's event had come).
        let mut shared = lock(&self.shared);
        let end = &mut shared.ends[self.end];
        end.wake_event_takes.push(end.looks);
        Ok(true)
    }

    fn arm_ahead(&self) -> io::Result<()> {
        // Nor arms: it records when.
        let mut shared = lock(&self.shared);
        let end = &mut shared.ends[self.end];
        end.arms_ahead.push(end.looks);
        end.look_owed = true;
        Ok(())
    }

    fn span(&self) -> &tracing::Span {
        &self.span
    }

    fn peer_addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::new(10, 0, 0, self.peer() as u8 + 1), 7471))
    }

    fn is_disconnected(&self) -> bool {
        lock(&self.shared).disconnected
    }

    fn is_device_removed(&self) -> bool {
        false
    }

    fn closed_error(&self, _: bool) -> io::Error {
        io::Error::new(
            io::ErrorKind::ConnectionReset,
            format!("connection with {} closed", self.peer_addr()),
        )
    }
}

/// Moves up to a batch of `end`'s completions (none while held) into `batch`.
fn take_batch(end: &mut End, batch: &mut CompletionBatch<BATCH>) {
    batch.clear();
    if end.held {
        return;
    }
    while batch.as_slice().len() < BATCH
        && let Some(wc) = end.completions.pop_front()
    {
        if wc.wr_id & WR_ID_RECV_FLAG == 0 {
            let retired = end.retires.pop_front().unwrap_or(0);
            end.sends_outstanding -= retired;
        }
        batch.push(wc);
    }
}

fn out_of_range() -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        "range outside the fake's buffer",
    )
}
