//! The one path of every rdma_cm id of the crate: creating it with its [`IdOptions`], resolving,
//! connecting and accepting (for `RStream`, `Endpoint` and `RdmaConnection`), and the same id
//! creation and resolution for listeners and `RDatagram`'s bound id and SIDR exchanges.
//!
//! Each step starts an rdma_cm operation and awaits the event that ends it. The caller's
//! `build` closure creates the queue pair and its memory once the device is known, before the
//! request or the accept goes out; its `finish` closure turns them and the established link into
//! the connection. Everything lives in locals and `Arc`s, so dropping the future at any await
//! point destroys whatever was created (the queue pair first, the id last).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::ToSocketAddrs;

use super::event_steps::{CmStep, StepOutcome};
use super::events::CmEvents;
use super::id_options::IdOptions;
use super::link::CmLink;
use super::params::{ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA};
use super::reject_reason::reject_with_reason;
use super::request::ConnectRequest;
use super::resolve::connect_each;
use crate::device::{DeviceChoice, DeviceContext};
use crate::verbs::{CmEvent, CmId, EventChannel, PortSpace};

/// The default bound on an accept (see `accept_timeout` in [`dial_setters`]).
///
/// A handshake needs one round trip after the accept goes out (the peer's RTU), which takes
/// milliseconds even on emulated Soft-RoCE. rdma_cm resends an unanswered accept every
/// 4.3 s (its CM response timeout, 2^20 × 4.096 µs), so 10 s lets the handshake survive two lost
/// packets, while a peer that never answers holds a server's handshake slot for 10 s. rdma_cm's
/// own bound on that wait comes from the client's request (its response timeout and retry
/// count), so a hostile client picks it: with librdmacm clients it had not ended after
/// 3 minutes in the test guest.
pub(crate) const DEFAULT_ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// How the active side reaches a peer, and how long the passive side waits for one; every
/// connecting type's options embed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DialOptions {
    /// The local address to connect from.
    pub(crate) bind: Option<SocketAddr>,
    /// Timeout of address and of route resolution, each.
    pub(crate) resolve_timeout: Duration,
    /// A bound on the whole connect, per address tried.
    pub(crate) connect_timeout: Option<Duration>,
    /// A bound on an accept, from the request to the established connection.
    pub(crate) accept_timeout: Duration,
    /// `rdma_set_option` options of the id.
    pub(crate) id: IdOptions,
    /// The device context to work in; the device's shared one when `None`.
    pub(crate) context: Option<DeviceContext>,
    /// Whether each connection gets a context (protection domain) of its own.
    pub(crate) isolated: bool,
    /// The device (port, GID) to go through, when chosen by name.
    pub(crate) device: Option<DeviceChoice>,
}

impl Default for DialOptions {
    fn default() -> Self {
        DialOptions {
            bind: None,
            resolve_timeout: Duration::from_secs(2),
            connect_timeout: None,
            accept_timeout: DEFAULT_ACCEPT_TIMEOUT,
            id: IdOptions::default(),
            context: None,
            isolated: false,
            device: None,
        }
    }
}

impl DialOptions {
    /// The context a connection on `id` works in: the chosen one, checked to be on `id`'s
    /// device, or that device's shared one.
    pub(crate) fn context_for(&self, id: &Arc<CmId>) -> io::Result<DeviceContext> {
        if self.isolated && self.context.is_none() {
            return DeviceContext::isolated(id);
        }
        DeviceContext::resolve(self.context.as_ref(), id)
    }
}

/// The builder methods for the [`DialOptions`] in a field named `dial`, with the same names and
/// documentation on every options type; `dial_setters!(conn_params)` adds the setter of the
/// [`ConnParams`] in a field named `params`, for the types whose connect and accept take them.
macro_rules! dial_setters {
    (conn_params) => {
        $crate::cm::handshake::dial_setters!();

        /// The parameters of `rdma_connect(3)`/`rdma_accept(3)`: private data, responder
        /// resources and initiator depth (RDMA reads and atomics outstanding), retry counts,
        /// flow control.
        pub fn conn_params(mut self, params: $crate::cm::ConnParams) -> Self {
            self.params = params;
            self
        }
    };
    () => {
        /// Timeout of address and of route resolution, each (2 s by default).
        pub fn resolve_timeout(mut self, time: std::time::Duration) -> Self {
            self.dial.resolve_timeout = time;
            self
        }

        /// A bound on the whole connect, per address tried (none by default).
        pub fn connect_timeout(mut self, time: std::time::Duration) -> Self {
            self.dial.connect_timeout = Some(time);
            self
        }

        /// A bound on accepting a connection, from the peer's request to the established
        /// connection (10 s by default). A peer that sends a connection request and then never
        /// completes the handshake is rejected when it passes, and the accept fails with
        /// `TimedOut`; a listener (`RListener`) gives each of its handshakes this bound, so
        /// silent peers cannot hold its handshake slots.
        pub fn accept_timeout(mut self, time: std::time::Duration) -> Self {
            self.dial.accept_timeout = time;
            self
        }

        /// The local address to connect from.
        pub fn bind(mut self, addr: std::net::SocketAddr) -> Self {
            self.dial.bind = Some(addr);
            self
        }

        /// The RDMA device to go through, by name (`"rxe0"`), or a device, port and GID index
        /// ([`DeviceChoice`](crate::device::DeviceChoice), which says how the local address is
        /// picked from the port's GID table). With [`bind`](Self::bind) too, a wildcard address
        /// gives its port and family; any other must be an address of the chosen GIDs, or the
        /// connect fails with `InvalidInput`. When accepting, a request that came through
        /// another device is rejected with `AddrNotAvailable`. An unknown device, port or GID
        /// index is `NotFound`, naming those there are.
        pub fn device(mut self, choice: impl Into<$crate::device::DeviceChoice>) -> Self {
            self.dial.device = Some(choice.into());
            self
        }

        /// The device context to work in (its protection domain; see
        /// [`DeviceContext`](crate::device::DeviceContext)): regions registered through it can
        /// be used on the connection. By default the shared context of the device the route
        /// goes through. A context of another device than the route's fails the connect or
        /// accept with `InvalidInput` before anything is sent.
        pub fn context(mut self, context: $crate::device::DeviceContext) -> Self {
            self.dial.context = Some(context);
            self
        }

        /// Gives each connection a device context (protection domain) of its own, instead of
        /// the device's shared one: a remote key then works on that connection only, so a peer
        /// cannot reach memory advertised to another peer even if it learns or guesses its key.
        /// Use it for servers whose clients do not trust each other; it costs one protection
        /// domain per connection, and regions must be registered through the connection's own
        /// context. Ignored when [`context`](Self::context) names one.
        pub fn isolated_context(mut self, isolated: bool) -> Self {
            self.dial.isolated = isolated;
            self
        }

        /// `rdma_set_option` options of the connection's rdma_cm id (type of service, address
        /// reuse, IPv6-only, ACK timeout). When accepting, the ACK timeout is set on the
        /// accepted id (a listener's own ACK timeout applies where this sets none); a stream
        /// listener (`RListener::bind_with`) sets all of them on its listening id.
        pub fn id_options(mut self, options: $crate::cm::IdOptions) -> Self {
            self.dial.id = options;
            self
        }
    };
}
pub(crate) use dial_setters;

/// Waits for the event that ends `step`, skipping informational events; any other event fails
/// the step ([`CmStep::on_event`] decides).
pub(crate) async fn expect(
    events: &CmEvents,
    step: CmStep,
    peer: Option<SocketAddr>,
) -> io::Result<CmEvent> {
    loop {
        let event = events.next().await?;
        match step.on_event(&event, peer) {
            StepOutcome::Done => return Ok(event),
            StepOutcome::Ignored => {
                tracing::debug!(event = event.name(), "ignoring informational rdma_cm event");
            }
            StepOutcome::Failed(e) => return Err(e),
        }
    }
}

/// An rdma_cm timeout in milliseconds, at least 1 (0 would not wait at all).
pub(crate) fn timeout_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

/// A fresh id of port space `ps` on its own event channel, with `options` set (every id the
/// crate creates starts here, so no transport can forget them).
pub(crate) fn new_id(ps: PortSpace, options: &IdOptions) -> io::Result<(Arc<CmId>, CmEvents)> {
    let channel = Arc::new(EventChannel::new()?);
    let events = CmEvents::new(channel.clone())?;
    let id = Arc::new(CmId::new(channel, ps)?);
    options.apply(&id, ps)?;
    Ok((id, events))
}

/// Resolves the address (from `bind`, if given) and then the route to `dst`, each within
/// `timeout`; afterwards the id knows its device.
pub(crate) async fn resolve_route(
    id: &CmId,
    events: &CmEvents,
    bind: Option<SocketAddr>,
    dst: SocketAddr,
    timeout: Duration,
) -> io::Result<()> {
    let ms = timeout_ms(timeout);
    let peer = Some(dst);
    id.resolve_addr(bind, dst, ms)?;
    expect(events, CmStep::ResolvingAddr, peer).await?;
    id.resolve_route(ms)?;
    expect(events, CmStep::ResolvingRoute, peer).await?;
    Ok(())
}

/// Connects to `addr` like `TcpStream::connect`: each resolved address in turn (each bounded by
/// the connect timeout), returning the first connection or the last error. Per address it
/// resolves, builds the queue pair with `build`, connects, and hands what `build` made and the
/// established link to `finish`. `build` may return the private data to send (it can describe
/// what it just registered); otherwise `params`' private data goes out.
pub(crate) async fn connect<A, P, T>(
    addr: A,
    dial: &DialOptions,
    params: &ConnParams,
    build: impl Fn(&Arc<CmId>) -> io::Result<(P, Option<Vec<u8>>)>,
    finish: impl Fn(P, CmLink) -> io::Result<T>,
) -> io::Result<T>
where
    A: ToSocketAddrs,
{
    let (build, finish) = (&build, &finish);
    connect_each(addr, dial.connect_timeout, |dst| async move {
        let result = connect_one(dst, dial, params, build).await;
        if let Err(e) = &result {
            tracing::debug!(%dst, error = %e, "connect failed");
        }
        let (parts, link) = result?;
        finish(parts, link)
    })
    .await
}

async fn connect_one<P>(
    dst: SocketAddr,
    dial: &DialOptions,
    params: &ConnParams,
    build: impl FnOnce(&Arc<CmId>) -> io::Result<(P, Option<Vec<u8>>)>,
) -> io::Result<(P, CmLink)> {
    let mut raw_params = params.to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")?;
    let bind = crate::device::source_addr(dial.device.as_ref(), dial.bind, Some(dst))?;
    let (id, events) = new_id(PortSpace::Tcp, &dial.id)?;
    resolve_route(&id, &events, bind, dst, dial.resolve_timeout).await?;
    crate::device::verify_device(dial.device.as_ref(), &id)?;

    let (parts, private_data) = build(&id)?;
    if let Some(data) = private_data {
        raw_params = params
            .clone()
            .private_data(data)
            .to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")?;
    }
    id.connect(&raw_params)?;
    let established = expect(&events, CmStep::Connecting, Some(dst)).await?;
    id.set_qp_min_rnr_timer(params.get_min_rnr_timer())?;
    let link = CmLink::new(id, events, established.private_data, dst)?;
    tracing::debug!(parent: link.span(), "connected");
    Ok((parts, link))
}

/// Accepts `request`: sets the id options that apply to an accepted id (the accepting type's
/// `dial.id`, falling back to the listener's, which the request carries), builds the queue pair
/// with `build`, accepts with `params` (and `build`'s private data, if any), and hands what
/// `build` made and the established link to `finish`.
///
/// The whole of it is bounded by `dial.accept_timeout`: when that passes, everything created is
/// dropped, which rejects the request (or, once the accept went out, destroys the id, and
/// rdma_cm rejects the connection the peer never completed).
pub(crate) async fn accept<P, T>(
    request: ConnectRequest,
    dial: &DialOptions,
    params: &ConnParams,
    build: impl FnOnce(&Arc<CmId>) -> io::Result<(P, Option<Vec<u8>>)>,
    finish: impl FnOnce(P, CmLink) -> io::Result<T>,
) -> io::Result<T> {
    let peer = request.peer();
    if let Err(e) = crate::device::verify_device(dial.device.as_ref(), request.id()) {
        let e = io::Error::new(e.kind(), format!("the request of {peer}: {e}"));
        reject_with_reason(request, &e);
        return Err(e);
    }
    let deadline = dial.accept_timeout;
    match tokio::time::timeout(
        deadline,
        accept_within(request, &dial.id, params, build, finish),
    )
    .await
    {
        Ok(result) => result,
        Err(_elapsed) => {
            tracing::debug!(%peer, ?deadline, "handshake timed out: rejected");
            Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "{peer} did not complete the connection handshake within {deadline:?}: \
                     its request was rejected"
                ),
            ))
        }
    }
}

async fn accept_within<P, T>(
    request: ConnectRequest,
    options: &IdOptions,
    params: &ConnParams,
    build: impl FnOnce(&Arc<CmId>) -> io::Result<(P, Option<Vec<u8>>)>,
    finish: impl FnOnce(P, CmLink) -> io::Result<T>,
) -> io::Result<T> {
    options
        .or(request.listener_options())
        .apply_to_accepted(request.id())?;
    // Never promise more RDMA reads than the peer asked to issue or can serve.
    let (peer_initiator_depth, peer_responder_resources) = request.peer_rdma_read_limits();
    let params = params
        .clone()
        .responder_resources(params.get_responder_resources().min(peer_initiator_depth))
        .initiator_depth(params.get_initiator_depth().min(peer_responder_resources));
    // A server that cannot set up the connection tells the client why (not a bare refusal).
    let (parts, private_data) = match build(request.id()) {
        Ok(built) => built,
        Err(e) => {
            reject_with_reason(request, &e);
            return Err(e);
        }
    };
    let params = match private_data {
        Some(data) => params.private_data(data),
        None => params,
    };
    let raw = params.to_raw(MAX_ACCEPT_PRIVATE_DATA, "accept")?;
    let (id, events, peer_private_data, peer) = request.answer_accept(&raw)?;
    // rdma_accept moved the queue pair to RTS before the reply went out: set before the peer
    // can send.
    id.set_qp_min_rnr_timer(params.get_min_rnr_timer())?;
    expect(&events, CmStep::Accepting, Some(peer)).await?;
    let link = CmLink::new(id, events, peer_private_data, peer)?;
    tracing::debug!(parent: link.span(), "accepted");
    finish(parts, link)
}
