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
use super::listener_options::ListenerOptions;
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
    /// Binds to `addr` and listens with the default [`ListenerOptions`] (a backlog of 1024, any
    /// device), trying each resolved address in turn like `TcpListener::bind`. Port 0 picks a
    /// free port (see [`Self::local_addr`]).
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
        Self::bind_with(addr, &ListenerOptions::default()).await
    }

    /// As [`Self::bind`], with `options`: the listen backlog, the device to listen on and the
    /// `rdma_set_option` options (see [`ListenerOptions`]).
    ///
    /// # Errors
    ///
    /// As [`Self::bind`]; the OS error of `rdma_set_option`. With a device: `NotFound` for an
    /// unknown device, port or GID index (naming those there are), `InvalidInput` when `addr`
    /// is not an address of the choice, `AddrNotAvailable` when the port has no address of
    /// `addr`'s family or rdma_cm bound another device.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with<A: ToSocketAddrs>(
        addr: A,
        options: &ListenerOptions,
    ) -> io::Result<Self> {
        Self::bind_choosing(addr, options.backlog, &options.id, options.device.as_ref()).await
    }

    /// [`Self::bind_with`] with the options' parts (as a stream listener has them).
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
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpListener::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
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
