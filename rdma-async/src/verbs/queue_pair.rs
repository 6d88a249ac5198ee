//! `ibv_qp`: reliable-connected queue pairs created through rdma_cm, and safe posting.
//!
//! Posting is safe because a work request can point only into memory that the queue pair keeps
//! until it is destroyed. What that memory is tells the two kinds apart, as the type parameter of
//! [`RcQueuePair`]:
//!
//! - [`OwnedBufferQueuePair`] (`RStream`, `Endpoint`) owns the registered buffers it posts from:
//!   a work request names a buffer by index and a range that is checked against it, and may
//!   carry its bytes inline instead.
//! - [`CallerMemoryQueuePair`] (`RdmaConnection`) posts caller memory: the buffers move into a
//!   slot of its [`InFlightTable`] first, and that table (an `Arc` the queue pair holds) outlives
//!   the queue pair. It may receive through a shared receive queue instead of its own.
//!
//! Each kind has only its own posting methods, so posting one kind's way on the other does not
//! compile (`rdma-async/tests/ui/test_hooks/fail_queue_pair_kinds.rs`). What they share lives on
//! `RcQueuePair<M>` once: creation, the state change to error, and the drop order (`Drop` destroys
//! the queue pair before any field, the memory `M` included, is dropped).

use std::collections::HashMap;
use std::io;
use std::mem::MaybeUninit;
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};

use rdma_async_sys as sys;

use super::cm_id::CmId;
use super::comp_queue::CompletionQueue;
use super::deferred_sends::DeferredSends;
use super::in_flight::{Held, InFlightTable, Ticket, WorkQueue};
use super::memory::RegisteredBuffer;
use super::memory_window::{MemoryWindow, WindowOp, fill_invalidate_key};
use super::protection_domain::ProtectionDomain;
use super::remote_grants::{BufferRange, RemoteGrants};
use super::send_chain::SendChain;
use super::shared_recv_queue::SharedRecvQueue;
use super::user_buffer::UserBuffer;
use super::work::WorkCompletion;
use crate::error;

/// Queue sizes requested for a queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_inline_data: u32,
    /// Gather entries per send work request (at most [`MAX_SEGMENTS`]).
    pub(crate) max_send_sge: u32,
}

/// A connected queue pair and the memory `M` its work requests point into.
///
/// Use it through [`OwnedBufferQueuePair`] or [`CallerMemoryQueuePair`]. (The types are `pub` only
/// so that the `test-hooks` feature can name them in a compile-fail case; the module is private.)
#[derive(Debug)]
pub struct RcQueuePair<M> {
    id: Arc<CmId>,
    qp_num: u32,
    max_inline_data: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    /// Whether the queue pair still exists: every use of it holds the read lock, so
    /// [`Self::destroy`] (the write lock) never frees it under a post.
    live: RwLock<bool>,
    /// Test hook: the next receive post fails as if the provider refused it.
    #[cfg(feature = "test-hooks")]
    fail_next_post_recv: std::sync::atomic::AtomicBool,
    /// What outstanding work requests point into: dropped only after the queue pair was
    /// destroyed (by [`Self::destroy`] or `Drop::drop`), like every other field.
    memory: M,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

/// The memory of an [`OwnedBufferQueuePair`]: registered buffers that work requests index, and
/// the caller's buffers lent to it for zero-copy sends.
#[derive(Debug)]
pub struct OwnedBuffers {
    /// Memory windows over parts of `fixed` (a zero-copy ring's halves). Declared first:
    /// deallocated (revoking them) before the registrations they are bound to.
    windows: Vec<MemoryWindow>,
    /// What the windows are bound over, and the views of `fixed` lent out.
    grants: RemoteGrants,
    fixed: Vec<RegisteredBuffer>,
    /// Caller buffers that work requests may name ([`Payload::Lent`]), by lend id. A buffer
    /// leaves only through [`OwnedBufferQueuePair::reclaim`], which the owner calls once the
    /// completion covering every request that named it was polled; otherwise it is freed with
    /// the queue pair, after the queue pair was destroyed.
    lent: Mutex<Lent>,
}

/// The lent buffers and the next lend id.
#[derive(Debug, Default)]
struct Lent {
    next_id: u64,
    buffers: HashMap<u64, UserBuffer>,
}

/// A view of bytes of an [`OwnedBufferQueuePair`]'s buffer that nothing but the CPU can write
/// ([`OwnedBufferQueuePair::view`]); no window is bound over them until it is dropped.
#[derive(Debug)]
pub(crate) struct BufferView<'q> {
    grants: &'q RemoteGrants,
    id: u64,
    bytes: &'q [u8],
}

impl std::ops::Deref for BufferView<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.bytes
    }
}

impl Drop for BufferView<'_> {
    fn drop(&mut self) {
        self.grants.give_back(self.id);
    }
}

/// The memory of a [`CallerMemoryQueuePair`]: the table that holds the caller's buffers while
/// their work requests are outstanding, and the shared receive queue it receives through, if any.
#[derive(Debug)]
pub struct CallerMemory {
    table: Arc<InFlightTable>,
    srq: Option<Arc<SharedRecvQueue>>,
    /// Sends and writes of up to this many bytes go inline: what the caller asked, capped by
    /// what the provider granted (which may be more than asked).
    inline_limit: u32,
    /// Sends and writes posted with their bytes inline (`IBV_SEND_INLINE`).
    inline_posts: AtomicU64,
    /// `ibv_post_send` calls: doorbells rung.
    send_posts: AtomicU64,
    /// Send-queue requests built but not yet posted ([`CallerMemoryQueuePair::ring`]).
    deferred: DeferredSends,
    /// Test hook: the next post of deferred requests fails as if the provider refused it.
    #[cfg(feature = "test-hooks")]
    fail_next_ring: std::sync::atomic::AtomicBool,
}

/// Whether a send-queue request reached the device when it was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doorbell {
    /// Posted with its own `ibv_post_send`.
    Rung,
    /// Left for [`CallerMemoryQueuePair::ring`]; `first` when the requests waiting before it
    /// were none, so that its operation is the one that rings.
    Deferred { first: bool },
}

/// A request moved into the in-flight table and posted, or left to be posted.
#[derive(Debug)]
pub(crate) struct Posted {
    pub(crate) ticket: Ticket,
    pub(crate) doorbell: Doorbell,
}

impl From<Ticket> for Posted {
    fn from(ticket: Ticket) -> Self {
        Posted {
            ticket,
            doorbell: Doorbell::Rung,
        }
    }
}

/// A queue pair that posts from the registered buffers it owns (ring buffers, message slots).
pub type OwnedBufferQueuePair = RcQueuePair<OwnedBuffers>;

/// A queue pair that posts caller memory, held in its in-flight table until completion.
pub type CallerMemoryQueuePair = RcQueuePair<CallerMemory>;

// SAFETY: posting to a QP is thread-safe in libibverbs; the struct hands out no references into
// C memory or registered buffers, and its memory `M` crosses threads only as far as `M` allows.
unsafe impl<M: Send> Send for RcQueuePair<M> {}
// SAFETY: as above.
unsafe impl<M: Sync> Sync for RcQueuePair<M> {}

/// A range of one buffer of a work request: one of an [`OwnedBufferQueuePair`]'s own buffers, or
/// one of the [`Held`] buffers a [`CallerMemoryQueuePair`] posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index into the queue pair's buffers (or into the `Held` buffers).
    pub(crate) buffer: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Where the bytes of a send or write come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// No bytes (a zero-length write with immediate, for example).
    Empty,
    /// Up to [`MAX_SEGMENTS`] ranges of the queue pair's buffers, gathered in order.
    Segments(&'a [Segment]),
    /// Bytes copied into the work request itself (at most `max_inline_data`).
    Inline(&'a [u8]),
    /// `len` bytes at `offset` of a buffer lent to the queue pair
    /// ([`OwnedBufferQueuePair::lend`]).
    Lent { id: u64, offset: usize, len: usize },
}

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    /// A send, consuming one of the peer's posted receives.
    Send { imm: Option<u32> },
    /// An RDMA write into the peer's registered memory at `remote_addr`, which the peer's
    /// `rkey` protects; with an immediate it also consumes one of the peer's posted receives.
    Write {
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    /// An RDMA read of the peer's memory at `remote_addr` into the scatter list.
    Read { remote_addr: u64, rkey: u32 },
    /// An atomic compare-and-swap of the peer's 8-byte word; the old value lands in the list.
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    /// An atomic fetch-and-add of the peer's 8-byte word; the old value lands in the list.
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

/// One work request for the send queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkRequest<'a> {
    pub(crate) wr_id: u64,
    pub(crate) opcode: Opcode,
    pub(crate) payload: Payload<'a>,
    pub(crate) signaled: bool,
}

/// Most scatter/gather entries a work request may carry (a ring buffer's wrap needs two; the
/// vectored operations of caller memory up to this many).
pub(crate) const MAX_SEGMENTS: usize = 16;

/// An unused scatter/gather entry.
const NO_SGE: sys::ibv_sge = sys::ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

impl<M> RcQueuePair<M> {
    /// Creates the RC queue pair of `id` on `pd`, keeping `memory` until it is destroyed;
    /// receives go to `srq` when given, else `recv_sge` scatter entries each.
    #[allow(clippy::too_many_arguments)]
    fn create(
        id: Arc<CmId>,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: QpCaps,
        recv_sge: u32,
        srq: Option<&SharedRecvQueue>,
        memory: M,
    ) -> io::Result<Self> {
        // SAFETY: ibv_qp_init_attr is plain old data; zero is valid for every field.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_send_sge.clamp(1, MAX_SEGMENTS as u32);
        attr.cap.max_recv_sge = recv_sge.clamp(1, MAX_SEGMENTS as u32);
        attr.cap.max_inline_data = caps.max_inline_data;
        if let Some(srq) = srq {
            if !Arc::ptr_eq(srq.pd(), &pd) {
                return Err(error::invalid_input(
                    "the shared receive queue belongs to another protection domain",
                ));
            }
            attr.srq = srq.as_ptr();
            attr.cap.max_recv_wr = 0;
            attr.cap.max_recv_sge = 0;
        }
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        // SAFETY: the CQs (and SRQ) in `attr` are on `pd`'s device and are kept by the queue
        // pair (the SRQ in `memory`), which destroys itself before releasing them.
        let qp_num = unsafe { id.create_qp(&pd, &mut attr)? };
        Ok(RcQueuePair {
            id,
            qp_num,
            max_inline_data: attr.cap.max_inline_data,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            live: RwLock::new(true),
            #[cfg(feature = "test-hooks")]
            fail_next_post_recv: std::sync::atomic::AtomicBool::new(false),
            memory,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _pd: pd,
        })
    }

    /// Runs `use_qp` on the queue pair while it exists (the read lock keeps [`Self::destroy`]
    /// out); `NotConnected` once it was destroyed.
    fn with_qp<R>(&self, use_qp: impl FnOnce(*mut sys::ibv_qp) -> io::Result<R>) -> io::Result<R> {
        let live = self.live.read().unwrap_or_else(PoisonError::into_inner);
        if !*live {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "the connection's queue pair was destroyed (the connection failed or ended)",
            ));
        }
        // SAFETY: the id's QP lives until `destroy` (or our Drop), which waits for this lock.
        use_qp(unsafe { (*self.id.as_ptr()).qp })
    }

    /// Destroys the queue pair now, before its memory is dropped: once this returns the device
    /// no longer accesses any work request's memory, so buffers of work requests that never
    /// completed may be handed back or freed. Later posts fail with `NotConnected`; a second
    /// call does nothing.
    pub(crate) fn destroy(&self) {
        let mut live = self.live.write().unwrap_or_else(PoisonError::into_inner);
        if *live {
            *live = false;
            // SAFETY: the QP is live (checked under the write lock, so no post is using it) and
            // destroyed once; rdma_cm clears the id's pointer to it.
            unsafe { sys::rdma_destroy_qp(self.id.as_ptr()) };
            super::resource_limits::QUEUE_PAIRS.destroyed(0);
        }
    }

    /// Test hook: makes the next receive post fail (`ENOMEM`, as a full receive queue would).
    #[cfg(feature = "test-hooks")]
    pub(crate) fn fail_next_post_recv(&self) {
        self.fail_next_post_recv
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// Whether this receive post is the one a test asked to fail.
    fn injected_recv_failure(&self) -> io::Result<()> {
        #[cfg(feature = "test-hooks")]
        if self
            .fail_next_post_recv
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            return Err(error::call_error("ibv_post_recv", libc::ENOMEM));
        }
        Ok(())
    }

    /// The inline limit the provider granted (it may exceed the one asked for).
    pub(crate) fn max_inline_data(&self) -> u32 {
        self.max_inline_data
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// Posts `wr` (with its scatter/gather list, and the requests chained after it through
    /// `next`) to the send queue.
    ///
    /// # Safety
    ///
    /// Every request of the chain is initialised, and every entry of each request's list points
    /// into memory that stays allocated and registered until the request's completion is polled
    /// or the queue pair is destroyed, whichever is first; an inline entry, which the provider
    /// copies during this call, need only be valid for the call and within the queue pair's
    /// inline limit. Remote addresses may be anything: the device
    /// reaches the peer's memory only through the peer's rkey.
    #[inline]
    pub(super) unsafe fn post_send_wr(&self, wr: &mut sys::ibv_send_wr) -> io::Result<()> {
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live while `with_qp` runs; the caller vouches for the memory `wr`
        // names.
        let ret = self.with_qp(|qp| Ok(unsafe { sys::rdma_async_post_send(qp, wr, &mut bad) }))?;
        if ret != 0 {
            return Err(error::call_error("ibv_post_send", ret));
        }
        Ok(())
    }

    /// Moves the queue pair to the error state: outstanding work requests complete with
    /// `IBV_WC_WR_FLUSH_ERR` and no new ones execute.
    pub(crate) fn set_error(&self) -> io::Result<()> {
        // SAFETY: ibv_qp_attr is plain old data; zero is valid for every field.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = sys::ibv_qp_state::IBV_QPS_ERR;
        let mask = sys::ibv_qp_attr_mask::IBV_QP_STATE as i32;
        // SAFETY: the QP is live while `with_qp` runs; `attr` is initialised and IBV_QP_STATE
        // names its only field used.
        let ret = self.with_qp(|qp| Ok(unsafe { sys::ibv_modify_qp(qp, &mut attr, mask) }))?;
        if ret != 0 {
            return Err(error::call_error("ibv_modify_qp", ret));
        }
        Ok(())
    }
}

impl<M> Drop for RcQueuePair<M> {
    fn drop(&mut self) {
        // After this the device no longer accesses the QP's work requests, so its memory
        // (dropped after this) can be freed.
        self.destroy();
    }
}

impl OwnedBufferQueuePair {
    /// Creates the RC queue pair of `id` on `pd` (of `id`'s device), posting from `buffers`
    /// (registered on `pd`).
    pub(crate) fn new(
        id: Arc<CmId>,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: QpCaps,
        buffers: Vec<RegisteredBuffer>,
        windows: Vec<MemoryWindow>,
    ) -> io::Result<Self> {
        if windows.iter().any(|w| !Arc::ptr_eq(w.pd(), &pd)) {
            return Err(error::invalid_input(
                "a memory window of another protection domain than the queue pair's",
            ));
        }
        let memory = OwnedBuffers {
            grants: RemoteGrants::new(windows.len()),
            windows,
            fixed: buffers,
            lent: Mutex::default(),
        };
        Self::create(id, pd, send_cq, recv_cq, caps, 1, None, memory)
    }

    pub(crate) fn buffer(&self, index: usize) -> &RegisteredBuffer {
        &self.memory.fixed[index]
    }

    /// Posts, unsignaled, a bind of window `window` under the key `rkey` over range
    /// registration `range` of buffer `buffer` (all of it), for remote write. Posted alone, so
    /// the window's key can be recorded once the provider has read the old one.
    pub(crate) fn post_bind(
        &self,
        wr_id: u64,
        window: usize,
        (buffer, range): (usize, usize),
        rkey: u32,
    ) -> io::Result<()> {
        let mw = self.window(window)?;
        let fixed = self
            .memory
            .fixed
            .get(buffer)
            .ok_or_else(|| error::invalid_input(format!("no registered buffer {buffer}")))?;
        let (mr, offset, len) = fixed.ranges().for_bind(range).ok_or_else(|| {
            error::invalid_input(format!("no registration {range} of buffer {buffer}"))
        })?;
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        let access = sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        mw.fill_bind_with(&mut wr, (mr, fixed.addr(offset), len), access, rkey);
        let target = BufferRange {
            buffer,
            offset,
            len,
        };
        self.memory.grants.bind(window, target, || {
            // SAFETY: no scatter/gather list; the window and the registration it names belong
            // to this queue pair's memory, which outlives the queue pair (a registration with
            // a window bound to it cannot be deregistered: providers refuse).
            unsafe { self.post_send_wr(&mut wr) }?;
            mw.set_rkey(rkey);
            Ok(())
        })
    }

    /// Deregisters range registration `range` of buffer `buffer` now: whatever key it gave the
    /// peer stops working.
    pub(crate) fn deregister_range(&self, buffer: usize, range: usize) -> io::Result<()> {
        let fixed = self
            .memory
            .fixed
            .get(buffer)
            .ok_or_else(|| error::invalid_input(format!("no registered buffer {buffer}")))?;
        fixed.ranges().deregister(range)
    }

    /// Takes a send completion: a successful invalidation posted by [`Self::post_invalidate`]
    /// unbinds its window. Whether it was one.
    pub(crate) fn window_completed(&self, wc: &WorkCompletion) -> bool {
        self.memory.grants.completed(wc)
    }

    /// A view of `len` bytes at `offset` of buffer `buffer`, when nothing but the CPU can
    /// write them: no window is bound over them, no registration gives a peer or a local work
    /// request write access. No window is bound over them while the view lives.
    ///
    /// # Errors
    ///
    /// An error (kind `Other`) when something might still write the bytes.
    pub(crate) fn view(
        &self,
        buffer: usize,
        offset: usize,
        len: usize,
    ) -> io::Result<BufferView<'_>> {
        let fixed = self
            .memory
            .fixed
            .get(buffer)
            .ok_or_else(|| error::invalid_input(format!("no registered buffer {buffer}")))?;
        let range = BufferRange {
            buffer,
            offset,
            len,
        };
        let id = self
            .memory
            .grants
            .lend(range, fixed.may_be_written(offset, len))?;
        match fixed.unreachable_view(offset, len) {
            Some(bytes) => Ok(BufferView {
                grants: &self.memory.grants,
                id,
                bytes,
            }),
            None => {
                self.memory.grants.give_back(id);
                Err(io::Error::other(format!(
                    "bytes {offset}+{len} of buffer {buffer} cannot be viewed"
                )))
            }
        }
    }

    /// Posts a signaled local invalidation of window key `rkey` of window `window`.
    pub(crate) fn post_invalidate(&self, wr_id: u64, window: usize, rkey: u32) -> io::Result<()> {
        self.window(window)?;
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
        fill_invalidate_key(&mut wr, rkey);
        self.memory.grants.invalidate(window, wr_id, || {
            // SAFETY: no scatter/gather list and no memory named: only a key.
            unsafe { self.post_send_wr(&mut wr) }
        })
    }

    fn window(&self, index: usize) -> io::Result<&MemoryWindow> {
        self.memory
            .windows
            .get(index)
            .ok_or_else(|| error::invalid_input(format!("no memory window {index}")))
    }

    /// The protection domain of the queue pair.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self._pd
    }

    /// Lends `buffer` to the queue pair, so that work requests can send from it
    /// ([`Payload::Lent`] with the returned id). It must be registered on the queue pair's
    /// protection domain.
    pub(crate) fn lend(&self, buffer: UserBuffer) -> Result<u64, (io::Error, UserBuffer)> {
        if !Arc::ptr_eq(buffer.registered().pd(), &self._pd) {
            let err = error::invalid_input(format!(
                "the region is registered in another device context (protection domain) than \
                 the stream's (device {}); register it through the stream's context",
                self._pd.device_name()
            ));
            return Err((err, buffer));
        }
        let mut lent = self
            .memory
            .lent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let id = lent.next_id;
        lent.next_id += 1;
        lent.buffers.insert(id, buffer);
        Ok(id)
    }

    /// Takes back lent buffer `id`. Call it only once the completion covering every work
    /// request that named it was polled (or none was posted): the device may read it until
    /// then.
    pub(crate) fn reclaim(&self, id: u64) -> Option<UserBuffer> {
        let mut lent = self
            .memory
            .lent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lent.buffers.remove(&id)
    }

    /// The gather entry for `len` bytes at `offset` of lent buffer `id`, after checking them.
    pub(super) fn lent_sge(&self, id: u64, offset: usize, len: usize) -> io::Result<sys::ibv_sge> {
        self.with_lent(id, |buffer| buffer.registered().sge(offset, len))
    }

    /// Runs `f` on lent buffer `id`.
    fn with_lent<R>(&self, id: u64, f: impl FnOnce(&UserBuffer) -> io::Result<R>) -> io::Result<R> {
        let lent = self
            .memory
            .lent
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(lent
            .buffers
            .get(&id)
            .ok_or_else(|| error::invalid_input(format!("no lent buffer {id}")))?)
    }

    /// The scatter/gather entry of `segment`, after checking it against the buffer it names.
    pub(super) fn sge(&self, segment: Segment) -> io::Result<sys::ibv_sge> {
        self.memory
            .fixed
            .get(segment.buffer)
            .ok_or_else(|| {
                error::invalid_input(format!("no registered buffer {}", segment.buffer))
            })?
            .sge(segment.offset, segment.len)
    }

    /// Posts one work request to the send queue.
    pub(crate) fn post(&self, req: &WorkRequest<'_>) -> io::Result<()> {
        let mut chain = SendChain::new(self);
        chain.push(req)?;
        chain.post()
    }

    /// Posts a receive into `segment`.
    pub(crate) fn post_recv(&self, wr_id: u64, segment: Segment) -> io::Result<()> {
        let sge = self.sge(segment)?;
        self.post_recv_sge(wr_id, sge)
    }

    /// Posts `count` receives with no buffer (for RDMA writes with immediate), chained so that
    /// a batch of them costs one `ibv_post_recv`.
    pub(crate) fn post_empty_recvs(&self, wr_id: u64, count: usize) -> io::Result<()> {
        const CHAIN: usize = 32;
        // Only the requests posted are written: a ping-pong posts one at a time.
        let mut wrs = [const { MaybeUninit::<sys::ibv_recv_wr>::uninit() }; CHAIN];
        let base = wrs.as_mut_ptr().cast::<sys::ibv_recv_wr>();
        let mut left = count;
        while left > 0 {
            let n = left.min(CHAIN);
            for (i, wr) in wrs[..n].iter_mut().enumerate() {
                wr.write(sys::ibv_recv_wr {
                    wr_id,
                    next: if i + 1 < n {
                        base.wrapping_add(i + 1)
                    } else {
                        ptr::null_mut()
                    },
                    sg_list: ptr::null_mut(),
                    num_sge: 0,
                });
            }
            // SAFETY: the first `n` requests are written and linked, live on this stack frame
            // across the call, and carry no memory for the device to write.
            unsafe { self.post_recv_chain(base) }?;
            left -= n;
        }
        Ok(())
    }

    /// Posts a receive into the first `len` bytes of lent buffer `id` (which must be writable
    /// by the device; reclaim it only after this receive's completion was polled).
    pub(crate) fn post_recv_lent(&self, wr_id: u64, id: u64, len: usize) -> io::Result<()> {
        let sge = self.with_lent(id, |buffer| {
            let registered = buffer.registered();
            if !registered.locally_writable() {
                return Err(error::invalid_input(format!(
                    "lent buffer {id} is read-only: the device cannot receive into it"
                )));
            }
            registered.sge(0, len)
        })?;
        self.post_recv_sge(wr_id, sge)
    }

    fn post_recv_sge(&self, wr_id: u64, mut sge: sys::ibv_sge) -> io::Result<()> {
        let mut wr = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        // SAFETY: `wr` and its entry live across the call; the device may write only a checked
        // range of a buffer this QP owns (fixed or lent) and frees after destroying the QP.
        unsafe { self.post_recv_chain(&mut wr) }
    }

    /// Posts the receive requests chained from `first` with one `ibv_post_recv`.
    ///
    /// # Safety
    ///
    /// `first` heads a null-terminated chain of initialised requests, valid for the call, and
    /// the device may write every range they name until their completions are polled or the
    /// queue pair is destroyed.
    unsafe fn post_recv_chain(&self, first: *mut sys::ibv_recv_wr) -> io::Result<()> {
        self.injected_recv_failure()?;
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live while `with_qp` runs; the chain is valid (the caller's
        // contract).
        let ret =
            self.with_qp(|qp| Ok(unsafe { sys::rdma_async_post_recv(qp, first, &mut bad) }))?;
        if ret != 0 {
            return Err(error::call_error("ibv_post_recv", ret));
        }
        Ok(())
    }
}

impl CallerMemoryQueuePair {
    /// Creates the RC queue pair of `id` on `pd` (which may belong to another id on the same
    /// device) that posts caller memory through `table`, and receives from `srq` when given.
    /// `recv_sge` is the scatter entries per receive.
    pub(crate) fn new(
        id: Arc<CmId>,
        pd: Arc<ProtectionDomain>,
        cq: Arc<CompletionQueue>,
        caps: QpCaps,
        recv_sge: u32,
        table: Arc<InFlightTable>,
        srq: Option<Arc<SharedRecvQueue>>,
    ) -> io::Result<Self> {
        let srq_ref = srq.clone();
        let memory = CallerMemory {
            table,
            srq,
            inline_limit: 0,
            inline_posts: AtomicU64::new(0),
            send_posts: AtomicU64::new(0),
            deferred: DeferredSends::default(),
            #[cfg(feature = "test-hooks")]
            fail_next_ring: std::sync::atomic::AtomicBool::new(false),
        };
        let asked = caps.max_inline_data;
        let mut qp = Self::create(
            id,
            pd,
            cq.clone(),
            cq,
            caps,
            recv_sge,
            srq_ref.as_deref(),
            memory,
        )?;
        qp.memory.inline_limit = asked.min(qp.max_inline_data);
        Ok(qp)
    }

    /// Sends and writes of up to this many bytes go inline.
    pub(crate) fn inline_limit(&self) -> u32 {
        self.memory.inline_limit
    }

    /// How many sends and writes went out inline.
    pub(crate) fn inline_posts(&self) -> u64 {
        self.memory.inline_posts.load(Ordering::Relaxed)
    }

    /// How many `ibv_post_send` calls the send queue took.
    pub(crate) fn send_posts(&self) -> u64 {
        self.memory.send_posts.load(Ordering::Relaxed)
    }

    /// Posts `wr` (and the requests linked after it), counting the doorbell.
    ///
    /// # Safety
    ///
    /// As [`Self::post_send_wr`].
    unsafe fn post_send_counted(&self, wr: &mut sys::ibv_send_wr) -> io::Result<()> {
        self.memory.send_posts.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's obligations are those of `post_send_wr`.
        unsafe { self.post_send_wr(wr) }
    }

    /// Moves `held` into the in-flight table and posts a signaled send-queue work request over
    /// `segments` of it; a send or write of 1 to `max_inline_data` bytes goes inline (the
    /// provider copies the bytes while posting, sparing the device a DMA read; the buffers are
    /// still held until the completion, as for any other request). With `defer`, or while
    /// deferred requests wait (they go first), the request is left for [`Self::ring`] instead.
    /// On failure nothing was posted and the buffers come back.
    pub(crate) fn post_caller(
        &self,
        opcode: Opcode,
        held: Held,
        segments: &[Segment],
        defer: bool,
    ) -> Result<Posted, (io::Error, Held)> {
        let table = &self.memory.table;
        let max_sge = self.max_send_sge;
        let mut doorbell = Doorbell::Rung;
        let ticket = hold_and_post(
            table,
            WorkQueue::Send,
            held,
            segments,
            max_sge,
            |wr_id, sges| {
                // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
                let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                wr.wr_id = wr_id;
                wr.sg_list = sges.as_mut_ptr();
                wr.num_sge = sges.len() as i32;
                wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
                let bytes: u64 = sges.iter().map(|sge| u64::from(sge.length)).sum();
                let carries_data = matches!(opcode, Opcode::Send { .. } | Opcode::Write { .. });
                let inline =
                    carries_data && bytes > 0 && bytes <= u64::from(self.memory.inline_limit);
                if inline {
                    wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE;
                }
                set_opcode(&mut wr, opcode);
                let posted = if defer || self.memory.deferred.is_waiting() {
                    // Its entries are copied; the table holds the buffers they name until the
                    // completion, also for an inline request (the provider copies its bytes
                    // when it is posted).
                    let first = self.memory.deferred.push(wr, sges);
                    doorbell = Doorbell::Deferred { first };
                    Ok(())
                } else {
                    // SAFETY: every entry covers a checked range of a buffer that the table
                    // holds until this request's completion is polled, and the table outlives
                    // the QP (it is in `memory`, dropped after the QP is destroyed).
                    unsafe { self.post_send_counted(&mut wr) }
                };
                if posted.is_ok() && inline {
                    self.memory.inline_posts.fetch_add(1, Ordering::Relaxed);
                }
                posted
            },
        )?;
        Ok(Posted { ticket, doorbell })
    }

    /// Test hook: the next [`Self::ring`] that has requests to post fails (`ENOMEM`) and posts
    /// none of them.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn fail_next_ring(&self) {
        self.memory.fail_next_ring.store(true, Ordering::Release);
    }

    /// Whether requests left by [`Self::post_caller`] wait for [`Self::ring`].
    pub(crate) fn has_deferred(&self) -> bool {
        self.memory.deferred.is_waiting()
    }

    /// Forgets the requests [`Self::post_caller`] left, without posting them, and returns
    /// their `wr_id`s (their buffers stay in the table until their slots are completed).
    /// Posting happens only while the connection is open: once it closed, nothing posts them.
    pub(crate) fn forget_deferred(&self) -> Vec<u64> {
        self.memory.deferred.forget()
    }

    /// Posts the requests [`Self::post_caller`] left, in the order left, with one
    /// `ibv_post_send`.
    ///
    /// # Errors
    ///
    /// `ibv_post_send`'s, or `NotConnected` once the queue pair was destroyed. Some of the
    /// requests may then not have been posted: they stay outstanding in the table, which only
    /// destroying the queue pair and flushing the table settles (what the connection does).
    pub(crate) fn ring(&self) -> io::Result<()> {
        #[cfg(feature = "test-hooks")]
        if self.memory.deferred.is_waiting()
            && self.memory.fail_next_ring.swap(false, Ordering::AcqRel)
        {
            // As a provider that refused the whole chain: none of it reaches the device.
            return self
                .memory
                .deferred
                .post_all(|_| Err(error::call_error("ibv_post_send", libc::ENOMEM)));
        }
        self.memory.deferred.post_all(|head| {
            // SAFETY: every request of the list was built by `post_caller` over entries it
            // checked against buffers the table holds until the request's completion is polled
            // or the QP is destroyed (the table outlives the QP: it is in `memory`); `post_all`
            // linked the list and its entries, which live for this call.
            unsafe { self.post_send_counted(head) }
        })
    }

    /// Moves `held` (a [`Held::Window`]) into the in-flight table and posts a signaled bind or
    /// invalidation of its window. The window must belong to this queue pair's protection
    /// domain, as must the region (a type-2 window is bound through, and then used only by, the
    /// queue pair that bound it). On failure nothing was posted and both come back.
    pub(crate) fn post_window(
        &self,
        op: WindowOp,
        held: Held,
    ) -> Result<Ticket, (io::Error, Held)> {
        let Held::Window(binding) = &held else {
            return Err((
                error::invalid_input("a window operation needs a window"),
                held,
            ));
        };
        if !Arc::ptr_eq(binding.window.pd(), &self._pd)
            || !Arc::ptr_eq(binding.region.registered().pd(), &self._pd)
        {
            return Err((
                error::invalid_input(
                    "the window or its region belongs to another device context than the connection",
                ),
                held,
            ));
        }
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
        let filled = match op {
            WindowOp::Bind {
                offset,
                len,
                access,
            } => binding
                .window
                .fill_bind(&mut wr, &binding.region, offset, len, access),
            WindowOp::Invalidate => {
                binding.window.fill_invalidate(&mut wr);
                Ok(())
            }
        };
        if let Err(e) = filled {
            return Err((e, held));
        }
        let (ticket, wr_id) = self.memory.table.insert(held, WorkQueue::Send)?;
        wr.wr_id = wr_id;
        // SAFETY: the request has no scatter/gather list; the window and the region it names
        // are in the table's slot until its completion is polled, and the table outlives the
        // queue pair (it is in `memory`).
        if let Err(e) = unsafe { self.post_send_counted(&mut wr) } {
            return Err((e, self.memory.table.take_back(ticket)));
        }
        Ok(ticket)
    }

    /// Moves `held` into the in-flight table and posts a receive scattering into `segments`.
    pub(crate) fn post_recv_caller(
        &self,
        held: Held,
        segments: &[Segment],
    ) -> Result<Ticket, (io::Error, Held)> {
        if self.memory.srq.is_some() {
            return Err((
                error::invalid_input(
                    "this connection receives through its shared receive queue: post there",
                ),
                held,
            ));
        }
        let table = &self.memory.table;
        post_recv_into(table, held, segments, self.max_recv_sge, |wr, bad| {
            self.injected_recv_failure()?;
            // SAFETY: the QP is live while `with_qp` runs; every entry covers a checked range of
            // a buffer that the table holds until this request's completion is polled (or the
            // QP is destroyed), and the table outlives the QP (it is in `memory`).
            let ret = self.with_qp(|qp| Ok(unsafe { sys::rdma_async_post_recv(qp, wr, bad) }))?;
            if ret != 0 {
                return Err(error::call_error("ibv_post_recv", ret));
            }
            Ok(())
        })
    }
}

/// Checks `segments` against the buffers they index and builds their scatter/gather entries.
fn held_sges(
    held: &Held,
    segments: &[Segment],
    max: u32,
    sges: &mut [sys::ibv_sge; MAX_SEGMENTS],
) -> io::Result<usize> {
    if segments.len() > max as usize || segments.len() > MAX_SEGMENTS {
        return Err(error::invalid_input(format!(
            "{} scatter/gather segments; this queue pair takes at most {max}",
            segments.len()
        )));
    }
    for (sge, seg) in sges.iter_mut().zip(segments) {
        let buf = held
            .get(seg.buffer)
            .ok_or_else(|| error::invalid_input(format!("no buffer {}", seg.buffer)))?
            .registered();
        if seg
            .offset
            .checked_add(seg.len)
            .is_none_or(|end| end > buf.len())
        {
            return Err(error::invalid_input(format!(
                "range {}..{} is outside the {}-byte region",
                seg.offset,
                seg.offset.saturating_add(seg.len),
                buf.len()
            )));
        }
        *sge = sys::ibv_sge {
            addr: buf.addr(seg.offset),
            length: u32::try_from(seg.len)
                .map_err(|_| error::invalid_input("a segment is longer than 4 GiB"))?,
            lkey: buf.lkey(),
        };
    }
    Ok(segments.len())
}

/// Posts a receive of caller memory through `post` (a queue pair's or a shared receive queue's
/// `ibv_post_recv`), holding the buffers in `table` first.
pub(super) fn post_recv_into(
    table: &InFlightTable,
    held: Held,
    segments: &[Segment],
    max_sge: u32,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> io::Result<()>,
) -> Result<Ticket, (io::Error, Held)> {
    hold_and_post(
        table,
        WorkQueue::Recv,
        held,
        segments,
        max_sge,
        |wr_id, sges| {
            // SAFETY: ibv_recv_wr is plain old data; zero is valid for every field.
            let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = wr_id;
            wr.sg_list = sges.as_mut_ptr();
            wr.num_sge = sges.len() as i32;
            let mut bad = ptr::null_mut();
            post(&mut wr, &mut bad)
        },
    )
}

/// Checks `segments` against the buffers of `held`, moves `held` into a slot of `table` for
/// `queue`, and has `post` post a work request with the slot's `wr_id` over the checked
/// scatter/gather entries. If posting fails the slot is freed and the buffers come back.
fn hold_and_post(
    table: &InFlightTable,
    queue: WorkQueue,
    held: Held,
    segments: &[Segment],
    max_sge: u32,
    post: impl FnOnce(u64, &mut [sys::ibv_sge]) -> io::Result<()>,
) -> Result<Ticket, (io::Error, Held)> {
    let mut sges = [NO_SGE; MAX_SEGMENTS];
    let num_sge = match held_sges(&held, segments, max_sge, &mut sges) {
        Ok(n) => n,
        Err(e) => return Err((e, held)),
    };
    let (ticket, wr_id) = table.insert(held, queue)?;
    if let Err(e) = post(wr_id, &mut sges[..num_sge]) {
        return Err((e, table.take_back(ticket)));
    }
    Ok(ticket)
}

/// Sets the opcode, its remote address and key or atomic operands, and the immediate data.
pub(super) fn set_opcode(wr: &mut sys::ibv_send_wr, opcode: Opcode) {
    let imm = match opcode {
        Opcode::Send { imm } => {
            wr.opcode = if imm.is_some() {
                sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            } else {
                sys::ibv_wr_opcode::IBV_WR_SEND
            };
            imm
        }
        Opcode::Write {
            remote_addr,
            rkey,
            imm,
        } => {
            wr.opcode = if imm.is_some() {
                sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
            } else {
                sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
            };
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            imm
        }
        Opcode::Read { remote_addr, rkey } => {
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            None
        }
        Opcode::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            let op = sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            set_atomic(wr, op, remote_addr, rkey, compare, swap);
            None
        }
        Opcode::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            let op = sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            set_atomic(wr, op, remote_addr, rkey, add, 0);
            None
        }
    };
    if let Some(imm) = imm {
        wr.__bindgen_anon_1.imm_data = imm.to_be();
    }
}

fn set_atomic(
    wr: &mut sys::ibv_send_wr,
    opcode: sys::ibv_wr_opcode::Type,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
) {
    wr.opcode = opcode;
    wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
        remote_addr,
        compare_add,
        swap,
        rkey,
    };
}
