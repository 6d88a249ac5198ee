//! `ibv_comp_channel` and `ibv_cq`: completion queues and the descriptor that signals them.

use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_async_sys as sys;

use super::completion_batch::{CompletionBatch, MAX_POLL};
use super::work_completion::WorkCompletion;
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::device::{
    COMPLETION_QUEUES, DeviceLimits, Memlock, OwnsFd, Resource, completion_queue_error,
    injected_failure, set_nonblocking,
};

/// An owned, non-blocking completion channel on the device of an rdma_cm id.
#[derive(Debug)]
pub(crate) struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    // The id keeps the device's verbs context open.
    _id: Arc<CmId>,
}

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: reading events is a `read` on the fd; concurrent readers each get whole events.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    pub(crate) fn new(id: Arc<CmId>) -> io::Result<Self> {
        let ctx = id.verbs()?;
        // SAFETY: `ctx` is the live verbs context of a live id.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_create_comp_channel"))?;
        let channel = CompletionChannel { raw, _id: id };
        set_nonblocking(channel.as_raw_fd())?;
        Ok(channel)
    }

    /// Reads one completion event without blocking and returns the queue it names.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when no event is pending.
    pub(crate) fn get_event(&self) -> io::Result<NonNull<sys::ibv_cq>> {
        let mut cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // SAFETY: the channel is valid; both out-pointers are valid.
        if unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut ctx) } != 0 {
            return Err(error::last_error_or_would_block("ibv_get_cq_event"));
        }
        NonNull::new(cq).ok_or_else(|| error::call_error("ibv_get_cq_event", libc::EIO))
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel is valid for `self`'s lifetime.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl std::os::fd::AsFd for CompletionChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor stays open for as long as the channel, which the borrow
        // cannot outlive.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

// SAFETY: the fd belongs to the channel and is closed only by ibv_destroy_comp_channel in Drop.
unsafe impl OwnsFd for CompletionChannel {}

impl Drop for CompletionChannel {
    fn drop(&mut self) {
        // SAFETY: every CQ on this channel holds an `Arc` to it, so none is left.
        unsafe { sys::ibv_destroy_comp_channel(self.raw.as_ptr()) };
    }
}

/// How many channel events to collect before one `ibv_ack_cq_events` (it takes a mutex).
const ACK_BATCH: u32 = 16;

/// An owned completion queue that reports to one completion channel.
#[derive(Debug)]
pub(crate) struct CompletionQueue {
    raw: NonNull<sys::ibv_cq>,
    channel: Arc<CompletionChannel>,
    unacked: AtomicU32,
}

// SAFETY: libibverbs CQs may be polled and armed from any thread (providers lock internally).
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    pub(crate) fn new(channel: Arc<CompletionChannel>, entries: u32) -> io::Result<Self> {
        let ctx = channel._id.verbs()?;
        let cqe = i32::try_from(entries).map_err(|_| error::invalid_input("CQ size too large"))?;
        let raw = match injected_failure(Resource::CompletionQueue) {
            Some(errno) => Err(errno),
            // SAFETY: live context and channel; a NULL cq_context is allowed.
            None => NonNull::new(unsafe {
                sys::ibv_create_cq(ctx.as_ptr(), cqe, ptr::null_mut(), channel.raw.as_ptr(), 0)
            })
            .ok_or_else(|| {
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            }),
        };
        let raw = raw.map_err(|errno| {
            let device = DeviceLimits::of(ctx);
            completion_queue_error(entries, errno, Memlock::current(), device.as_ref())
        })?;
        COMPLETION_QUEUES.created(0);
        Ok(CompletionQueue {
            raw,
            channel,
            unacked: AtomicU32::new(0),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.raw.as_ptr()
    }

    /// How many completions the queue holds at most (what the provider granted).
    pub(crate) fn capacity(&self) -> usize {
        // SAFETY: the queue is live for `self`'s lifetime, and `cqe` is set at creation (only
        // `ibv_resize_cq`, which this crate never calls, changes it).
        let cqe = unsafe { (*self.raw.as_ptr()).cqe };
        usize::try_from(cqe).unwrap_or(0)
    }

    pub(crate) fn channel(&self) -> &Arc<CompletionChannel> {
        &self.channel
    }

    /// Polls up to `N` completions into `batch` (emptied first) without blocking, and returns
    /// them.
    pub(crate) fn poll_batch<'b, const N: usize>(
        &self,
        batch: &'b mut CompletionBatch<N>,
    ) -> io::Result<&'b [WorkCompletion]> {
        batch.clear();
        self.poll_each(N, |wc| {
            batch.push(wc);
        })?;
        Ok(batch.as_slice())
    }

    /// Polls up to `max` (at most [`MAX_POLL`]) completions and hands each to `put`, in order;
    /// returns how many there were.
    fn poll_each(&self, max: usize, mut put: impl FnMut(WorkCompletion)) -> io::Result<usize> {
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; MAX_POLL];
        let max = max.min(MAX_POLL);
        // SAFETY: the CQ is valid and `wcs` has room for `max` entries.
        let n =
            unsafe { sys::rdma_async_poll_cq(self.raw.as_ptr(), max as i32, wcs[0].as_mut_ptr()) };
        if n < 0 {
            return Err(error::call_error("ibv_poll_cq", -n));
        }
        let n = n as usize;
        for src in &wcs[..n] {
            // SAFETY: ibv_poll_cq initialised the first `n` entries.
            put(WorkCompletion::from_sys(unsafe { src.assume_init_ref() }));
        }
        Ok(n)
    }

    /// Arms the queue: the next completion raises one channel event.
    pub(crate) fn req_notify(&self) -> io::Result<()> {
        // SAFETY: the CQ is valid.
        let ret = unsafe { sys::rdma_async_req_notify_cq(self.raw.as_ptr(), 0) };
        if ret != 0 {
            return Err(error::call_error("ibv_req_notify_cq", ret));
        }
        Ok(())
    }

    /// Counts one event read from this queue's channel; acks them in batches.
    pub(crate) fn count_event(&self) {
        if self.unacked.fetch_add(1, Ordering::AcqRel) + 1 >= ACK_BATCH {
            self.ack_pending();
        }
    }

    fn ack_pending(&self) {
        let n = self.unacked.swap(0, Ordering::AcqRel);
        if n > 0 {
            // SAFETY: the CQ is valid and `n` events were read from its channel and not acked.
            unsafe { sys::ibv_ack_cq_events(self.raw.as_ptr(), n) };
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // ibv_destroy_cq waits for every read event to be acked.
        self.ack_pending();
        // SAFETY: the CQ is valid; queue pairs using it hold an `Arc` to it, so none is left.
        unsafe { sys::ibv_destroy_cq(self.raw.as_ptr()) };
        COMPLETION_QUEUES.destroyed(0);
    }
}
