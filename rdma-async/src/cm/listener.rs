//! Listening for connection requests.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rdma_async_sys::rdma_cm_event_type as ev;
use tokio::net::ToSocketAddrs;
use tracing::Instrument;

use super::accept_failure::{AcceptFailure, caused_by_peer};
use super::events::CmEvents;
use super::handshake;
use super::id_options::IdOptions;
use super::peer_warnings::peer_warning;
use super::request::ConnectRequest;
use super::resolve::each_addr;
use crate::device::DeviceChoice;
use crate::verbs::{CmEvent, CmId, EventChannel, IncomingId, PortSpace};

/// The backlog `bind` uses, as tokio's `TcpListener::bind`.
pub(crate) const DEFAULT_BACKLOG: i32 = 1024;

/// An rdma_cm id listening for connection requests (`RDMA_PS_TCP`, the port space of rsockets).
///
/// It yields [`ConnectRequest`]s: look at the peer's private data, then accept the request into
/// a connection type (such as [`crate::endpoint::Endpoint::accept`]) or reject it. Each request's
/// id is moved onto its own event channel at once, so a connection outlives the listener.
#[derive(Debug)]
pub struct CmListener {
    events: CmEvents,
    // The listening id: dropping it stops listening.
    _id: Arc<CmId>,
    local: SocketAddr,
    /// The options the listening id was created with; those that apply to an accepted id (the
    /// ACK timeout) reach every request's.
    options: IdOptions,
    /// Reading a request and moving its id off the listener's channel is one step; concurrent
    /// acceptors take turns so no event of a half-moved id is read by another.
    accept_turn: tokio::sync::Mutex<()>,
    /// The listener's span (its address): the parent of its requests' events.
    span: tracing::Span,
}

impl CmListener {
    /// Binds to `addr` and listens, trying each resolved address in turn like
    /// `TcpListener::bind`. Port 0 picks a free port (see [`Self::local_addr`]).
    ///
    /// # Errors
    ///
    /// `NotFound` when the machine has no RDMA device, `AddrNotAvailable` when the address is not
    /// on an RDMA device, `AddrInUse` when the rdma_cm port is taken, or the resolver's error.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything it created.
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Self::bind_with_backlog(addr, DEFAULT_BACKLOG).await
    }

    /// As [`Self::bind`], with the listen backlog.
    ///
    /// # Errors
    ///
    /// As [`Self::bind`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with_backlog<A: ToSocketAddrs>(addr: A, backlog: i32) -> io::Result<Self> {
        Self::bind_with(addr, backlog, &IdOptions::default()).await
    }

    /// As [`Self::bind`], with the listen backlog and `rdma_set_option` options: address reuse,
    /// IPv6-only and type of service are set on the listening id; the ACK timeout is set on every
    /// accepted id whose accepting type's options do not set one.
    ///
    /// # Errors
    ///
    /// As [`Self::bind`]; the OS error of `rdma_set_option`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with<A: ToSocketAddrs>(
        addr: A,
        backlog: i32,
        options: &IdOptions,
    ) -> io::Result<Self> {
        each_addr(addr, |addr| {
            std::future::ready(Self::bind_one(addr, backlog, options, None))
        })
        .await
    }

    /// As [`Self::bind_with`], listening only on the chosen device (port, GID): a wildcard
    /// `addr` (`0.0.0.0:port`, `[::]:port`) gives its port and family and the address comes
    /// from the port's GID table; any other address must be one of the chosen GIDs'. See
    /// [`DeviceChoice`] for how the address is picked.
    ///
    /// # Errors
    ///
    /// As [`Self::bind_with`]; `NotFound` for an unknown device, port or GID index (naming those
    /// there are), `InvalidInput` when `addr` is not an address of the choice,
    /// `AddrNotAvailable` when the port has no address of `addr`'s family or rdma_cm bound
    /// another device.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_on_device<A: ToSocketAddrs>(
        addr: A,
        backlog: i32,
        options: &IdOptions,
        device: &DeviceChoice,
    ) -> io::Result<Self> {
        Self::bind_choosing(addr, backlog, options, Some(device)).await
    }

    /// [`Self::bind_with`] or [`Self::bind_on_device`].
    pub(crate) async fn bind_choosing<A: ToSocketAddrs>(
        addr: A,
        backlog: i32,
        options: &IdOptions,
        device: Option<&DeviceChoice>,
    ) -> io::Result<Self> {
        each_addr(addr, |addr| {
            std::future::ready(Self::bind_one(addr, backlog, options, device))
        })
        .await
    }

    fn bind_one(
        addr: SocketAddr,
        backlog: i32,
        options: &IdOptions,
        device: Option<&DeviceChoice>,
    ) -> io::Result<Self> {
        let addr = crate::device::source_addr(device, Some(addr), None)?.unwrap_or(addr);
        let (id, events) = handshake::new_id(PortSpace::Tcp, options)?;
        id.bind_addr(addr)?;
        crate::device::verify_device(device, &id)?;
        id.listen(backlog)?;
        let local = id.local_addr()?;
        let span = tracing::debug_span!("rdma_listener", %local);
        tracing::debug!(parent: &span, "listening");
        Ok(CmListener {
            events,
            _id: id,
            local,
            options: options.clone(),
            accept_turn: tokio::sync::Mutex::new(()),
            span,
        })
    }

    /// The listener's span.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    /// The address the listener is bound to, with the port it got.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Waits for the next connection request.
    ///
    /// # Errors
    ///
    /// `NetworkDown` when the device was removed (the listener is then unusable). An error
    /// setting up one request on this host (its own event channel: out of file descriptors)
    /// fails only that request, which is rejected: the next call waits for the next one, as
    /// `TcpListener::accept` goes on after `EMFILE`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a request is taken from the channel only when it is returned.
    pub async fn accept_request(&self) -> io::Result<ConnectRequest> {
        self.request().await.map_err(AcceptFailure::into_error)
    }

    /// As [`Self::accept_request`], telling the listener's own failures from a request's.
    pub(crate) async fn request(&self) -> Result<ConnectRequest, AcceptFailure> {
        self.next_request().instrument(self.span.clone()).await
    }

    async fn next_request(&self) -> Result<ConnectRequest, AcceptFailure> {
        let _turn = self.accept_turn.lock().await;
        loop {
            let mut event = self.events.next().await.map_err(AcceptFailure::Listener)?;
            match event.kind {
                ev::RDMA_CM_EVENT_CONNECT_REQUEST => {
                    let Some(incoming) = event.incoming.take() else {
                        continue;
                    };
                    return self.take_request(incoming, event).map_err(|e| {
                        // Dropping the id on the way out rejected the request.
                        if caused_by_peer(&e) {
                            peer_warning!(error = %e, "connection request failed: rejected");
                        } else {
                            tracing::warn!(error = %e, "connection request failed: rejected");
                        }
                        AcceptFailure::Request(e)
                    });
                }
                ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                    tracing::error!("the RDMA device of the listener was removed");
                    return Err(AcceptFailure::Listener(io::Error::new(
                        io::ErrorKind::NetworkDown,
                        format!("the RDMA device of listener {} was removed", self.local),
                    )));
                }
                _ => tracing::debug!(event = event.name(), "ignoring rdma_cm event on a listener"),
            }
        }
    }

    /// Moves a request's id onto an event channel of its own.
    fn take_request(&self, incoming: IncomingId, event: CmEvent) -> io::Result<ConnectRequest> {
        let fail = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!(
                    "taking a connection request on listener {}: {e}",
                    self.local
                ),
            )
        };
        let channel = Arc::new(EventChannel::new().map_err(fail)?);
        let events = CmEvents::new(channel.clone()).map_err(fail)?;
        let id = Arc::new(CmId::from_incoming(incoming, channel).map_err(fail)?);
        ConnectRequest::new(id, events, event, self.local, self.options.clone())
    }
}
