//! `rdma_event_channel`: the descriptor on which librdmacm reports connection-management events.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;

use rdma_async_sys as sys;
use sys::rdma_cm_event_type as ev;

use super::ah_attr::AhAttr;
use crate::error;
use crate::verbs::device::{OwnsFd, set_nonblocking};

/// An owned, non-blocking rdma_cm event channel.
#[derive(Debug)]
pub(crate) struct EventChannel {
    raw: NonNull<sys::rdma_event_channel>,
}

// SAFETY: librdmacm event channels may be used from any thread; the struct only holds a pointer
// to the channel, which librdmacm synchronises internally.
unsafe impl Send for EventChannel {}
// SAFETY: as above; `get_event` may be called concurrently (the kernel hands each event out once).
unsafe impl Sync for EventChannel {}

impl EventChannel {
    /// Creates a channel and makes its descriptor non-blocking.
    ///
    /// # Errors
    ///
    /// `NotFound` ("no RDMA device") when the machine has no rdma_cm (no `/dev/infiniband/rdma_cm`
    /// or no device); otherwise the OS error.
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: no preconditions; returns NULL with errno set on failure.
        let raw = unsafe { sys::rdma_create_event_channel() };
        let Some(raw) = NonNull::new(raw) else {
            let err = io::Error::last_os_error();
            return Err(match err.raw_os_error() {
                Some(libc::ENOENT | libc::ENODEV | libc::ENXIO) => {
                    error::no_device(format!("rdma_cm is not available on this machine ({err})"))
                }
                Some(errno) => error::call_error("rdma_create_event_channel", errno),
                None => err,
            });
        };
        let channel = EventChannel { raw };
        set_nonblocking(channel.as_raw_fd())?;
        Ok(channel)
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rdma_event_channel {
        self.raw.as_ptr()
    }

    /// Takes the next event without blocking, copies out everything the crate uses and acks it
    /// at once (acking frees the private data, and `rdma_destroy_id` waits for unacked events).
    ///
    /// # Errors
    ///
    /// `WouldBlock` when no event is queued.
    pub(crate) fn get_event(&self) -> io::Result<CmEvent> {
        let mut event = std::ptr::null_mut();
        // SAFETY: the channel is valid for `self`'s lifetime; `event` is a valid out-pointer.
        if unsafe { sys::rdma_get_cm_event(self.raw.as_ptr(), &mut event) } != 0 {
            return Err(error::last_error_or_would_block("rdma_get_cm_event"));
        }
        // SAFETY: on success librdmacm returned a valid event that stays valid until acked below.
        let event_ref = unsafe { &*event };
        // SAFETY: as above: the event is valid and not yet acked.
        let copy = unsafe { CmEvent::copy_from(event_ref) };
        // SAFETY: `event` came from rdma_get_cm_event and is acked exactly once.
        unsafe { sys::rdma_ack_cm_event(event) };
        Ok(copy)
    }
}

impl AsRawFd for EventChannel {
    fn as_raw_fd(&self) -> RawFd {
        // SAFETY: the channel pointer is valid for `self`'s lifetime.
        unsafe { (*self.raw.as_ptr()).fd }
    }
}

impl std::os::fd::AsFd for EventChannel {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        // SAFETY: the descriptor stays open for as long as the channel, which the borrow
        // cannot outlive.
        unsafe { std::os::fd::BorrowedFd::borrow_raw(self.as_raw_fd()) }
    }
}

// SAFETY: the fd belongs to the channel and is closed only by rdma_destroy_event_channel in Drop.
unsafe impl OwnsFd for EventChannel {}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: the channel is valid and destroyed once; every id on it holds an `Arc` to this
        // channel, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.raw.as_ptr()) }
    }
}

/// An owned copy of an `rdma_cm_event`, safe to keep after the event was acked.
#[derive(Debug)]
pub(crate) struct CmEvent {
    /// `rdma_cm_event_type`.
    pub(crate) kind: u32,
    /// Negative errno, or for `REJECTED` the transport's reject reason.
    pub(crate) status: i32,
    /// Private data carried by the event (connection events only).
    pub(crate) private_data: Vec<u8>,
    /// The connection parameters the peer sent (connection events only).
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    /// For `CONNECT_REQUEST`: ownership of the new connection's id.
    pub(crate) incoming: Option<IncomingId>,
    /// For `ESTABLISHED` and `MULTICAST_JOIN` on datagram ids: how to reach the peer or group.
    pub(crate) ud: Option<UdParam>,
}

/// The datagram part of an event (`struct rdma_ud_param`): an address handle's attributes and
/// the remote queue pair number and Q_Key.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdParam {
    pub(crate) ah_attr: AhAttr,
    /// `0xFFFFFF` for a multicast group.
    pub(crate) qp_num: u32,
    pub(crate) qkey: u32,
}

/// Ownership of the id a `CONNECT_REQUEST` created, until it is migrated into a [`super::CmId`].
/// Dropping it destroys the id, which rejects the request.
#[derive(Debug)]
pub(crate) struct IncomingId(pub(super) NonNull<sys::rdma_cm_id>);

// SAFETY: an rdma_cm id may be used and destroyed from any thread.
unsafe impl Send for IncomingId {}

impl Drop for IncomingId {
    fn drop(&mut self) {
        // SAFETY: the id came from an acked CONNECT_REQUEST; this token is its only owner.
        unsafe { sys::rdma_destroy_id(self.0.as_ptr()) };
    }
}

impl CmEvent {
    /// # Safety
    ///
    /// `event` must be a valid, not yet acked event from `rdma_get_cm_event`.
    unsafe fn copy_from(event: &sys::rdma_cm_event) -> Self {
        // UD ids report `param.ud`, connected ids `param.conn`; the private data sits in either.
        // SAFETY: the id of a valid event is a valid rdma_cm_id (the caller's contract).
        let ps = unsafe { (*event.id).ps };
        let is_ud =
            ps == sys::rdma_port_space::RDMA_PS_UDP || ps == sys::rdma_port_space::RDMA_PS_IPOIB;
        let mut ud_param = None;
        let (data, len) = if is_ud {
            // SAFETY: for UD ids librdmacm fills the `ud` member of the union.
            let ud = unsafe { event.param.ud };
            if event.event == ev::RDMA_CM_EVENT_ESTABLISHED
                || event.event == ev::RDMA_CM_EVENT_MULTICAST_JOIN
            {
                ud_param = Some(UdParam {
                    ah_attr: AhAttr(ud.ah_attr),
                    qp_num: ud.qp_num,
                    qkey: ud.qkey,
                });
            }
            (ud.private_data, ud.private_data_len)
        } else {
            // SAFETY: for connected ids librdmacm fills the `conn` member of the union.
            let conn = unsafe { event.param.conn };
            (conn.private_data, conn.private_data_len)
        };
        let private_data = if data.is_null() || len == 0 {
            Vec::new()
        } else {
            // SAFETY: librdmacm guarantees `len` readable bytes at `data` until the ack.
            unsafe { std::slice::from_raw_parts(data.cast::<u8>(), usize::from(len)) }.to_vec()
        };
        // SAFETY: the union member matching the port space was chosen above; reading the conn
        // fields of a UD event yields zeros, which callers ignore.
        let conn = unsafe { event.param.conn };
        CmEvent {
            kind: event.event,
            status: event.status,
            private_data,
            responder_resources: if is_ud { 0 } else { conn.responder_resources },
            initiator_depth: if is_ud { 0 } else { conn.initiator_depth },
            incoming: if event.event == ev::RDMA_CM_EVENT_CONNECT_REQUEST {
                NonNull::new(event.id).map(IncomingId)
            } else {
                None
            },
            ud: ud_param,
        }
    }

    /// The librdmacm name of the event, e.g. `RDMA_CM_EVENT_REJECTED`.
    pub(crate) fn name(&self) -> &'static str {
        event_name(self.kind)
    }
}

/// The librdmacm name of an event type.
pub(crate) fn event_name(kind: u32) -> &'static str {
    match kind {
        ev::RDMA_CM_EVENT_ADDR_RESOLVED => "RDMA_CM_EVENT_ADDR_RESOLVED",
        ev::RDMA_CM_EVENT_ADDR_ERROR => "RDMA_CM_EVENT_ADDR_ERROR",
        ev::RDMA_CM_EVENT_ROUTE_RESOLVED => "RDMA_CM_EVENT_ROUTE_RESOLVED",
        ev::RDMA_CM_EVENT_ROUTE_ERROR => "RDMA_CM_EVENT_ROUTE_ERROR",
        ev::RDMA_CM_EVENT_CONNECT_REQUEST => "RDMA_CM_EVENT_CONNECT_REQUEST",
        ev::RDMA_CM_EVENT_CONNECT_RESPONSE => "RDMA_CM_EVENT_CONNECT_RESPONSE",
        ev::RDMA_CM_EVENT_CONNECT_ERROR => "RDMA_CM_EVENT_CONNECT_ERROR",
        ev::RDMA_CM_EVENT_UNREACHABLE => "RDMA_CM_EVENT_UNREACHABLE",
        ev::RDMA_CM_EVENT_REJECTED => "RDMA_CM_EVENT_REJECTED",
        ev::RDMA_CM_EVENT_ESTABLISHED => "RDMA_CM_EVENT_ESTABLISHED",
        ev::RDMA_CM_EVENT_DISCONNECTED => "RDMA_CM_EVENT_DISCONNECTED",
        ev::RDMA_CM_EVENT_DEVICE_REMOVAL => "RDMA_CM_EVENT_DEVICE_REMOVAL",
        ev::RDMA_CM_EVENT_MULTICAST_JOIN => "RDMA_CM_EVENT_MULTICAST_JOIN",
        ev::RDMA_CM_EVENT_MULTICAST_ERROR => "RDMA_CM_EVENT_MULTICAST_ERROR",
        ev::RDMA_CM_EVENT_ADDR_CHANGE => "RDMA_CM_EVENT_ADDR_CHANGE",
        ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
        _ => "RDMA_CM_EVENT_UNKNOWN",
    }
}
