//! Test hooks on [`RDatagram`] (`--cfg rdma_async_hooks`, which this workspace's own builds set;
//! reached as `rdma_async::datagram::hooks`): how one socket plays many senders, what a test
//! reads of the routes and peer tables a user cannot see, and a hold on making the address
//! handles that answer received datagrams ([`hold_reply_handles`]). Free functions taking the socket, so
//! `RDatagram` itself carries none of them.

use std::io;
use std::net::SocketAddr;

use super::{RDatagram, lock};
use crate::datagram::hello::Hello;
use crate::datagram::sidr::resolve_peer;
pub use crate::verbs::reply_handle_hold::{ReplyHandleHold, hold_reply_handles};

/// Resolves `target` as a first datagram to it does, and returns the traffic class of the route
/// rdma_cm reports (the type of service of the socket's id options).
///
/// # Errors
///
/// As [`RDatagram::send_to`]'s resolution.
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn resolve_traffic_class(socket: &RDatagram, target: SocketAddr) -> io::Result<u8> {
    let (ud, _) = socket.ask_peer(target).await?;
    Ok(ud.ah_attr.traffic_class())
}

/// A SIDR exchange with `target` in which `socket` claims to be bound to `port` with queue pair
/// `qpn` (a peer can claim anything there); nothing is cached here. One socket plays many
/// senders this way.
///
/// # Errors
///
/// As [`RDatagram::send_to`]'s resolution.
///
/// # Cancel safety
///
/// Cancel safe.
pub async fn introduce_as(
    socket: &RDatagram,
    target: SocketAddr,
    port: u16,
    qpn: u32,
) -> io::Result<()> {
    let claim = Hello { port, qpn };
    resolve_peer(
        socket.local.ip(),
        target,
        socket.resolve_timeout,
        &socket.id_options,
        claim,
    )
    .await
    .map(drop)
}

/// How much `socket` remembers about peers.
pub fn peer_tables(socket: &RDatagram) -> PeerTables {
    PeerTables {
        routes: lock(&socket.routes).len(),
        senders: socket.shared.sources().len(),
        address_handles: socket.handles.live(),
    }
}

/// The sizes of a socket's peer tables ([`peer_tables`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTables {
    /// Cached routes to peers, resolved or being resolved.
    pub routes: usize,
    /// Senders known by their address, and anonymous SIDR ports.
    pub senders: usize,
    /// Live address handles: routes', groups' and those only in-flight sends still hold.
    pub address_handles: usize,
}
