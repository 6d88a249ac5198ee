//! `ibv_get_async_event` on librdmacm's device contexts: the device's asynchronous events
//! (port up/down, GID table changes, fatal queue pair errors, ...) read without blocking.
//!
//! librdmacm opens each device once per process, and every id, queue pair and completion queue
//! of the crate lives on that context, so its `async_fd` carries the events of all of them.
//! The descriptor belongs to the context; [`AsyncEventFd`] holds a reference on librdmacm's
//! device list, which keeps the context (and so the descriptor) open while it lives.

use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::async_fd::OwnsFd;
use super::cm_devices::CmDevices;
use super::device_attr::{device_name, query_device, query_port};
use crate::error;

/// One device context's asynchronous event descriptor, made non-blocking.
#[derive(Debug)]
pub(crate) struct AsyncEventFd {
    /// Keeps the context open.
    _devices: Arc<CmDevices>,
    ctx: NonNull<sys::ibv_context>,
    fd: RawFd,
    name: String,
}

// SAFETY: libibverbs contexts may be used from any thread; `ibv_get_async_event` and
// `ibv_ack_async_event` are thread-safe, and the struct hands out no references into C memory.
unsafe impl Send for AsyncEventFd {}
// SAFETY: as above.
unsafe impl Sync for AsyncEventFd {}

/// What one asynchronous event said, copied out before it was acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RawAsyncEvent {
    /// `enum ibv_event_type`.
    pub(crate) kind: sys::ibv_event_type::Type,
    /// The port of a port event.
    pub(crate) port: Option<u8>,
    /// The queue pair number of a queue pair event.
    pub(crate) qp_num: Option<u32>,
}

impl AsyncEventFd {
    /// The event descriptors of every device librdmacm knows now, each made non-blocking.
    pub(crate) fn all() -> io::Result<Vec<AsyncEventFd>> {
        let devices = Arc::new(CmDevices::new()?);
        devices
            .contexts()
            .map(|ctx| {
                // SAFETY: the context is live while `devices` holds the list.
                let fd = unsafe { (*ctx.as_ptr()).async_fd };
                set_nonblocking(fd)?;
                Ok(AsyncEventFd {
                    _devices: devices.clone(),
                    ctx,
                    fd,
                    name: device_name(ctx),
                })
            })
            .collect()
    }

    /// The device's name.
    pub(crate) fn device_name(&self) -> &str {
        &self.name
    }

    /// The context, to tell whose queue pair an event names.
    pub(crate) fn context(&self) -> NonNull<sys::ibv_context> {
        self.ctx
    }

    /// Takes the next event, if one is queued, and acknowledges it at once (everything the
    /// crate needs is copied out first, so no destroy call ever waits for the acknowledgement).
    /// `Ok(None)` when none is queued.
    pub(crate) fn try_next(&self) -> io::Result<Option<RawAsyncEvent>> {
        // SAFETY: ibv_async_event is plain old data; zero is valid for every field.
        let mut event: sys::ibv_async_event = unsafe { std::mem::zeroed() };
        // SAFETY: the context is live (held by `devices`); `event` is a valid out-pointer. The
        // descriptor is non-blocking, so this returns at once when nothing is queued.
        if unsafe { sys::ibv_get_async_event(self.ctx.as_ptr(), &mut event) } != 0 {
            let err = io::Error::last_os_error();
            return match err.raw_os_error() {
                Some(libc::EAGAIN) => Ok(None),
                Some(errno) => Err(error::call_error("ibv_get_async_event", errno)),
                None => Err(err),
            };
        }
        use sys::ibv_event_type as t;
        let kind = event.event_type;
        let mut raw = RawAsyncEvent {
            kind,
            port: None,
            qp_num: None,
        };
        match kind {
            t::IBV_EVENT_QP_FATAL
            | t::IBV_EVENT_QP_REQ_ERR
            | t::IBV_EVENT_QP_ACCESS_ERR
            | t::IBV_EVENT_COMM_EST
            | t::IBV_EVENT_SQ_DRAINED
            | t::IBV_EVENT_PATH_MIG
            | t::IBV_EVENT_PATH_MIG_ERR
            | t::IBV_EVENT_QP_LAST_WQE_REACHED => {
                // SAFETY: for queue pair events the union holds the queue pair, which lives at
                // least until the event is acknowledged (below).
                let qp = unsafe { event.element.qp };
                if let Some(qp) = NonNull::new(qp) {
                    // SAFETY: as above; `qp_num` is a plain field set at creation.
                    raw.qp_num = Some(unsafe { (*qp.as_ptr()).qp_num });
                }
            }
            t::IBV_EVENT_PORT_ACTIVE
            | t::IBV_EVENT_PORT_ERR
            | t::IBV_EVENT_LID_CHANGE
            | t::IBV_EVENT_PKEY_CHANGE
            | t::IBV_EVENT_SM_CHANGE
            | t::IBV_EVENT_CLIENT_REREGISTER
            | t::IBV_EVENT_GID_CHANGE => {
                // SAFETY: for port events the union holds the port number.
                raw.port = u8::try_from(unsafe { event.element.port_num }).ok();
            }
            _ => {}
        }
        // SAFETY: the event came from ibv_get_async_event above and is acknowledged once.
        unsafe { sys::ibv_ack_async_event(&mut event) };
        Ok(Some(raw))
    }
}

/// `ibv_event_type_str`: libibverbs' description of an event type (`port error`, ...).
pub(crate) fn event_type_str(kind: sys::ibv_event_type::Type) -> String {
    // SAFETY: ibv_event_type_str returns a static string for every value.
    let s = unsafe { sys::ibv_event_type_str(kind) };
    if s.is_null() {
        return format!("event {kind}");
    }
    // SAFETY: checked non-NULL; a static NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(s) }
        .to_string_lossy()
        .into_owned()
}

fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor the context owns; F_GETFL/F_SETFL touch only its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 {
        return Err(error::last_error("fcntl(F_GETFL) on the async event fd"));
    }
    // SAFETY: as above.
    if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(error::last_error("fcntl(F_SETFL) on the async event fd"));
    }
    Ok(())
}

/// Port `port`'s state, from librdmacm's context of `device` (`ibv_query_device` for the
/// port count, then `ibv_query_port`).
pub(crate) fn query_port_state(device: &str, port: u8) -> io::Result<sys::ibv_port_state::Type> {
    let devices = CmDevices::new()?;
    let ctx = devices.by_name(device).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no RDMA device is called {device:?} (the devices are: {})",
                devices.names().join(", ")
            ),
        )
    })?;
    let ports = query_device(ctx)?.phys_port_cnt;
    if port == 0 || port > ports {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("RDMA device {device} has no port {port} (its ports are 1 to {ports})"),
        ));
    }
    Ok(query_port(ctx, port)?.state)
}

impl AsRawFd for AsyncEventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

// SAFETY: the descriptor is the context's `async_fd`, which stays open and the same while the
// context is open, and `devices` keeps the context open for as long as this value lives.
unsafe impl OwnsFd for AsyncEventFd {}
