//! `RDatagram`: a UD queue pair on a bound rdma_cm id, used like `tokio::net::UdpSocket`.

use crate::device::DeviceContext;
use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::net::ToSocketAddrs;
use tokio::sync::OnceCell;

use super::grh;
use super::hello::Hello;
use super::lru::LruMap;
use super::multicast::{self, Membership};
use super::options::RDatagramOptions;
use super::peers::Route;
use super::responder::{ResponderShared, answer_requests};
use super::sidr::{resolve_peer, udp_id};
use super::stats::{Counters, DatagramStats};
use crate::cm::IdOptions;
use crate::cm::resolve::{each_addr, resolve};
use crate::cm::{SlotQueue, Slots};
use crate::error;
use crate::reactor::AsyncCq;
use crate::verbs::{
    AddressHandle, AddressHandles, GRH_LEN, UdCaps, UdParam, UdQueuePair, UdSend, WcStatus,
    WorkCompletion, port_mtu,
};

/// Pending SIDR requests the bound id queues (as `TcpListener::bind`'s backlog).
const BACKLOG: i32 = 1024;

/// A route being resolved or resolved, shared by concurrent senders to one destination.
type RouteSlot = Arc<OnceCell<Arc<Route>>>;

/// Send slots; each holds the address handle its send names until the send completes.
type SendSlots = Slots<(), Arc<AddressHandle>>;
/// Receive slots, all posted; what arrived waits in `ready`.
type RecvSlots = Slots<ArrivedDatagram, ()>;

/// A received datagram waiting in its receive slot.
#[derive(Debug)]
struct ArrivedDatagram {
    slot: usize,
    len: usize,
    from: SocketAddr,
}

/// An unreliable datagram socket over RDMA (`RDMA_PS_UDP`), used like
/// `tokio::net::UdpSocket`.
///
/// Datagrams keep their boundaries, may be lost and are at most one packet (the port's MTU,
/// see [`Self::max_datagram`]). The first datagram to a new peer resolves it through rdma_cm
/// (address, route, and a SIDR exchange that returns the peer's queue pair number and Q_Key);
/// the result is cached, so later datagrams to that peer cost no round trip. Peers are
/// answered by a task of the socket's own, so they can reach it while nobody reads.
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
    send: SlotQueue<(), Arc<AddressHandle>>,
    recv: SlotQueue<ArrivedDatagram>,
    /// At most `max_peers` routes, the least recently used forgotten first; a forgotten
    /// route's address handle lives on in the send slots that still name it.
    routes: Mutex<LruMap<SocketAddr, RouteSlot>>,
    groups: Mutex<HashMap<IpAddr, Membership>>,
    /// The socket's address handles, on its device context's protection domain.
    handles: AddressHandles,
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
        Self::bind_with(addr, RDatagramOptions::new()).await
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
        options: RDatagramOptions,
    ) -> io::Result<RDatagram> {
        each_addr(addr, |addr| {
            std::future::ready(Self::bind_one(addr, &options))
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
        let recv_depth = opts.recv_depth as usize;
        let send_depth = opts.send_depth as usize;
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
        let async_send_cq = AsyncCq::create(&id, opts.send_depth, opts.busy_poll)?;
        let async_recv_cq = AsyncCq::create(&id, opts.recv_depth, opts.busy_poll)?;
        let (send_cq, recv_cq) = (async_send_cq.queue(), async_recv_cq.queue());
        let caps = UdCaps {
            max_send_wr: opts.send_depth,
            max_recv_wr: opts.recv_depth,
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
            handles: AddressHandles::new(pd),
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

    fn check_len(&self, len: usize) -> io::Result<()> {
        if len > self.max_datagram {
            return Err(error::invalid_input(format!(
                "datagram of {len} bytes exceeds the {} bytes one RDMA datagram can carry on \
                 this path (the port's MTU)",
                self.max_datagram
            )));
        }
        Ok(())
    }

    /// Sends one datagram to `target` (the first address it resolves to) and returns its
    /// length once the device has it. The first datagram to a new peer resolves the peer
    /// through rdma_cm; the route is cached. Multicast groups must be joined first
    /// ([`Self::join_multicast`]); their port is ignored.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `buf` exceeds [`Self::max_datagram`] (checked before anything is
    /// posted) or the address family differs from the socket's; `ConnectionRefused` when no
    /// datagram socket is bound at `target`; `TimedOut` when the peer does not answer;
    /// `NotConnected` for a multicast group not joined.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, the datagram was not sent (a
    /// route being resolved may still be cached).
    pub async fn send_to<A: ToSocketAddrs>(&self, buf: &[u8], target: A) -> io::Result<usize> {
        self.check_alive()?;
        self.check_len(buf.len())?;
        let target = first_addr(target).await?;
        let route = self.route_to(target).await?;
        self.send_on(&route, buf).await
    }

    /// Sends to `target` if it can be done at once: the route is cached and a send slot free.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when every send slot is in flight (wait with [`Self::writable`]);
    /// `NotConnected` when no route to `target` is cached yet ([`Self::send_to`] or
    /// [`Self::connect`] resolve it); otherwise as [`Self::send_to`].
    pub fn try_send_to(&self, buf: &[u8], target: SocketAddr) -> io::Result<usize> {
        self.check_len(buf.len())?;
        let route = self.cached_route(target)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("no route to {target} is cached yet: send_to or connect resolves it"),
            )
        })?;
        let mut slots = self.send.try_lock()?;
        self.send
            .reap_queued(&mut slots, &mut |s, wc| self.reap_send(s, wc))?;
        match slots.free.pop() {
            Some(slot) => self.post_in_slot(&mut slots, slot, &route, buf),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Sets the default peer for [`Self::send`] and [`Self::recv`], resolving it now (so
    /// errors show here). Receives then return only datagrams from that peer; others are
    /// discarded and counted as `filtered`.
    ///
    /// # Errors
    ///
    /// As [`Self::send_to`]'s resolution.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the peer is set only when this returns `Ok`.
    pub async fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        each_addr(addr, |addr| async move {
            self.route_to(addr).await?;
            *lock(&self.peer) = Some(addr);
            Ok(())
        })
        .await
    }

    /// Sends to the connected peer.
    ///
    /// # Errors
    ///
    /// `NotConnected` without [`Self::connect`]; otherwise as [`Self::send_to`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::send_to`].
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.check_alive()?;
        self.check_len(buf.len())?;
        let peer = self.peer_addr()?;
        let route = self.route_to(peer).await?;
        self.send_on(&route, buf).await
    }

    /// Receives one datagram from the connected peer into `buf`; see [`Self::recv_from`].
    ///
    /// # Errors
    ///
    /// As [`Self::recv_from`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::recv_from`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).await.map(|(n, _)| n)
    }

    /// Receives one datagram into `buf` and returns its length and sender. A datagram longer
    /// than `buf` is truncated: the rest is discarded (as with `UdpSocket`) and the returned
    /// length is what was copied.
    ///
    /// The sender is the address its socket is bound to when it is an rdma-async socket (it
    /// introduced itself when it resolved us). Other senders are reported by the IP address
    /// in the datagram's header, with the rdma_cm port of their latest request to us, or port
    /// 0 if they made none (multicast senders, for example).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::datagram::RDatagram;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let socket = RDatagram::bind("10.77.0.1:7174").await?;
    ///     // No datagram is longer than the port's MTU.
    ///     let mut buf = vec![0; socket.max_datagram()];
    ///     loop {
    ///         let (len, from) = socket.recv_from(&mut buf).await?;
    ///         socket.send_to(&buf[..len], from).await?; // echo
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// Errors of the device when it can no longer receive.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a datagram is only taken when it is returned.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let mut slots = self.recv.lock().await;
        loop {
            self.fill_or_end(&mut slots).await?;
            if let Some(got) = self.take(&mut slots, buf)? {
                return Ok(got);
            }
        }
    }

    /// Waits until a datagram is ready, or fails once the socket ended (its device was removed),
    /// which no completion would report.
    async fn fill_or_end(&self, slots: &mut RecvSlots) -> io::Result<()> {
        self.check_alive()?;
        let reap = &mut |s: &mut RecvSlots, wc: &WorkCompletion| self.reap_recv(s, wc);
        let fill = self.recv.fill(slots, None, reap);
        // `fill` is cancel safe: what arrived stays ready.
        tokio::select! {
            filled = fill => filled,
            e = self.shared.ended() => Err(e),
        }
    }

    /// Fails once the socket ended (see [`Self::fill_or_end`]).
    fn check_alive(&self) -> io::Result<()> {
        match self.shared.end_error() {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }

    /// Receives a datagram if one is waiting.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when none is (or another task is receiving); otherwise as
    /// [`Self::recv_from`].
    pub fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let mut slots = self.recv.try_lock()?;
        loop {
            if let Some(got) = self.take(&mut slots, buf)? {
                return Ok(got);
            }
            if !self
                .recv
                .try_fill(&mut slots, &mut |s, wc| self.reap_recv(s, wc))?
            {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Waits until a datagram is waiting to be received.
    ///
    /// # Errors
    ///
    /// As [`Self::recv_from`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn readable(&self) -> io::Result<()> {
        let mut slots = self.recv.lock().await;
        self.fill_or_end(&mut slots).await
    }

    /// Waits until a send slot is free (a datagram to a cached route can go at once).
    ///
    /// # Errors
    ///
    /// Errors of polling the completion queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn writable(&self) -> io::Result<()> {
        let mut slots = self.send.lock().await;
        while slots.free.is_empty() {
            self.send
                .reap_next(&mut slots, None, &mut |s, wc| self.reap_send(s, wc))
                .await?;
        }
        Ok(())
    }

    /// Joins the multicast group `group` (IPv4 or IPv6, of the socket's family): datagrams sent
    /// to it are received here, and [`Self::send_to`] can send to it. Like IP multicast with
    /// loopback on, the socket also receives what it sends to a group it joined.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `group` is not a multicast address or of the other family;
    /// `AddrInUse` when already joined; the rdma_cm error when the join fails.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a join that did not complete leaves nothing joined.
    pub async fn join_multicast(&self, group: IpAddr) -> io::Result<()> {
        if lock(&self.groups).contains_key(&group) {
            return Err(already_joined(group));
        }
        let membership = multicast::join(
            self.local,
            group,
            self.resolve_timeout,
            &self.id_options,
            &self.handles,
            &self.qp,
        )
        .await?;
        let mut groups = lock(&self.groups);
        if groups.contains_key(&group) {
            // Another task joined meanwhile.
            drop(groups);
            let _ = membership.leave(&self.qp);
            return Err(already_joined(group));
        }
        groups.insert(group, membership);
        Ok(())
    }

    /// Leaves a group joined with [`Self::join_multicast`]: its datagrams are no longer
    /// received (those already received stay queued).
    ///
    /// # Errors
    ///
    /// `AddrNotAvailable` when the group was not joined; the verbs or rdma_cm error of leaving.
    pub fn leave_multicast(&self, group: IpAddr) -> io::Result<()> {
        let membership = lock(&self.groups).remove(&group).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::AddrNotAvailable,
                format!("the socket has not joined {group}"),
            )
        })?;
        membership.leave(&self.qp)
    }

    /// The cached route to `target`, or to a joined group.
    fn cached_route(&self, target: SocketAddr) -> io::Result<Option<Arc<Route>>> {
        if target.ip().is_multicast() {
            return self.group_route(target.ip()).map(Some);
        }
        Ok(lock(&self.routes)
            .get(&target)
            .and_then(|slot| slot.get().cloned()))
    }

    fn group_route(&self, group: IpAddr) -> io::Result<Arc<Route>> {
        lock(&self.groups)
            .get(&group)
            .map(|m| m.route.clone())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotConnected,
                    format!("join_multicast({group}) before sending to the group"),
                )
            })
    }

    /// Test hook: resolves `target` as a first datagram to it does, and returns the traffic
    /// class of the route rdma_cm reports (the type of service of the socket's id options).
    ///
    /// # Errors
    ///
    /// As [`Self::send_to`]'s resolution.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub async fn __resolve_traffic_class(&self, target: SocketAddr) -> io::Result<u8> {
        let (ud, _) = self.ask_peer(target).await?;
        Ok(ud.ah_attr.traffic_class())
    }

    /// Test hook: a SIDR exchange with `target` in which this socket claims to be bound to
    /// `port` with queue pair `qpn` (a peer can claim anything there); nothing is cached here.
    /// One socket plays many senders this way.
    ///
    /// # Errors
    ///
    /// As [`Self::send_to`]'s resolution.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub async fn __introduce_as(&self, target: SocketAddr, port: u16, qpn: u32) -> io::Result<()> {
        let claim = Hello { port, qpn };
        resolve_peer(
            self.local.ip(),
            target,
            self.resolve_timeout,
            &self.id_options,
            claim,
        )
        .await
        .map(drop)
    }

    /// Test hook: how much the socket remembers about peers.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __peer_tables(&self) -> PeerTables {
        PeerTables {
            routes: lock(&self.routes).len(),
            senders: self.shared.sources().len(),
            address_handles: self.handles.live(),
        }
    }

    /// The route to `target`: cached, or resolved once by whichever sender asks first.
    async fn route_to(&self, target: SocketAddr) -> io::Result<Arc<Route>> {
        if target.ip().is_multicast() {
            return self.group_route(target.ip());
        }
        let slot = lock(&self.routes)
            .get_or_insert_with(target, RouteSlot::default)
            .clone();
        slot.get_or_try_init(|| self.resolve_route(target))
            .await
            .cloned()
    }

    /// The SIDR exchange with `target`, from this socket's address and with its id options.
    async fn ask_peer(&self, target: SocketAddr) -> io::Result<(UdParam, Option<Hello>)> {
        resolve_peer(
            self.local.ip(),
            target,
            self.resolve_timeout,
            &self.id_options,
            self.shared.hello,
        )
        .await
    }

    async fn resolve_route(&self, target: SocketAddr) -> io::Result<Arc<Route>> {
        let (ud, peer_hello) = self.ask_peer(target).await?;
        let ah = self.handles.create(&ud.ah_attr)?;
        match peer_hello {
            // The peer numbers its datagrams to us from now on (it learned us from our request).
            Some(hello) => self
                .shared
                .sources()
                .learn_peer(SocketAddr::new(target.ip(), hello.port), hello.qpn),
            None => self.shared.sources().learn_resolved(target, ud.qp_num),
        }
        Ok(Arc::new(Route::new(
            ah,
            ud.qp_num,
            ud.qkey,
            peer_hello.is_some(),
        )))
    }

    async fn send_on(&self, route: &Arc<Route>, buf: &[u8]) -> io::Result<usize> {
        let mut slots = self.send.lock().await;
        let slot = self
            .send
            .take_free(&mut slots, None, &mut |s, wc| self.reap_send(s, wc))
            .await?;
        self.post_in_slot(&mut slots, slot, route, buf)
    }

    fn post_in_slot(
        &self,
        slots: &mut SendSlots,
        slot: usize,
        route: &Arc<Route>,
        buf: &[u8],
    ) -> io::Result<usize> {
        let offset = slot * self.max_datagram;
        let posted = self.qp.send_buffer().write_at(offset, buf).and_then(|()| {
            self.qp.post_send(&UdSend {
                wr_id: slot as u64,
                offset,
                len: buf.len(),
                ah: &route.ah,
                remote_qpn: route.qpn,
                remote_qkey: route.qkey,
                imm: route.next_imm(self.qp.qp_num()),
            })
        });
        if let Err(e) = posted {
            slots.free.push(slot);
            return Err(e);
        }
        if let Some(hold) = slots.held.get_mut(slot) {
            *hold = Some(route.ah.clone());
        }
        Counters::add(&self.shared.counters.sent, 1);
        Ok(buf.len())
    }

    /// A send completed: its slot is free again (a lost datagram is no error).
    fn reap_send(&self, slots: &mut SendSlots, wc: &WorkCompletion) {
        slots.release(wc.wr_id as usize);
        if !wc.status.is_success() && wc.status != WcStatus::FLUSH {
            tracing::debug!(status = %wc.status.describe(), "datagram send failed");
            Counters::add(&self.shared.counters.send_errors, 1);
        }
    }

    /// Copies out the oldest queued datagram (from the connected peer, if any) and posts its
    /// slot again.
    fn take(
        &self,
        slots: &mut RecvSlots,
        buf: &mut [u8],
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        let peer = *lock(&self.peer);
        while let Some(got) = slots.ready.pop_front() {
            if peer.is_some_and(|p| p != got.from) {
                Counters::add(&self.shared.counters.filtered, 1);
                self.repost(got.slot);
                continue;
            }
            let n = got.len.min(buf.len());
            let copied = self
                .qp
                .recv_buffer()
                .read_at(got.slot * self.slot_len + GRH_LEN, &mut buf[..n]);
            self.repost(got.slot);
            copied?;
            if got.len > n {
                Counters::add(&self.shared.counters.truncated, 1);
            }
            return Ok(Some((n, got.from)));
        }
        Ok(None)
    }

    fn repost(&self, slot: usize) {
        let posted = self
            .qp
            .post_recv(slot as u64, slot * self.slot_len, self.slot_len);
        if let Err(e) = posted {
            tracing::debug!(error = %e, "reposting a datagram receive failed");
            self.recv.error().set(e);
        }
    }

    /// A receive completed: queue its datagram, or count it malformed and post the slot again.
    fn reap_recv(&self, slots: &mut RecvSlots, wc: &WorkCompletion) {
        if wc.status == WcStatus::FLUSH {
            // The queue pair is being destroyed.
            return;
        }
        let slot = wc.wr_id as usize;
        match self.classify(wc) {
            Some(received) => slots.ready.push_back(received),
            None => {
                Counters::add(&self.shared.counters.malformed, 1);
                if slot < self.recv_depth {
                    self.repost(slot);
                }
            }
        }
    }

    /// Checks a receive completion and attributes its datagram; `None` for one to discard.
    fn classify(&self, wc: &WorkCompletion) -> Option<ArrivedDatagram> {
        let slot = wc.wr_id as usize;
        let byte_len = wc.byte_len as usize;
        if !wc.status.is_success() {
            tracing::debug!(status = %wc.status.describe(), "datagram receive failed");
            return None;
        }
        // The device reports the GRH area plus the payload; both must fit the posted slot.
        if slot >= self.recv_depth || !(GRH_LEN..=self.slot_len).contains(&byte_len) {
            return None;
        }
        let mut header = [0u8; GRH_LEN];
        self.qp
            .recv_buffer()
            .read_at(slot * self.slot_len, &mut header)
            .ok()?;
        let addrs = grh::parse(&header)?;
        let multicast = addrs.dst.is_multicast();
        let who = self
            .shared
            .sources()
            .attribute(addrs.src, wc.src_qp, wc.imm_data, multicast);
        Counters::add(&self.shared.counters.dropped, u64::from(who.missed));
        Counters::add(&self.shared.counters.received, 1);
        if !multicast {
            self.learn_reply_route(who.from, who.sequenced, wc, &header);
        }
        Some(ArrivedDatagram {
            slot,
            len: byte_len - GRH_LEN,
            from: who.from,
        })
    }

    /// Caches a route back to the sender of a datagram, from the datagram itself (as
    /// `udaddy`'s server answers), unless one is cached, so replies cost no rdma_cm exchange;
    /// senders that are not bound sockets (C `udaddy` clients) can only be answered this way.
    /// A route forgotten to make room for others is learned again from the next datagram.
    fn learn_reply_route(
        &self,
        from: SocketAddr,
        sequenced: bool,
        wc: &WorkCompletion,
        header: &[u8; GRH_LEN],
    ) {
        let slot = {
            let mut routes = lock(&self.routes);
            // Only sends keep a route recently used: a peek.
            if routes.peek(&from).is_some_and(|slot| slot.initialized()) {
                return;
            }
            routes.get_or_insert_with(from, RouteSlot::default).clone()
        };
        match self.handles.reply_to(wc, header, self.port_num) {
            Ok(ah) => {
                let route = Route::new(ah, wc.src_qp, self.qp.qkey(), sequenced);
                // Fails only when a resolution of the same peer is under way: it wins.
                let _ = slot.set(Arc::new(route));
            }
            Err(e) => tracing::debug!(%from, error = %e, "no reply route from a datagram"),
        }
    }
}

/// The sizes of a socket's peer tables (a test hook).
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerTables {
    /// Cached routes to peers, resolved or being resolved.
    pub routes: usize,
    /// Senders known by their address, and anonymous SIDR ports.
    pub senders: usize,
    /// Live address handles: routes', groups' and those only in-flight sends still hold.
    pub address_handles: usize,
}

fn already_joined(group: IpAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("the socket has already joined {group}"),
    )
}

async fn first_addr<A: ToSocketAddrs>(target: A) -> io::Result<SocketAddr> {
    resolve(target)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| error::invalid_input("no address to send to"))
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
