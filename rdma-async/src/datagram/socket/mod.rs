//! `RDatagram`: a UD queue pair on a bound rdma_cm id, used like `tokio::net::UdpSocket`:
//! the socket, binding it, what it says about itself, and its end. Sending, receiving and its
//! routes are in the submodules.

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::ToSocketAddrs;

use super::hello::Hello;
use super::lru::LruMap;
use super::multicast::Membership;
use super::options::RDatagramOptions;
use super::peers::Route;
use super::responder::{ResponderShared, answer_requests};
use super::route_slot;
use super::sidr::udp_id;
use super::stats::DatagramStats;
use crate::cm::IdOptions;
use crate::cm::SlotQueue;
use crate::cm::resolve::each_addr;
use crate::datagram::address_handles::{CountedHandle, SocketHandles};
use crate::device::DeviceContext;
use crate::error;
use crate::reactor::AsyncCq;
use crate::verbs::{GRH_LEN, UdCaps, UdQueuePair, port_mtu};

use recv::ArrivedDatagram;

#[cfg(rdma_async_hooks)]
pub mod hooks;
mod recv;
mod routes;
mod send;

/// Pending SIDR requests the bound id queues (as `TcpListener::bind`'s backlog).
const BACKLOG: i32 = 1024;

/// A route being made or made, shared by concurrent senders to one destination.
type RouteSlot = Arc<route_slot::RouteSlot<Arc<Route>>>;

/// An unreliable datagram socket over RDMA (`RDMA_PS_UDP`), used like
/// `tokio::net::UdpSocket`.
///
/// Datagrams keep their boundaries, may be lost and are at most one packet (the port's MTU,
/// see [`Self::max_datagram`]). The first datagram to a new peer resolves it through rdma_cm
/// (address, route, and a SIDR exchange that returns the peer's queue pair number and Q_Key);
/// the result is cached, so later datagrams to that peer cost no round trip. A peer that sent
/// to the socket is answered without one: its datagram gives the route back, whose address
/// handle the first `send_to` to it makes (on a blocking thread, as it may wait for neighbour
/// resolution). Peers' SIDR requests are answered by a task of the socket's own, so they can
/// reach it while nobody reads.
///
/// It speaks to librdmacm's C tools: every datagram carries immediate data, as `udaddy` and
/// `mckey` send it. Between rdma-async sockets the immediate numbers the datagrams of each
/// destination, which lets the receiver count what the device dropped ([`Self::stats`]).
///
/// All methods take `&self`; share it with an `Arc` to send and receive from several tasks.
#[derive(Debug)]
pub struct RDatagram {
    // Drop order: `Drop` leaves the groups (detaching the queue pair); the queue pair is
    // destroyed next, after which the address handles in send slots and routes may go.
    qp: UdQueuePair,
    send: SlotQueue<(), Arc<CountedHandle>>,
    recv: SlotQueue<ArrivedDatagram>,
    /// At most `max_peers` routes, the least recently used forgotten first; a forgotten
    /// route's address handle lives on in the send slots that still name it.
    routes: Mutex<LruMap<SocketAddr, RouteSlot>>,
    groups: Mutex<HashMap<IpAddr, Membership>>,
    /// The socket's address handles, on its device context's protection domain.
    handles: SocketHandles,
    shared: Arc<ResponderShared>,
    peer: Mutex<Option<SocketAddr>>,
    local: SocketAddr,
    port_num: u8,
    max_datagram: usize,
    slot_len: usize,
    recv_depth: usize,
    resolve_timeout: Duration,
    /// The options of every id the socket creates (to resolve peers, to join groups).
    id_options: IdOptions,
    responder: tokio::task::AbortHandle,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The tables are maps updated by single inserts and removes: a panic elsewhere cannot leave
    // them half-changed.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl RDatagram {
    /// Binds a datagram socket to `addr` (an address of an RDMA device; port 0 picks a free
    /// rdma_cm port), with the default options. Each resolved address is tried in turn, like
    /// `UdpSocket::bind`.
    ///
    /// # Errors
    ///
    /// `NotFound` when the machine has no RDMA device; `AddrNotAvailable` when the address is
    /// not on an RDMA device; `AddrInUse` when the rdma_cm UDP port is taken; `InvalidInput`
    /// for a wildcard address (it picks no device) unless the options choose the device.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything it created.
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<RDatagram> {
        Self::bind_with(addr, &RDatagramOptions::new()).await
    }

    /// As [`Self::bind`], with options.
    ///
    /// # Errors
    ///
    /// As [`Self::bind`]; also `InvalidInput` when `max_datagram` exceeds the port's MTU.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with<A: ToSocketAddrs>(
        addr: A,
        options: &RDatagramOptions,
    ) -> io::Result<RDatagram> {
        each_addr(addr, |addr| {
            std::future::ready(Self::bind_one(addr, options))
        })
        .await
    }

    fn bind_one(addr: SocketAddr, opts: &RDatagramOptions) -> io::Result<RDatagram> {
        let addr =
            crate::device::source_addr(opts.device.as_ref(), Some(addr), None)?.unwrap_or(addr);
        if addr.ip().is_unspecified() {
            return Err(error::invalid_input(format!(
                "cannot bind a datagram socket to {addr}: bind to the address of an RDMA \
                 device, or choose the device (a wildcard address picks no device for the \
                 queue pair)"
            )));
        }
        let (id, events) = udp_id(&opts.id)?;
        id.bind_addr(addr)?;
        crate::device::verify_device(opts.device.as_ref(), &id)?;
        let local = id.local_addr()?;
        let max_datagram = opts.datagram_limit(port_mtu(&id)?)?;
        let slot_len = max_datagram + GRH_LEN;
        let recv_depth = opts.queue.recv_depth as usize;
        let send_depth = opts.queue.send_depth as usize;
        let sizes = || {
            Some((
                max_datagram.checked_mul(send_depth)?,
                slot_len.checked_mul(recv_depth)?,
            ))
        };
        let (send_bytes, recv_bytes) =
            sizes().ok_or_else(|| error::invalid_input("datagram buffer sizes overflow"))?;

        let pd = DeviceContext::resolve(opts.context.as_ref(), &id)?
            .pd()
            .clone();
        let async_send_cq = AsyncCq::create(&id, opts.queue.send_depth, opts.queue.busy_poll)?;
        let async_recv_cq = AsyncCq::create(&id, opts.queue.recv_depth, opts.queue.busy_poll)?;
        let (send_cq, recv_cq) = (async_send_cq.queue(), async_recv_cq.queue());
        let caps = UdCaps {
            max_send_wr: opts.queue.send_depth,
            max_recv_wr: opts.queue.recv_depth,
            send_bytes,
            recv_bytes,
        };
        let qp = UdQueuePair::new(
            id.clone(),
            pd.clone(),
            send_cq.clone(),
            recv_cq.clone(),
            caps,
        )?;
        for slot in 0..recv_depth {
            qp.post_recv(slot as u64, slot * slot_len, slot_len)?;
        }
        // Listening last: peers are answered only once datagrams can be received.
        id.listen(BACKLOG)?;

        let shared = Arc::new(ResponderShared::new(
            Hello {
                port: local.port(),
                qpn: qp.qp_num(),
            },
            opts.max_peers,
        ));
        // Our own datagrams (to ourselves, or looped back from a group) are ours.
        shared.sources().learn_peer(local, qp.qp_num());
        let responder = tokio::spawn(answer_requests(events, shared.clone(), local)).abort_handle();
        tracing::debug!(%local, qp = qp.qp_num(), max_datagram, "datagram socket bound");
        Ok(RDatagram {
            send: SlotQueue::new(async_send_cq, send_depth, None)?,
            recv: SlotQueue::new(async_recv_cq, recv_depth, None)?,
            routes: Mutex::new(LruMap::new(opts.max_peers)),
            groups: Mutex::default(),
            port_num: id.port_num(),
            qp,
            handles: SocketHandles::new(pd),
            shared,
            peer: Mutex::new(None),
            local,
            max_datagram,
            slot_len,
            recv_depth,
            resolve_timeout: opts.resolve_timeout,
            id_options: opts.id.clone(),
            responder,
        })
    }

    /// The device context the socket works in.
    pub fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.handles.pd().clone())
    }

    /// The address the socket is bound to, with the port it got.
    ///
    /// # Errors
    ///
    /// None today; `io::Result` as `UdpSocket::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
    }

    /// The peer set by [`Self::connect`].
    ///
    /// # Errors
    ///
    /// `NotConnected` when the socket is not connected.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        (*lock(&self.peer)).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the datagram socket is not connected",
            )
        })
    }

    /// The largest datagram this socket sends and receives: the active MTU of its device port
    /// (UD messages are a single packet), or the smaller `max_datagram` option.
    pub fn max_datagram(&self) -> usize {
        self.max_datagram
    }

    /// The socket's queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// What the socket counted: datagrams sent, received, dropped (see [`DatagramStats`]),
    /// truncated, malformed, filtered.
    pub fn stats(&self) -> DatagramStats {
        self.shared.counters.snapshot()
    }

    /// Fails once the socket ended (see [`Self::fill_or_end`]).
    fn check_alive(&self) -> io::Result<()> {
        match self.shared.end_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

impl Drop for RDatagram {
    fn drop(&mut self) {
        self.responder.abort();
        let groups: Vec<Membership> = lock(&self.groups).drain().map(|(_, m)| m).collect();
        for membership in groups {
            if let Err(e) = membership.leave(&self.qp) {
                tracing::debug!(error = %e, "leaving a multicast group on drop");
            }
        }
    }
}
