//! [`CallerMemoryQueuePair`]: a queue pair that posts caller memory, moved into its in-flight
//! table for as long as a work request may touch it; sends and writes small enough go inline,
//! and requests may be left to share one doorbell ([`CallerMemoryQueuePair::ring`]).

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Waker;

use rdma_async_sys as sys;

use super::super::deferred_sends::DeferredSends;
use super::super::held_posting::{held_sge, hold_and_post, post_recv_into};
use super::super::in_flight::{Held, InFlightTable, Ticket, WorkQueue, batch_member_id};
use super::super::shared_recv_queue::SharedRecvQueue;
use super::super::work_request::{Doorbell, Opcode, Posted, Segment, set_opcode};
#[cfg(rdma_async_hooks)]
use super::injected_faults::{self, Fault};
use super::{QpCaps, RcQueuePair};
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::mr::WindowOp;
use crate::verbs::pd::ProtectionDomain;

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
}

/// A queue pair that posts caller memory, held in its in-flight table until completion.
pub type CallerMemoryQueuePair = RcQueuePair<CallerMemory>;

/// Why [`CallerMemoryQueuePair::post_batch`] failed, and where its buffers are.
#[derive(Debug)]
pub(crate) enum BatchRefused {
    /// None of the batch reached the device: the buffers come back.
    Unposted(io::Error, Held),
    /// The provider refused a request after others of the list were posted. Those complete
    /// unsignaled, so no completion frees the slot: its buffers stay in the table until the
    /// queue pair is destroyed and the table flushed, which the caller must do.
    Partly(io::Error, Ticket),
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

    /// Destroys the queue pair now, before its memory is dropped, so that the buffers of
    /// requests that never completed can be handed back. Returns whether it is destroyed (now
    /// or by an earlier call); when destroying it failed it is kept, never used again, and
    /// leaked with its memory when dropped. Later posts fail with `NotConnected` either way.
    ///
    /// Only this kind can be destroyed through a shared reference: its every use takes the
    /// state's read lock, which this waits for.
    pub(crate) fn destroy(&self) -> bool {
        self.destroy_now()
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
    /// `waker`, the waiter's, goes into the table with the buffers. On failure nothing was
    /// posted and the buffers come back. Always inlined: a connection's every send-queue
    /// operation posts here, from its own post closure.
    #[inline(always)]
    pub(crate) fn post_caller(
        &self,
        opcode: Opcode,
        held: Held,
        segments: &[Segment],
        defer: bool,
        waker: Option<&Waker>,
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
            waker,
            |wr_id, sges| {
                let bytes: u64 = sges.iter().map(|sge| u64::from(sge.length)).sum();
                let carries_data = matches!(opcode, Opcode::Send { .. } | Opcode::Write { .. });
                let inline =
                    carries_data && bytes > 0 && bytes <= u64::from(self.memory.inline_limit);
                let num_sge = sges.len() as i32;
                // Everything but the gather list, which `post_all` or the post below links.
                let fill = |wr: &mut sys::ibv_send_wr| {
                    wr.wr_id = wr_id;
                    wr.num_sge = num_sge;
                    wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
                    if inline {
                        wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE;
                    }
                    set_opcode(wr, opcode);
                };
                let posted = if defer || self.memory.deferred.is_waiting() {
                    // Its entries are copied; the table holds the buffers they name until the
                    // completion, also for an inline request (the provider copies its bytes
                    // when it is posted).
                    let first = self.memory.deferred.push_with(sges, fill);
                    doorbell = Doorbell::Deferred { first };
                    Ok(())
                } else {
                    // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
                    let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                    fill(&mut wr);
                    wr.sg_list = sges.as_mut_ptr();
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

    /// Moves `held` (a [`Held::Batch`], one buffer per member) into one slot of the in-flight
    /// table, with `waker`, and posts one work request per member as one list (one
    /// `ibv_post_send`): `members[i]` is the segment of buffer `i` and its opcode. Only the last
    /// request is signaled; the others carry [`batch_member_id`]s, so the slot is freed by the
    /// last one's completion (a send queue completes in order: the device is then done with all
    /// of them). Members that carry 1 to `max_inline_data` bytes go inline.
    ///
    /// Requests [`Self::post_caller`] left for [`Self::ring`] are not among them: ring first
    /// where their order matters.
    pub(crate) fn post_batch(
        &self,
        held: Held,
        members: &[(Segment, Opcode)],
        waker: &Waker,
    ) -> Result<Ticket, BatchRefused> {
        if !matches!(&held, Held::Batch(v) if v.len() == members.len() && !v.is_empty()) {
            return Err(BatchRefused::Unposted(
                error::invalid_input("a batch posts one request per buffer, and at least one"),
                held,
            ));
        }
        let mut sges = Vec::with_capacity(members.len());
        for (segment, _) in members {
            match held_sge(&held, segment) {
                Ok(sge) => sges.push(sge),
                Err(e) => return Err(BatchRefused::Unposted(e, held)),
            }
        }
        let (ticket, wr_id) = self
            .memory
            .table
            .insert_waiting(held, WorkQueue::Send, waker)
            .map_err(|(e, held)| BatchRefused::Unposted(e, held))?;
        let last = members.len() - 1;
        let mut inline = 0;
        let mut wrs: Vec<sys::ibv_send_wr> = members
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, ((_, opcode), sge))| {
                // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
                let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
                set_opcode(&mut wr, *opcode);
                wr.num_sge = 1;
                if i == last {
                    wr.wr_id = wr_id;
                    wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
                } else {
                    wr.wr_id = batch_member_id(wr_id);
                }
                let carries_data = matches!(opcode, Opcode::Send { .. } | Opcode::Write { .. });
                if carries_data && sge.length > 0 && sge.length <= self.memory.inline_limit {
                    wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE;
                    inline += 1;
                }
                wr
            })
            .collect();
        // Linked only now: the vectors no longer move.
        for (wr, sge) in wrs.iter_mut().zip(sges.iter_mut()) {
            wr.sg_list = sge;
        }
        for i in 0..last {
            let next: *mut sys::ibv_send_wr = &mut wrs[i + 1];
            wrs[i].next = next;
        }
        self.memory.send_posts.fetch_add(1, Ordering::Relaxed);
        // SAFETY: every entry covers a range of a buffer that `held_sge` checked and that the
        // table holds until the last request's completion is polled (or the QP is destroyed);
        // the send queue completes in order, so by then the device is done with every member.
        // The table outlives the QP (it is in `memory`). The list and its entries live for the
        // call.
        match unsafe { self.post_batch_list(&mut wrs) } {
            Ok(()) => {
                self.memory
                    .inline_posts
                    .fetch_add(inline, Ordering::Relaxed);
                Ok(ticket)
            }
            Err((e, true)) => Err(BatchRefused::Unposted(
                e,
                self.memory.table.take_back(ticket),
            )),
            Err((e, false)) => Err(BatchRefused::Partly(e, ticket)),
        }
    }

    /// Test hook: the provider refuses the next [`Self::post_batch`]'s first request (`ENOMEM`),
    /// so none is posted; with `tail`, its last, after posting the others.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn fail_next_batch(&self, tail: bool) {
        let fault = if tail {
            Fault::BatchTail
        } else {
            Fault::BatchHead
        };
        injected_faults::arm(self.fault_key(), fault);
    }

    /// The list's post, or the failure a test armed for it ([`Self::fail_next_batch`]).
    ///
    /// # Safety
    ///
    /// As [`Self::post_send_list`].
    unsafe fn post_batch_list(
        &self,
        wrs: &mut [sys::ibv_send_wr],
    ) -> Result<(), (io::Error, bool)> {
        #[cfg(rdma_async_hooks)]
        {
            let refused = || error::call_error("ibv_post_send", libc::ENOMEM);
            if injected_faults::take(self.fault_key(), Fault::BatchHead) {
                return Err((refused(), true));
            }
            if let [.., before_last, _] = wrs
                && injected_faults::take(self.fault_key(), Fault::BatchTail)
            {
                before_last.next = std::ptr::null_mut();
                // SAFETY: the caller's obligations, for the list without its last request.
                unsafe { self.post_send_list(&mut wrs[0]) }?;
                return Err((refused(), false));
            }
        }
        // SAFETY: the caller's obligations.
        unsafe { self.post_send_list(&mut wrs[0]) }
    }

    /// Test hook: the next [`Self::ring`] that has requests to post fails (`ENOMEM`) and posts
    /// none of them.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn fail_next_ring(&self) {
        injected_faults::arm(self.fault_key(), Fault::Ring);
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
        #[cfg(rdma_async_hooks)]
        if self.memory.deferred.is_waiting() && injected_faults::take(self.fault_key(), Fault::Ring)
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
        if !Arc::ptr_eq(binding.window().pd(), &self._pd)
            || !Arc::ptr_eq(binding.region().registered().pd(), &self._pd)
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
                .window()
                .fill_bind(&mut wr, binding.region(), offset, len, access),
            WindowOp::Invalidate => {
                binding.window().fill_invalidate(&mut wr);
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
