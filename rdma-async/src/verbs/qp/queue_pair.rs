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
//!   slot of its [`InFlightTable`](super::InFlightTable) first, and that table (an `Arc` the
//!   queue pair holds) outlives the queue pair. It may receive through a shared receive queue
//!   instead of its own.
//!
//! Each kind has only its own posting methods, so posting one kind's way on the other does not
//! compile (`rdma-async/tests/ui/test_hooks/fail_queue_pair_kinds.rs`). What they share lives on
//! `RcQueuePair<M>` once: creation, the state change to error, and the drop order (`Drop` destroys
//! the queue pair before any field, the memory `M` included, is dropped). A queue pair whose
//! destruction fails may still be used by the device: it is kept (leaked), and with it its memory
//! and everything it depends on, rather than handing out memory a peer may still reach.

use std::io;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::{Arc, PoisonError, RwLock};

use rdma_async_sys as sys;

use super::shared_recv_queue::SharedRecvQueue;
use super::work_request::MAX_SEGMENTS;
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::pd::ProtectionDomain;

mod caller_memory;
#[cfg(rdma_async_hooks)]
mod injected_faults;
mod owned_buffers;

pub(crate) use caller_memory::BatchRefused;
pub use caller_memory::CallerMemoryQueuePair;
pub(crate) use owned_buffers::BufferView;
pub use owned_buffers::OwnedBufferQueuePair;

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
/// so that the test hooks (`--cfg rdma_async_hooks`) can name them in a compile-fail case; the
/// module is private.)
#[derive(Debug)]
pub struct RcQueuePair<M> {
    id: Arc<CmId>,
    qp_num: u32,
    max_inline_data: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    /// Whether the queue pair may still be used: every use of it through a handle that can
    /// destroy it while shared (a caller-memory one's, `CallerMemoryQueuePair::destroy`) holds
    /// the read lock, so [`Self::destroy_now`] (the write lock) never frees it under a post. An
    /// owned-buffer queue pair is destroyed only by `Drop`, which has it to itself: its posts
    /// take no lock ([`OwnedBufferQueuePair`]'s `live_qp`).
    state: RwLock<QpState>,
    /// What outstanding work requests point into: dropped only after the queue pair was
    /// destroyed (by [`Self::destroy`] or `Drop::drop`), and never if that failed.
    memory: ManuallyDrop<M>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

/// Where a queue pair is in its teardown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum QpState {
    Live,
    Destroyed,
    /// Destroying it failed: it still exists and the device may still use its work requests'
    /// memory, so it is never used again, nor is that memory freed.
    Kept,
}

// SAFETY: posting to a QP is thread-safe in libibverbs; the struct hands out no references into
// C memory or registered buffers, and its memory `M` crosses threads only as far as `M` allows.
unsafe impl<M: Send> Send for RcQueuePair<M> {}
// SAFETY: as above.
unsafe impl<M: Sync> Sync for RcQueuePair<M> {}

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
            state: RwLock::new(QpState::Live),
            memory: ManuallyDrop::new(memory),
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _pd: pd,
        })
    }

    /// Runs `use_qp` on the queue pair while it exists (the read lock keeps [`Self::destroy`]
    /// out); `NotConnected` once it was destroyed.
    fn with_qp<R>(&self, use_qp: impl FnOnce(*mut sys::ibv_qp) -> io::Result<R>) -> io::Result<R> {
        let state = self.state.read().unwrap_or_else(PoisonError::into_inner);
        match *state {
            QpState::Live => {}
            QpState::Destroyed => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the connection's queue pair was destroyed (the connection failed or ended)",
                ));
            }
            QpState::Kept => {
                return Err(io::Error::new(
                    io::ErrorKind::NotConnected,
                    "the connection's queue pair could not be destroyed (the connection failed \
                     or ended); it is kept with its buffers",
                ));
            }
        }
        // SAFETY: the id's QP lives until `destroy_now`, which waits for this lock.
        use_qp(unsafe { (*self.id.as_ptr()).qp })
    }

    /// Destroys the queue pair now, before its memory is dropped. Returns whether it is
    /// destroyed (now or by an earlier call): only then does the device no longer access any
    /// work request's memory, so that buffers of work requests that never completed may be
    /// handed back or freed. When destroying it failed (`ibv_destroy_qp`), it is kept as it
    /// is: never used again, never destroyed again (a retry could free an object the provider
    /// half tore down), and its memory and what it depends on are leaked when it is dropped.
    /// Later posts fail with `NotConnected` either way.
    ///
    /// Called only by `Drop` and by `CallerMemoryQueuePair::destroy`: an owned-buffer queue
    /// pair's posts rely on never being destroyed through a shared reference.
    fn destroy_now(&self) -> bool {
        let mut state = self.state.write().unwrap_or_else(PoisonError::into_inner);
        if *state == QpState::Live {
            // SAFETY: the id has its QP, which no post is using (the write lock is held; an
            // owned-buffer queue pair's posts, which take no lock, need `&self`, and for that
            // kind this runs only in `Drop`) and which is never used again whatever the outcome
            // (the state leaves `Live`).
            *state = match unsafe { self.id.destroy_qp() } {
                Ok(()) => {
                    crate::verbs::device::QUEUE_PAIRS.destroyed(0);
                    QpState::Destroyed
                }
                Err(e) => {
                    tracing::warn!(
                        error = %e,
                        qp_num = self.qp_num,
                        "a queue pair could not be destroyed; keeping it and every buffer its \
                         work requests name (leaked)"
                    );
                    QpState::Kept
                }
            };
        }
        *state == QpState::Destroyed
    }

    /// Which queue pair this is to the test hooks' [`injected_faults`]: the address of its
    /// rdma_cm id, which it holds until it is dropped.
    #[cfg(rdma_async_hooks)]
    fn fault_key(&self) -> injected_faults::FaultKey {
        Arc::as_ptr(&self.id) as injected_faults::FaultKey
    }

    /// Test hook: makes the next receive post fail (`ENOMEM`, as a full receive queue would).
    #[cfg(rdma_async_hooks)]
    pub(crate) fn fail_next_post_recv(&self) {
        injected_faults::arm(self.fault_key(), injected_faults::Fault::PostRecv);
    }

    /// Whether this receive post is the one a test asked to fail.
    fn injected_recv_failure(&self) -> io::Result<()> {
        #[cfg(rdma_async_hooks)]
        if injected_faults::take(self.fault_key(), injected_faults::Fault::PostRecv) {
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
        // SAFETY: the QP is live while `with_qp` runs; the caller vouches for the memory `wr`
        // names.
        self.with_qp(|qp| unsafe { post_send(qp, wr) })
    }

    /// As [`Self::post_send_wr`], for a list of requests that must be settled as a whole: on
    /// failure, whether none of them reached the device (the provider refused the first), as
    /// opposed to some (it refused a later one, and those before it were posted).
    ///
    /// # Safety
    ///
    /// As [`Self::post_send_wr`].
    pub(super) unsafe fn post_send_list(
        &self,
        wr: &mut sys::ibv_send_wr,
    ) -> Result<(), (io::Error, bool)> {
        let head: *mut sys::ibv_send_wr = wr;
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live while `with_qp` runs; the caller vouches for the memory the
        // list names.
        let posted =
            self.with_qp(|qp| Ok(unsafe { sys::rdma_async_post_send(qp, head, &mut bad) }));
        match posted {
            Ok(0) => Ok(()),
            Ok(ret) => Err((post_send_error(ret), bad.is_null() || bad == head)),
            // Destroyed: nothing was posted.
            Err(e) => Err((e, true)),
        }
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

/// `ibv_post_send` of `wr` (and the requests chained after it) to `qp`.
///
/// # Safety
///
/// `qp` is live for the call, and `wr` is as [`RcQueuePair::post_send_wr`] requires.
#[inline]
unsafe fn post_send(qp: *mut sys::ibv_qp, wr: &mut sys::ibv_send_wr) -> io::Result<()> {
    let mut bad = ptr::null_mut();
    // SAFETY: the caller's contract.
    let ret = unsafe { sys::rdma_async_post_send(qp, wr, &mut bad) };
    if ret != 0 {
        return Err(post_send_error(ret));
    }
    Ok(())
}

/// The error of an `ibv_post_send` that returned `ret`. Out of line: inlined, its mapping of
/// errno values made a jump table that every successful post went through.
#[cold]
#[inline(never)]
fn post_send_error(ret: i32) -> io::Error {
    error::call_error("ibv_post_send", ret)
}

/// Leaks a reference to each object a queue pair that could not be destroyed uses (its id,
/// completion queues and protection domain), so none of them is ever destroyed under it.
pub(super) fn keep_forever(
    id: &Arc<CmId>,
    cqs: [&Arc<CompletionQueue>; 2],
    pd: &Arc<ProtectionDomain>,
) {
    std::mem::forget(Arc::clone(id));
    for cq in cqs {
        std::mem::forget(Arc::clone(cq));
    }
    std::mem::forget(Arc::clone(pd));
}

impl<M> Drop for RcQueuePair<M> {
    fn drop(&mut self) {
        if self.destroy_now() {
            // SAFETY: dropped once, here; the device no longer accesses the QP's work
            // requests, so their memory can be freed.
            unsafe { ManuallyDrop::drop(&mut self.memory) };
        } else {
            // The QP lives on: so does its memory (never dropped).
            keep_forever(&self.id, [&self._send_cq, &self._recv_cq], &self._pd);
        }
        // Before the id goes (with the fields), so no later queue pair inherits these.
        #[cfg(rdma_async_hooks)]
        injected_faults::forget(self.fault_key());
    }
}
