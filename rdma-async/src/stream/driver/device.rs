//! [`StreamDevice`]: the narrow interface through which [`StreamCore`](super::StreamCore) reaches
//! its device (posting, polling and waiting for completions, the local rings, the connection's
//! end), and [`VerbsDevice`], the real one: a thin forwarding layer over the queue pair, the
//! completion queue, the waiters on its channels and the rdma_cm link.
//!
//! The driver is generic over it (static dispatch: every call is resolved at compile time and
//! inlined as before), so the same driver code also runs over an in-process fake in host
//! tests (`super::fake`).

use std::io;
use std::net::SocketAddr;
use std::ops::Range;
use std::task::{Context, Poll};

use crate::cm::link::CmLink;
use crate::cm::{ConnWaiter, Woken};
use crate::proto::{Connection, DataWrite, WindowBind};
use crate::reactor::{AsyncCq, WaitHints, WaitYields};
use crate::verbs::{
    CompletionBatch, Opcode, OwnedBufferQueuePair, Payload, PolledCompletion, SendChain,
    UserBuffer, WorkCompletion, WorkRequest,
};

use super::{BATCH, Side, StreamParts};

/// Send work requests gathered and posted together, in the order pushed.
pub(in crate::stream) trait PostChain {
    /// Whether no request waits to be posted.
    fn is_empty(&self) -> bool;

    /// The posts (doorbells) this chain made so far.
    fn posts(&self) -> u64;

    /// Appends `req`, posting what the chain holds first when it is full.
    ///
    /// # Errors
    ///
    /// `req` is invalid for the device, or the post made to make room failed (some of the
    /// held requests may then not have been posted).
    fn push(&mut self, req: &WorkRequest<'_>) -> io::Result<()>;

    /// Posts what the chain holds, if anything, and empties it.
    ///
    /// # Errors
    ///
    /// The device refused the post: some of the requests may not have been posted.
    fn post(&mut self) -> io::Result<()>;
}

/// The work request of the data write `write` (an RDMA write with its DATA immediate), its
/// bytes from `payload`.
pub(super) fn data_request<'p>(write: &DataWrite, payload: Payload<'p>) -> WorkRequest<'p> {
    WorkRequest {
        wr_id: write.wr_id,
        opcode: Opcode::Write {
            remote_addr: write.remote_addr,
            rkey: write.rkey,
            imm: Some(write.imm),
        },
        payload,
        signaled: write.signaled,
    }
}

/// What a stream's driver needs of its device: one connected queue pair with its four
/// registered buffers (indexed `SBUF`, `RBUF`, `TARGET_SGL`, `CTRL`), its completion queue, a
/// waiter for each side of the stream, and the connection's rdma_cm end.
pub(in crate::stream) trait StreamDevice {
    /// A send chain of this device.
    type Chain<'a>: PostChain
    where
        Self: 'a;

    /// An empty send chain.
    fn chain(&self) -> Self::Chain<'_>;

    /// Posts the data write `write` (an RDMA write with its DATA immediate) alone, its bytes
    /// from `payload`: a write call of one chunk with nothing else due, the usual one. A device
    /// may do this more cheaply than a chain of one.
    ///
    /// # Errors
    ///
    /// The payload is invalid for the device, or the device refused the post.
    fn post_data_write(&self, write: &DataWrite, payload: Payload<'_>) -> io::Result<()> {
        let mut chain = self.chain();
        chain.push(&data_request(write, payload))?;
        chain.post()
    }

    /// Posts `count` receives without buffers (for RDMA writes with immediate), each with
    /// work request id `wr_id`.
    ///
    /// # Errors
    ///
    /// The device refused the post.
    fn post_empty_recvs(&self, wr_id: u64, count: usize) -> io::Result<()>;

    /// Posts, alone, the bind the protocol planned: the window of ring half `bind.half`, under
    /// `bind.rkey`, over range registration `target.1` of buffer `target.0`.
    ///
    /// # Errors
    ///
    /// No such window or range, or the device refused the post.
    fn post_bind(&self, bind: WindowBind, target: (usize, usize)) -> io::Result<()>;

    /// Posts, alone and signaled, the invalidation of window `window`'s key `rkey`.
    ///
    /// # Errors
    ///
    /// No such window, or the device refused the post.
    fn post_invalidate(&self, wr_id: u64, window: usize, rkey: u32) -> io::Result<()>;

    /// Deregisters range registration `range` of buffer `buffer`: the key it gave stops
    /// working.
    ///
    /// # Errors
    ///
    /// No such range, or the device refused.
    fn deregister_range(&self, buffer: usize, range: usize) -> io::Result<()>;

    /// Takes a send completion into the books of the memory windows.
    fn window_completed(&self, wc: &WorkCompletion);

    /// Takes back the buffer attached under `attach_id`, if it is still attached.
    fn reclaim(&self, attach_id: u64) -> Option<UserBuffer>;

    /// Copies `src` into buffer `buffer` at `offset`.
    ///
    /// # Errors
    ///
    /// The range is outside the buffer.
    fn write_at(&self, buffer: usize, offset: usize, src: &[u8]) -> io::Result<()>;

    /// Copies buffer `buffer`'s bytes at `offset` into `dst`.
    ///
    /// # Errors
    ///
    /// The range is outside the buffer.
    fn read_at(&self, buffer: usize, offset: usize, dst: &mut [u8]) -> io::Result<()>;

    /// Appends the bytes at `range` of buffer `buffer` to `out`.
    ///
    /// # Errors
    ///
    /// The range is outside the buffer.
    fn append_to(&self, buffer: usize, range: Range<usize>, out: &mut Vec<u8>) -> io::Result<()>;

    /// Polls up to a batch of completions into `batch` without waiting, and returns them.
    ///
    /// # Errors
    ///
    /// Polling the completion queue failed.
    fn try_poll_batch<'b>(
        &self,
        batch: &'b mut CompletionBatch<BATCH>,
    ) -> io::Result<&'b [PolledCompletion]>;

    /// Completions came for the caller's current wait: the wait is over.
    fn end_wait(&self, yields: &WaitYields);

    /// How many completions the completion queue holds at most.
    fn queue_capacity(&self) -> usize;

    /// How many receives the receive queue holds beyond the `rq_size` the credits cover
    /// ([`SPARE_RECVS`](super::SPARE_RECVS), or fewer where the device allows no more).
    fn spare_recvs(&self) -> usize;

    /// Waits, as `wait.side`'s waiter, until completions come (copied into `out`) or the
    /// connection is closed; see [`ConnWaiter::poll_wait`].
    fn poll_wait(&self, wait: SideWait<'_, '_>, out: &mut CompletionBatch<BATCH>) -> Poll<Woken>;

    /// A wait slept and was woken: before the first look at the queue after it, takes the
    /// arm's event if it came; whether it did (the arm is then over); see
    /// [`AsyncCq::take_wake_event`](crate::reactor::AsyncCq::take_wake_event).
    ///
    /// # Errors
    ///
    /// Reading the completion channel failed.
    fn take_wake_event(&self) -> io::Result<bool>;

    /// Arms the queue, unless an arm is outstanding, after the look that took what a wake-up
    /// found and before the caller looks again; see
    /// [`AsyncCq::arm_ahead`](crate::reactor::AsyncCq::arm_ahead).
    ///
    /// # Errors
    ///
    /// Arming failed.
    fn arm_ahead(&self) -> io::Result<()>;

    /// The connection's tracing span.
    fn span(&self) -> &tracing::Span;

    /// The peer's address.
    fn peer_addr(&self) -> SocketAddr;

    /// Whether the connection was disconnected (by either end).
    fn is_disconnected(&self) -> bool;

    /// Whether the connection ended because its device was removed.
    fn is_device_removed(&self) -> bool;

    /// The error a closed connection reports (to a writer with `writing`).
    fn closed_error(&self, writing: bool) -> io::Error;
}

/// A wait of one side of the stream for its device's completions or connection events.
pub(in crate::stream) struct SideWait<'a, 'c> {
    /// The side that waits: each has a registration of its own with the device.
    pub(in crate::stream) side: Side,
    /// The context of the side's waker, which wakes every waiter of the side.
    pub(in crate::stream) cx: &'a mut Context<'c>,
    /// What the waiting caller knows.
    pub(in crate::stream) hints: WaitHints<'a>,
}

/// The real device: a queue pair with its own registered rings, its completion queue, the
/// waiters on its channels, and the rdma_cm link.
#[derive(Debug)]
pub(in crate::stream) struct VerbsDevice {
    // Drop order: disconnect, then destroy the queue pair, then free rings and queues.
    pub(super) link: CmLink,
    pub(super) qp: OwnedBufferQueuePair,
    pub(super) cq: AsyncCq,
    /// The reading and the writing side's registrations (indexed by [`Side`]).
    waiters: [ConnWaiter; 2],
    spare_recvs: usize,
}

impl VerbsDevice {
    /// The device of a stream connected over `link`, and the stream's protocol state.
    pub(super) fn new(parts: StreamParts, link: CmLink) -> io::Result<(Self, Connection)> {
        // Made before anything moves: a failure drops `link` first, then the queue pair and
        // the completion queue, as a dropped device does.
        let waiters = [
            ConnWaiter::new(&parts.cq, Some(&link))?,
            ConnWaiter::new(&parts.cq, Some(&link))?,
        ];
        let device = VerbsDevice {
            link,
            qp: parts.qp,
            cq: parts.cq,
            waiters,
            spare_recvs: parts.spare_recvs,
        };
        Ok((device, parts.conn))
    }
}

impl Drop for VerbsDevice {
    fn drop(&mut self) {
        // Before the fields go (the link's disconnect, then the queue pair's destruction): a
        // lending ring's windows, bound through the queue pair, are revoked between the two, so
        // the peer sees the disconnect first and the destruction does not wait for them.
        // A failed disconnect changes nothing here: the link's own drop ignores it too.
        let _ = self.link.disconnect();
        self.qp.revoke_windows();
    }
}

impl PostChain for SendChain<'_> {
    #[inline]
    fn is_empty(&self) -> bool {
        SendChain::is_empty(self)
    }

    #[inline]
    fn posts(&self) -> u64 {
        SendChain::posts(self)
    }

    #[inline]
    fn push(&mut self, req: &WorkRequest<'_>) -> io::Result<()> {
        SendChain::push(self, req)
    }

    #[inline]
    fn post(&mut self) -> io::Result<()> {
        SendChain::post(self)
    }
}

impl StreamDevice for VerbsDevice {
    type Chain<'a> = SendChain<'a>;

    #[inline]
    fn chain(&self) -> SendChain<'_> {
        SendChain::new(&self.qp)
    }

    // Always inlined: it posts every data write of the usual write call (see
    // `StreamCore::push_data_write`).
    #[inline(always)]
    fn post_data_write(&self, write: &DataWrite, payload: Payload<'_>) -> io::Result<()> {
        self.qp.post_write_with_imm(
            write.wr_id,
            (write.remote_addr, write.rkey),
            write.imm,
            payload,
            write.signaled,
        )
    }

    #[inline]
    fn post_empty_recvs(&self, wr_id: u64, count: usize) -> io::Result<()> {
        self.qp.post_empty_recvs(wr_id, count)
    }

    #[inline]
    fn post_bind(&self, bind: WindowBind, target: (usize, usize)) -> io::Result<()> {
        self.qp.post_bind(bind.wr_id, bind.half, target, bind.rkey)
    }

    #[inline]
    fn post_invalidate(&self, wr_id: u64, window: usize, rkey: u32) -> io::Result<()> {
        self.qp.post_invalidate(wr_id, window, rkey)
    }

    #[inline]
    fn deregister_range(&self, buffer: usize, range: usize) -> io::Result<()> {
        self.qp.deregister_range(buffer, range)
    }

    #[inline]
    fn window_completed(&self, wc: &WorkCompletion) {
        self.qp.window_completed(wc);
    }

    #[inline]
    fn reclaim(&self, attach_id: u64) -> Option<UserBuffer> {
        self.qp.reclaim(attach_id)
    }

    #[inline]
    fn write_at(&self, buffer: usize, offset: usize, src: &[u8]) -> io::Result<()> {
        self.qp.buffer(buffer).write_at(offset, src)
    }

    #[inline]
    fn read_at(&self, buffer: usize, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        self.qp.buffer(buffer).read_at(offset, dst)
    }

    #[inline]
    fn append_to(&self, buffer: usize, range: Range<usize>, out: &mut Vec<u8>) -> io::Result<()> {
        self.qp
            .buffer(buffer)
            .append_to(range.start, range.len(), out)
    }

    #[inline]
    fn try_poll_batch<'b>(
        &self,
        batch: &'b mut CompletionBatch<BATCH>,
    ) -> io::Result<&'b [PolledCompletion]> {
        self.cq.try_poll_batch(batch)
    }

    #[inline]
    fn end_wait(&self, yields: &WaitYields) {
        self.cq.end_wait(yields);
    }

    #[inline]
    fn queue_capacity(&self) -> usize {
        self.cq.queue().capacity()
    }

    fn spare_recvs(&self) -> usize {
        self.spare_recvs
    }

    #[inline]
    fn poll_wait(&self, wait: SideWait<'_, '_>, out: &mut CompletionBatch<BATCH>) -> Poll<Woken> {
        let waiter = &self.waiters[wait.side as usize];
        waiter.poll_wait(&self.cq, Some(&self.link), wait.cx, out, wait.hints)
    }

    #[inline]
    fn take_wake_event(&self) -> io::Result<bool> {
        // Any waiter reads the queue's channel; the reading side's is as good as the other.
        self.waiters[Side::Read as usize].take_wake_event(&self.cq)
    }

    #[inline]
    fn arm_ahead(&self) -> io::Result<()> {
        self.cq.arm_ahead()
    }

    #[inline]
    fn span(&self) -> &tracing::Span {
        self.link.span()
    }

    #[inline]
    fn peer_addr(&self) -> SocketAddr {
        self.link.peer_addr()
    }

    #[inline]
    fn is_disconnected(&self) -> bool {
        self.link.is_disconnected()
    }

    #[inline]
    fn is_device_removed(&self) -> bool {
        self.link.is_device_removed()
    }

    #[inline]
    fn closed_error(&self, writing: bool) -> io::Error {
        self.link.closed_error(writing)
    }
}
