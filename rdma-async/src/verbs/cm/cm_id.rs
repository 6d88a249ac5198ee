//! `rdma_cm_id`: the rdma_cm analogue of a socket.

use std::io;
use std::net::SocketAddr;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_async_sys as sys;

use super::event_channel::{EventChannel, IncomingId};
use super::sockaddr::{from_sockaddr, to_sockaddr};
use crate::error;

/// The rdma_cm port space of an id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PortSpace {
    /// `RDMA_PS_TCP`: reliable connected queue pairs, the port space of rsockets streams.
    Tcp,
    /// `RDMA_PS_UDP`: unreliable datagram queue pairs, SIDR address exchange and multicast.
    Udp,
}

/// Connection parameters in the form `rdma_connect`/`rdma_accept` take them.
#[derive(Debug, Clone, Default)]
pub(crate) struct RawConnParam {
    pub(crate) private_data: Vec<u8>,
    pub(crate) responder_resources: u8,
    pub(crate) initiator_depth: u8,
    pub(crate) flow_control: u8,
    pub(crate) retry_count: u8,
    pub(crate) rnr_retry_count: u8,
}

impl RawConnParam {
    /// A C view of the parameters, borrowing `self.private_data`. It announces no queue pair
    /// number: librdmacm announces the id's own queue pair's (an id without one sets it on the
    /// view, see [`CmId::accept_ud`]).
    fn as_sys(&self) -> io::Result<sys::rdma_conn_param> {
        let len = u8::try_from(self.private_data.len())
            .map_err(|_| error::invalid_input("private data longer than 255 bytes"))?;
        Ok(sys::rdma_conn_param {
            private_data: if len == 0 {
                ptr::null()
            } else {
                self.private_data.as_ptr().cast()
            },
            private_data_len: len,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: 0,
            qp_num: 0,
        })
    }
}

/// An owned `rdma_cm_id`, bound to the event channel it reports on.
///
/// Destroying the id requires its queue pair to be gone: the queue pair owner
/// ([`OwnedBufferQueuePair`](crate::verbs::qp::OwnedBufferQueuePair),
/// [`CallerMemoryQueuePair`](crate::verbs::qp::CallerMemoryQueuePair) or
/// [`UdQueuePair`](crate::verbs::qp::UdQueuePair)) holds an `Arc<CmId>`, so the id outlives it.
#[derive(Debug)]
pub(crate) struct CmId {
    raw: NonNull<sys::rdma_cm_id>,
    // The channel must outlive the id: rdma_destroy_id reports to it.
    _channel: Arc<EventChannel>,
}

// SAFETY: rdma_cm ids may be used from any thread; librdmacm serialises operations on one id
// internally, and this type hands out no references into the C object.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl CmId {
    /// Creates an id reporting to `channel`.
    pub(crate) fn new(channel: Arc<EventChannel>, ps: PortSpace) -> io::Result<Self> {
        let ps = match ps {
            PortSpace::Tcp => sys::rdma_port_space::RDMA_PS_TCP,
            PortSpace::Udp => sys::rdma_port_space::RDMA_PS_UDP,
        };
        let mut raw = ptr::null_mut();
        // SAFETY: the channel is valid, `raw` is a valid out-pointer, the context may be NULL.
        let ret = unsafe { sys::rdma_create_id(channel.as_ptr(), &mut raw, ptr::null_mut(), ps) };
        if ret != 0 {
            return Err(error::last_error("rdma_create_id"));
        }
        let raw =
            NonNull::new(raw).ok_or_else(|| error::call_error("rdma_create_id", libc::EIO))?;
        Ok(CmId {
            raw,
            _channel: channel,
        })
    }

    /// Takes ownership of the new id of a `CONNECT_REQUEST` and moves it, with its pending
    /// events, onto its own channel.
    pub(crate) fn from_incoming(
        incoming: IncomingId,
        channel: Arc<EventChannel>,
    ) -> io::Result<Self> {
        let raw = incoming.0;
        // SAFETY: `raw` is a live id owned by `incoming`; the channel is valid. The request event
        // was already acked, so the migration does not wait.
        if unsafe { sys::rdma_migrate_id(raw.as_ptr(), channel.as_ptr()) } != 0 {
            // Dropping `incoming` destroys the id.
            return Err(error::last_error("rdma_migrate_id"));
        }
        std::mem::forget(incoming);
        Ok(CmId {
            raw,
            _channel: channel,
        })
    }

    /// Takes ownership of the new id of a `CONNECT_REQUEST` without moving it: it keeps
    /// reporting to `channel`, the listener's channel it arrived on. For requests that are
    /// answered at once (a datagram id's SIDR request), so no event of it is read elsewhere.
    pub(crate) fn adopt_incoming(incoming: IncomingId, channel: Arc<EventChannel>) -> Self {
        let raw = incoming.0;
        std::mem::forget(incoming);
        CmId {
            raw,
            _channel: channel,
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rdma_cm_id {
        self.raw.as_ptr()
    }

    /// The verbs context of the device the id is bound to; an error before address resolution
    /// (or a bind to a specific address) has picked a device.
    pub(crate) fn verbs(&self) -> io::Result<NonNull<sys::ibv_context>> {
        // SAFETY: the id is valid for `self`'s lifetime.
        NonNull::new(unsafe { (*self.raw.as_ptr()).verbs }).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the rdma_cm id is not bound to a device yet",
            )
        })
    }

    /// The number of the queue pair created on this id (`rdma_create_qp`), if any.
    pub(crate) fn qp_num(&self) -> Option<u32> {
        // SAFETY: the id is valid for `self`'s lifetime; `qp` is null or the id's queue pair,
        // which rdma_cm keeps alive until `rdma_destroy_qp`.
        let qp = unsafe { (*self.raw.as_ptr()).qp };
        // SAFETY: a non-null `qp` points to a live `ibv_qp` (above).
        (!qp.is_null()).then(|| unsafe { (*qp).qp_num })
    }

    /// Destroys the id's queue pair (`ibv_destroy_qp`) and, once that succeeded, clears the
    /// id's pointer to it: what `rdma_destroy_qp` does, except that it ignores the result
    /// (librdmacm's also destroys the completion queues it created for the id, which it never
    /// does here: this crate creates its own). On failure the queue pair is still there, and
    /// the device may still use every buffer its work requests name.
    ///
    /// # Safety
    ///
    /// The id has a queue pair, which nothing uses during this call, nor after it succeeded.
    pub(crate) unsafe fn destroy_qp(&self) -> io::Result<()> {
        #[cfg(rdma_async_hooks)]
        if let Some(errno) = crate::verbs::device::fault_injection::injected_teardown(
            crate::verbs::device::fault_injection::Teardown::DestroyQueuePair,
        ) {
            return Err(error::call_error("ibv_destroy_qp", errno));
        }
        let raw = self.raw.as_ptr();
        // SAFETY: the id is valid for `self`'s lifetime.
        let qp = unsafe { (*raw).qp };
        // SAFETY: `qp` is live and unused meanwhile (the caller's contract), and is destroyed
        // once: the id's pointer to it is cleared once that succeeded.
        match unsafe { sys::ibv_destroy_qp(qp) } {
            0 => {
                // SAFETY: as above; rdma_cm reads the pointer only in calls the caller makes.
                unsafe { (*raw).qp = ptr::null_mut() };
                Ok(())
            }
            errno => Err(error::call_error("ibv_destroy_qp", errno)),
        }
    }

    pub(crate) fn bind_addr(&self, addr: SocketAddr) -> io::Result<()> {
        let (storage, _) = to_sockaddr(addr);
        // SAFETY: the id is valid and `storage` holds a sockaddr of `addr`'s family.
        let ret = unsafe {
            sys::rdma_bind_addr(self.raw.as_ptr(), ptr::from_ref(&storage).cast_mut().cast())
        };
        if ret != 0 {
            let err = io::Error::last_os_error();
            let errno = err.raw_os_error().unwrap_or(libc::EIO);
            return Err(match errno {
                libc::EADDRNOTAVAIL | libc::ENODEV => io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("cannot bind {addr}: the address is not on an RDMA device ({err})"),
                ),
                libc::EADDRINUSE => io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("cannot bind {addr}: the rdma_cm port is in use"),
                ),
                _ => error::call_error("rdma_bind_addr", errno),
            });
        }
        Ok(())
    }

    /// Starts address resolution; the result arrives as `ADDR_RESOLVED` or `ADDR_ERROR`.
    pub(crate) fn resolve_addr(
        &self,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout_ms: i32,
    ) -> io::Result<()> {
        let src = src.map(to_sockaddr);
        let (dst_storage, _) = to_sockaddr(dst);
        let src_ptr = src
            .as_ref()
            .map_or(ptr::null_mut(), |(s, _)| ptr::from_ref(s).cast_mut().cast());
        // SAFETY: the id is valid; both sockaddrs live across the call (librdmacm copies them).
        let ret = unsafe {
            sys::rdma_resolve_addr(
                self.raw.as_ptr(),
                src_ptr,
                ptr::from_ref(&dst_storage).cast_mut().cast(),
                timeout_ms,
            )
        };
        if ret != 0 {
            let err = io::Error::last_os_error();
            let errno = err.raw_os_error().unwrap_or(libc::EIO);
            if errno == libc::ENODEV || errno == libc::EADDRNOTAVAIL {
                return Err(io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!("no RDMA device can reach {dst} ({err})"),
                ));
            }
            return Err(error::call_error("rdma_resolve_addr", errno));
        }
        Ok(())
    }

    /// Starts route resolution; the result arrives as `ROUTE_RESOLVED` or `ROUTE_ERROR`.
    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> io::Result<()> {
        // SAFETY: the id is valid.
        let ret = unsafe { sys::rdma_resolve_route(self.raw.as_ptr(), timeout_ms) };
        if ret != 0 {
            return Err(error::last_error("rdma_resolve_route"));
        }
        Ok(())
    }

    pub(crate) fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: the id is valid and bound.
        if unsafe { sys::rdma_listen(self.raw.as_ptr(), backlog) } != 0 {
            return Err(error::last_error("rdma_listen"));
        }
        Ok(())
    }

    /// Sends the connection request; the answer arrives as an event.
    pub(crate) fn connect(&self, param: &RawConnParam) -> io::Result<()> {
        self.send_connect(param, None)
    }

    /// Test hook: sends the connection request of an id that has no queue pair, announcing
    /// `qp_num` (the parked requests, `cm::ParkedConnect`); the answer arrives as an event.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn connect_announcing(&self, param: &RawConnParam, qp_num: u32) -> io::Result<()> {
        self.send_connect(param, Some(qp_num))
    }

    /// `rdma_connect` with `param`, announcing `qp_num` when given instead of the id's own
    /// queue pair's.
    fn send_connect(&self, param: &RawConnParam, qp_num: Option<u32>) -> io::Result<()> {
        let mut c = param.as_sys()?;
        if let Some(qp_num) = qp_num {
            c.qp_num = qp_num;
        }
        // SAFETY: the id is valid with a resolved route; `c` borrows `param`, which outlives the
        // call (librdmacm copies the private data).
        if unsafe { sys::rdma_connect(self.raw.as_ptr(), &mut c) } != 0 {
            return Err(error::last_error("rdma_connect"));
        }
        Ok(())
    }

    /// Accepts a connection request; `ESTABLISHED` follows as an event.
    pub(crate) fn accept(&self, param: &RawConnParam) -> io::Result<()> {
        let mut c = param.as_sys()?;
        // SAFETY: as in `connect`.
        if unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut c) } != 0 {
            return Err(error::last_error("rdma_accept"));
        }
        Ok(())
    }

    /// Answers a datagram (SIDR) request: the peer learns `qp_num` and the id's Q_Key, and
    /// gets `private_data`; no event follows.
    pub(crate) fn accept_ud(&self, qp_num: u32, private_data: &[u8]) -> io::Result<()> {
        let param = RawConnParam {
            private_data: private_data.to_vec(),
            ..RawConnParam::default()
        };
        let mut c = param.as_sys()?;
        c.qp_num = qp_num;
        // SAFETY: as in `connect`; for an id without a queue pair librdmacm takes the queue
        // pair number from the parameters.
        if unsafe { sys::rdma_accept(self.raw.as_ptr(), &mut c) } != 0 {
            return Err(error::last_error("rdma_accept"));
        }
        Ok(())
    }

    /// The device port the id is bound to (0 before it is bound to a device).
    pub(crate) fn port_num(&self) -> u8 {
        // SAFETY: the id is valid for `self`'s lifetime.
        unsafe { (*self.raw.as_ptr()).port_num }
    }

    /// Rejects a connection request, with optional private data for the peer.
    pub(crate) fn reject(&self, private_data: &[u8]) -> io::Result<()> {
        let len = u8::try_from(private_data.len())
            .map_err(|_| error::invalid_input("reject private data longer than 255 bytes"))?;
        let data = if len == 0 {
            ptr::null()
        } else {
            private_data.as_ptr().cast()
        };
        // SAFETY: the id is valid; `data` points at `len` bytes for the duration of the call.
        if unsafe { sys::rdma_reject(self.raw.as_ptr(), data, len) } != 0 {
            return Err(error::last_error("rdma_reject"));
        }
        Ok(())
    }

    /// Starts a disconnect (moves the queue pair to the error state and sends a DREQ).
    pub(crate) fn disconnect(&self) -> io::Result<()> {
        // SAFETY: the id is valid.
        if unsafe { sys::rdma_disconnect(self.raw.as_ptr()) } != 0 {
            return Err(error::last_error("rdma_disconnect"));
        }
        Ok(())
    }

    /// `rdma_set_option` at `RDMA_OPTION_ID` with the bytes of the option's C value.
    pub(crate) fn set_option(&self, name: u32, value: &mut [u8]) -> io::Result<()> {
        // SAFETY: the id is valid; `value` is readable for its length during the call.
        let ret = unsafe {
            sys::rdma_set_option(
                self.raw.as_ptr(),
                sys::_bindgen_ty_25::RDMA_OPTION_ID as i32,
                name as i32,
                value.as_mut_ptr().cast(),
                value.len(),
            )
        };
        if ret != 0 {
            return Err(error::last_error("rdma_set_option"));
        }
        Ok(())
    }

    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: the id is valid; the returned pointer points into it.
        let sa = unsafe { sys::rdma_async_get_local_addr(self.raw.as_ptr()) };
        // SAFETY: `sa` points at a sockaddr_storage-sized field of the live id.
        unsafe { from_sockaddr(sa.cast_const()) }
    }

    pub(crate) fn peer_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: as in `local_addr`.
        let sa = unsafe { sys::rdma_async_get_peer_addr(self.raw.as_ptr()) };
        // SAFETY: as in `local_addr`.
        unsafe { from_sockaddr(sa.cast_const()) }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the id is valid and destroyed once. Its queue pair, if any, was destroyed by
        // the queue pair owner that holds an `Arc` to this id (or, when that failed, is kept
        // with the id: the owner leaks its `Arc`); its events were acked when read.
        unsafe { sys::rdma_destroy_id(self.raw.as_ptr()) };
    }
}
