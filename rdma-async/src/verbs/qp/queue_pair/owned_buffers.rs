//! [`OwnedBufferQueuePair`]: a queue pair that posts from the registered buffers it owns (a
//! stream's rings, an endpoint's message slots), and from caller buffers attached to it for
//! zero-copy sends and receives; memory windows over parts of its buffers, and views of bytes
//! no peer can reach.

use std::collections::HashMap;
use std::io;
use std::ptr::{self, NonNull};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use rdma_async_sys as sys;

use super::super::remote_grants::{BufferRange, RemoteGrants};
use super::super::work_request::Segment;
use super::{QpCaps, RcQueuePair};
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::cq::{CompletionQueue, WorkCompletion};
use crate::verbs::mr::{MemoryWindow, RegisteredBuffer, UserBuffer, fill_invalidate_key};
use crate::verbs::pd::ProtectionDomain;

/// The memory of an [`OwnedBufferQueuePair`]: registered buffers that work requests index, and
/// the caller's buffers attached to it for zero-copy sends and receives.
#[derive(Debug)]
pub struct OwnedBuffers {
    /// Memory windows over parts of `fixed` (a zero-copy ring's halves). Declared first:
    /// deallocated (revoking them) before the registrations they are bound to.
    windows: Vec<MemoryWindow>,
    /// What the windows are bound over, and the open views of `fixed`.
    grants: RemoteGrants,
    fixed: Vec<RegisteredBuffer>,
    /// Caller buffers that work requests may name
    /// ([`Payload::Attached`](crate::verbs::qp::Payload::Attached)), by attach id. A buffer
    /// leaves only through [`OwnedBufferQueuePair::reclaim`], which the owner calls once the
    /// completion covering every request that named it was polled; otherwise it is freed with
    /// the queue pair, after the queue pair was destroyed.
    attached: Mutex<Attached>,
    /// The receives without a buffer that [`OwnedBufferQueuePair::post_empty_recvs`] posts,
    /// linked once.
    empty_recvs: OnceLock<EmptyRecvs>,
}

/// Most receives without a buffer posted with one `ibv_post_recv`.
const EMPTY_RECV_CHAIN: usize = 32;

/// [`EMPTY_RECV_CHAIN`] receive requests without a buffer, each linked to the next, the last to
/// none, all with one wr_id: any tail of it is a chain to post. A heap array held by a raw
/// pointer, not a `Box`: the links are pointers into it, which must stay valid where the owner
/// moves (moving a `Box` asserts unique access to what it points at, and so would disown them);
/// never written once built.
struct EmptyRecvs {
    wrs: NonNull<sys::ibv_recv_wr>,
    wr_id: u64,
}

// SAFETY: the requests' pointers point only into their own heap array (or are null), which is
// never written after `new` links it: moving it to, or reading it from, another thread is as
// safe as doing so with plain integers.
unsafe impl Send for EmptyRecvs {}
// SAFETY: as above; shared use only reads.
unsafe impl Sync for EmptyRecvs {}

impl EmptyRecvs {
    fn new(wr_id: u64) -> Self {
        let unlinked = sys::ibv_recv_wr {
            wr_id,
            next: ptr::null_mut(),
            sg_list: ptr::null_mut(),
            num_sge: 0,
        };
        let array: Box<[sys::ibv_recv_wr]> = vec![unlinked; EMPTY_RECV_CHAIN].into_boxed_slice();
        let wrs = NonNull::from(Box::leak(array)).cast::<sys::ibv_recv_wr>();
        let base = wrs.as_ptr();
        for i in 0..EMPTY_RECV_CHAIN - 1 {
            // SAFETY: `i` and `i + 1` are within the array of EMPTY_RECV_CHAIN requests just
            // allocated, which nothing else references yet; every link is derived from `base`.
            unsafe { (*base.wrapping_add(i)).next = base.wrapping_add(i + 1) };
        }
        EmptyRecvs { wrs, wr_id }
    }

    fn wr_id(&self) -> u64 {
        self.wr_id
    }

    /// The chain of its last `n` requests (`1..=EMPTY_RECV_CHAIN`), for `ibv_post_recv`,
    /// which only reads them.
    fn tail(&self, n: usize) -> *mut sys::ibv_recv_wr {
        self.wrs.as_ptr().wrapping_add(EMPTY_RECV_CHAIN - n)
    }
}

impl Drop for EmptyRecvs {
    fn drop(&mut self) {
        let array = ptr::slice_from_raw_parts_mut(self.wrs.as_ptr(), EMPTY_RECV_CHAIN);
        // SAFETY: `array` is the boxed slice `new` leaked, of that length, freed only here; no
        // post is in flight (posting borrows `self`, and `ibv_post_recv` copies the requests).
        drop(unsafe { Box::from_raw(array) });
    }
}

impl std::fmt::Debug for EmptyRecvs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmptyRecvs")
            .field("wr_id", &self.wr_id)
            .finish_non_exhaustive()
    }
}

/// The attached buffers and the next attach id.
#[derive(Debug, Default)]
struct Attached {
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
        self.grants.close_view(self.id);
    }
}

/// A queue pair that posts from the registered buffers it owns (ring buffers, message slots).
pub type OwnedBufferQueuePair = RcQueuePair<OwnedBuffers>;

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
            attached: Mutex::default(),
            empty_recvs: OnceLock::new(),
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
            unsafe { self.post_send_owned(&mut wr) }?;
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
            .open_view(range, fixed.may_be_written(offset, len))?;
        match fixed.unreachable_view(offset, len) {
            Some(bytes) => Ok(BufferView {
                grants: &self.memory.grants,
                id,
                bytes,
            }),
            None => {
                self.memory.grants.close_view(id);
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
            unsafe { self.post_send_owned(&mut wr) }
        })
    }

    /// Deallocates the memory windows, revoking their keys, ahead of the queue pair's
    /// destruction: a type 2 window bound through a queue pair holds a reference to it, and
    /// Soft-RoCE's `ibv_destroy_qp` blocks the calling thread until such windows go (it gave up
    /// after about 50 s under emulation). A window that fails to deallocate is leaked, as when
    /// the queue pair drops it. Later binds and invalidations fail with `InvalidInput`: there
    /// is no window left.
    pub(crate) fn revoke_windows(&mut self) {
        self.memory.windows.clear();
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

    /// Attaches `buffer` to the queue pair, so that work requests can send from it
    /// ([`Payload::Attached`](crate::verbs::qp::Payload::Attached) with the returned id) or
    /// receive into it ([`Self::post_recv_attached`]). It must be registered on the queue
    /// pair's protection domain.
    pub(crate) fn attach(&self, buffer: UserBuffer) -> Result<u64, (io::Error, UserBuffer)> {
        if !Arc::ptr_eq(buffer.registered().pd(), &self._pd) {
            let err = error::invalid_input(format!(
                "the region is registered in another device context (protection domain) than \
                 the stream's (device {}); register it through the stream's context",
                self._pd.device_name()
            ));
            return Err((err, buffer));
        }
        let mut attached = self
            .memory
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let id = attached.next_id;
        attached.next_id += 1;
        attached.buffers.insert(id, buffer);
        Ok(id)
    }

    /// Takes back attached buffer `id`. Call it only once the completion covering every work
    /// request that named it was polled (or none was posted): the device may read it until
    /// then.
    pub(crate) fn reclaim(&self, id: u64) -> Option<UserBuffer> {
        let mut attached = self
            .memory
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        attached.buffers.remove(&id)
    }

    /// The gather entry for `len` bytes at `offset` of attached buffer `id`, after checking them.
    pub(in crate::verbs::qp) fn attached_sge(
        &self,
        id: u64,
        offset: usize,
        len: usize,
    ) -> io::Result<sys::ibv_sge> {
        self.with_attached(id, |buffer| buffer.registered().sge(offset, len))
    }

    /// Runs `f` on attached buffer `id`.
    fn with_attached<R>(
        &self,
        id: u64,
        f: impl FnOnce(&UserBuffer) -> io::Result<R>,
    ) -> io::Result<R> {
        let attached = self
            .memory
            .attached
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        f(attached
            .buffers
            .get(&id)
            .ok_or_else(|| error::invalid_input(format!("no attached buffer {id}")))?)
    }

    /// The scatter/gather entry of `segment`, after checking it against the buffer it names.
    pub(in crate::verbs::qp) fn sge(&self, segment: Segment) -> io::Result<sys::ibv_sge> {
        self.memory
            .fixed
            .get(segment.buffer)
            .ok_or_else(|| {
                error::invalid_input(format!("no registered buffer {}", segment.buffer))
            })?
            .sge(segment.offset, segment.len)
    }
    /// Posts a receive into `segment`.
    pub(crate) fn post_recv(&self, wr_id: u64, segment: Segment) -> io::Result<()> {
        let sge = self.sge(segment)?;
        self.post_recv_sge(wr_id, sge)
    }

    /// Posts `count` receives with no buffer (for RDMA writes with immediate), chained so that
    /// a batch of them costs one `ibv_post_recv`. They are the tail of a chain linked once
    /// (with the first `wr_id` asked for; another id gets requests built for the call): a
    /// stream reposts each message's receive, and filling its request cost some 8
    /// instructions a message.
    pub(crate) fn post_empty_recvs(&self, wr_id: u64, count: usize) -> io::Result<()> {
        let chain = self
            .memory
            .empty_recvs
            .get_or_init(|| EmptyRecvs::new(wr_id));
        if chain.wr_id() != wr_id {
            return self.post_empty_recvs_built(wr_id, count);
        }
        let mut left = count;
        while left > 0 {
            let n = left.min(EMPTY_RECV_CHAIN);
            // SAFETY: the last `n` requests of the chain are initialised and linked, live as
            // long as the queue pair, are never written again, and carry no memory for the
            // device to write.
            unsafe { self.post_recv_chain(chain.tail(n)) }?;
            left -= n;
        }
        Ok(())
    }

    /// [`Self::post_empty_recvs`] with requests built for the call.
    #[cold]
    #[inline(never)]
    fn post_empty_recvs_built(&self, wr_id: u64, count: usize) -> io::Result<()> {
        let mut left = count;
        while left > 0 {
            let n = left.min(EMPTY_RECV_CHAIN);
            let chain = EmptyRecvs::new(wr_id);
            // SAFETY: as in `post_empty_recvs`; this chain lives across the call.
            unsafe { self.post_recv_chain(chain.tail(n)) }?;
            left -= n;
        }
        Ok(())
    }

    /// Posts a receive into the first `len` bytes of attached buffer `id` (which must be writable
    /// by the device; reclaim it only after this receive's completion was polled).
    pub(crate) fn post_recv_attached(&self, wr_id: u64, id: u64, len: usize) -> io::Result<()> {
        let sge = self.with_attached(id, |buffer| {
            let registered = buffer.registered();
            if !registered.locally_writable() {
                return Err(error::invalid_input(format!(
                    "attached buffer {id} is read-only: the device cannot receive into it"
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
        // range of a buffer this QP owns (fixed or attached) and frees after destroying the QP.
        unsafe { self.post_recv_chain(&mut wr) }
    }

    /// The queue pair, live for as long as `&self` is: an owned-buffer queue pair is destroyed
    /// only by `Drop` (no shared handle can destroy it, unlike a caller-memory one), so its
    /// posts need not take the state's read lock (some 20 instructions a post, one a streamed
    /// message).
    #[inline]
    fn live_qp(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id is live (held by `self`) and holds its QP until `destroy_now`, which
        // for this kind runs only in `Drop`, after every borrow of `self` ended; nothing else
        // writes the field.
        unsafe { (*self.id.as_ptr()).qp }
    }

    /// [`RcQueuePair::post_send_wr`] without the state's lock (see `live_qp`).
    ///
    /// # Safety
    ///
    /// As [`RcQueuePair::post_send_wr`].
    // Always inlined: a stream's write call posts through it, and it stayed a call there
    // once the rest of the post was inlined (see `StreamCore::post_alone`).
    #[inline(always)]
    pub(in crate::verbs::qp) unsafe fn post_send_owned(
        &self,
        wr: &mut sys::ibv_send_wr,
    ) -> io::Result<()> {
        // SAFETY: the QP is live while `self` is (`live_qp`); the caller vouches for the
        // memory `wr` names.
        unsafe { super::post_send(self.live_qp(), wr) }
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
        // SAFETY: the QP is live while `self` is (`live_qp`); the chain is valid (the caller's
        // contract).
        let ret = unsafe { sys::rdma_async_post_recv(self.live_qp(), first, &mut bad) };
        if ret != 0 {
            return Err(error::call_error("ibv_post_recv", ret));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The wr_ids of the chain from `head`, following its links to the null one.
    fn walk(head: *mut sys::ibv_recv_wr) -> Vec<u64> {
        let mut ids = Vec::new();
        let mut at = head.cast_const();
        while !at.is_null() {
            // SAFETY: `EmptyRecvs` links only requests of its own array, alive for this call.
            let wr = unsafe { &*at };
            assert!(
                wr.sg_list.is_null() && wr.num_sge == 0,
                "a receive with a buffer"
            );
            ids.push(wr.wr_id);
            at = wr.next;
        }
        ids
    }

    #[test]
    fn every_tail_of_the_empty_receives_is_a_chain_of_that_many() {
        let chain = EmptyRecvs::new(1 << 63);
        for n in 1..=EMPTY_RECV_CHAIN {
            assert_eq!(walk(chain.tail(n)), vec![1 << 63; n], "tail of {n}");
        }
        // Moved, the chain keeps its links: they point into its box, not into the value.
        let moved = chain;
        assert_eq!(walk(moved.tail(EMPTY_RECV_CHAIN)).len(), EMPTY_RECV_CHAIN);
    }
}
