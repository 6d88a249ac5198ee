//! `ibv_comp_channel` and `ibv_cq`: completion queues and the descriptor that signals them.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::{self, NonNull};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_async_sys as sys;

use super::completion_batch::{CompletionBatch, MAX_POLL};
use super::polled_completion::PolledCompletion;
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::device::{
    COMPLETION_QUEUES, CmDevices, DeviceLimits, Memlock, OwnsFd, Resource, completion_queue_error,
    injected_failure, set_nonblocking,
};

/// An owned, non-blocking completion channel on one device context.
#[derive(Debug)]
pub(crate) struct CompletionChannel {
    raw: NonNull<sys::ibv_comp_channel>,
    context: NonNull<sys::ibv_context>,
    _keeper: ContextKeeper,
}

/// What keeps a channel's device context open: the rdma_cm id it was made for, or (for a
/// channel shared by many connections, which must not keep any one of them) librdmacm's device
/// list.
#[derive(Debug)]
enum ContextKeeper {
    Id(#[allow(dead_code)] Arc<CmId>),
    Devices(#[allow(dead_code)] Arc<CmDevices>),
}

/// Where the events of a completion queue on a shared channel go ([`CompletionQueue::routed`]):
/// whoever reads the channel hands each event to its queue's sink.
pub(crate) trait CqEventSink: Send + Sync {
    /// One event of the queue was read from the channel (and acked). Called on the reading
    /// thread: must not block.
    fn cq_event(&self);
}

/// A routed queue's sink, behind the thin pointer that is its `cq_context`.
type SinkBox = Box<Arc<dyn CqEventSink>>;

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for CompletionChannel {}
// SAFETY: reading events is a `read` on the fd; concurrent readers each get whole events.
unsafe impl Sync for CompletionChannel {}

impl CompletionChannel {
    /// A channel on the device context of `id`, which it keeps.
    pub(crate) fn new(id: Arc<CmId>) -> io::Result<Self> {
        let ctx = id.verbs()?;
        Self::create(ctx, ContextKeeper::Id(id))
    }

    /// A channel on `ctx`, one of the contexts of `devices` (which it keeps): for queues of
    /// many connections, none of which it should keep alive.
    ///
    /// # Errors
    ///
    /// `NotFound` when `ctx` is not in `devices`; the OS error of `ibv_create_comp_channel`.
    pub(crate) fn on_device(
        devices: Arc<CmDevices>,
        ctx: NonNull<sys::ibv_context>,
    ) -> io::Result<Self> {
        if !devices.holds(ctx) {
            return Err(error::no_device(
                "the device is not among librdmacm's devices".to_owned(),
            ));
        }
        Self::create(ctx, ContextKeeper::Devices(devices))
    }

    fn create(ctx: NonNull<sys::ibv_context>, keeper: ContextKeeper) -> io::Result<Self> {
        // SAFETY: `ctx` is a live verbs context, held open by `keeper` for the channel's life.
        let raw = unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_create_comp_channel"))?;
        let channel = CompletionChannel {
            raw,
            context: ctx,
            _keeper: keeper,
        };
        set_nonblocking(channel.as_raw_fd())?;
        Ok(channel)
    }

    /// The device context the channel is on.
    pub(crate) fn context(&self) -> NonNull<sys::ibv_context> {
        self.context
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

    /// Reads one completion event without blocking, hands it to its queue's sink (every queue
    /// on a channel read this way must be [`CompletionQueue::routed`]), and acks it.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when no event is pending; the OS error of `ibv_get_cq_event`.
    pub(crate) fn dispatch_event(&self) -> io::Result<()> {
        let mut cq = ptr::null_mut();
        let mut ctx = ptr::null_mut();
        // SAFETY: the channel is valid; both out-pointers are valid. The kernel counts the
        // event as reported to its queue once read, so `ibv_destroy_cq` of that queue waits
        // until it is acked below: the queue and its sink outlive this call.
        if unsafe { sys::ibv_get_cq_event(self.raw.as_ptr(), &mut cq, &mut ctx) } != 0 {
            return Err(error::last_error_or_would_block("ibv_get_cq_event"));
        }
        if cq.is_null() {
            return Err(error::call_error("ibv_get_cq_event", libc::EIO));
        }
        // A clone of the sink, taken before the ack: once acked, the queue may be destroyed
        // and its `cq_context` freed, and the sink's wake-ups may be what destroys it (a woken
        // task's waker dropped here can hold the last reference to the queue's owner), which
        // must not wait for an ack that only this thread would make.
        let sink = (!ctx.is_null()).then(|| {
            // SAFETY: a non-null `cq_context` on a queue of this channel is the `SinkBox` that
            // `CompletionQueue::routed` leaked into it, freed only after `ibv_destroy_cq` has
            // returned, which it cannot before this event is acked (below).
            Arc::clone(unsafe { &*ctx.cast::<Arc<dyn CqEventSink>>() })
        });
        // SAFETY: `cq` is live (its destruction waits for this ack) and this one event was read
        // from it and not acked. Nothing touches the queue or its context after this.
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        if let Some(sink) = sink {
            sink.cq_event();
        }
        Ok(())
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
    /// A routed queue's sink (its `cq_context`), freed after the queue is destroyed.
    sink: Option<NonNull<Arc<dyn CqEventSink>>>,
}

// SAFETY: libibverbs CQs may be polled and armed from any thread (providers lock internally);
// the sink is `Send + Sync`.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl CompletionQueue {
    /// A queue whose events are read by its own waiters ([`CompletionChannel::get_event`],
    /// [`Self::count_event`]).
    pub(crate) fn new(channel: Arc<CompletionChannel>, entries: u32) -> io::Result<Self> {
        Self::create(channel, entries, None)
    }

    /// A queue on a channel read by [`CompletionChannel::dispatch_event`], which hands the
    /// queue's events to `sink` and acks them.
    pub(crate) fn routed(
        channel: Arc<CompletionChannel>,
        entries: u32,
        sink: Arc<dyn CqEventSink>,
    ) -> io::Result<Self> {
        let sink: SinkBox = Box::new(sink);
        Self::create(channel, entries, Some(NonNull::from(Box::leak(sink))))
    }

    fn create(
        channel: Arc<CompletionChannel>,
        entries: u32,
        sink: Option<NonNull<Arc<dyn CqEventSink>>>,
    ) -> io::Result<Self> {
        let free_sink = || {
            if let Some(sink) = sink {
                // SAFETY: leaked by `routed` and not yet given to any queue.
                drop(unsafe { Box::from_raw(sink.as_ptr()) });
            }
        };
        let ctx = channel.context();
        let Ok(cqe) = i32::try_from(entries) else {
            free_sink();
            return Err(error::invalid_input("CQ size too large"));
        };
        let cq_context = sink.map_or(ptr::null_mut(), |s| s.as_ptr().cast::<libc::c_void>());
        let raw = match injected_failure(Resource::CompletionQueue) {
            Some(errno) => Err(errno),
            // SAFETY: live context and channel; `cq_context` is NULL or a sink that lives
            // until after the queue is destroyed.
            None => NonNull::new(unsafe {
                sys::ibv_create_cq(ctx.as_ptr(), cqe, cq_context, channel.raw.as_ptr(), 0)
            })
            .ok_or_else(|| {
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            }),
        };
        let raw = raw.map_err(|errno| {
            free_sink();
            let device = DeviceLimits::of(ctx);
            completion_queue_error(entries, errno, Memlock::current(), device.as_ref())
        })?;
        COMPLETION_QUEUES.created(0);
        Ok(CompletionQueue {
            raw,
            channel,
            unacked: AtomicU32::new(0),
            sink,
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
    ) -> io::Result<&'b [PolledCompletion]> {
        let poll = |wcs: *mut sys::ibv_wc, room: usize| {
            let max = room.min(MAX_POLL) as i32;
            // SAFETY: the CQ is valid and `wcs` has room for `room >= max` entries.
            let n = unsafe { sys::rdma_async_poll_cq(self.raw.as_ptr(), max, wcs) };
            if n < 0 {
                return Err(error::call_error("ibv_poll_cq", -n));
            }
            Ok(n as usize)
        };
        // SAFETY: ibv_poll_cq writes the first `n` of the entries it is given and returns `n`
        // (at most `max`), or a negative value having written none.
        unsafe { batch.fill_with(poll) }
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
        if let Some(sink) = self.sink {
            // SAFETY: leaked by `routed` for this queue, which is destroyed: no event of it can
            // be read any more, and every one read was acked, after its sink call returned.
            drop(unsafe { Box::from_raw(sink.as_ptr()) });
        }
    }
}
