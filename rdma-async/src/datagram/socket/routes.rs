//! The socket's routes: per peer, resolved by a SIDR exchange on first use or learned from a
//! datagram the peer sent, at most `max_peers` of them; and the multicast groups it joined,
//! each with the route its datagrams go by.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use super::{RDatagram, RouteSlot, lock};
use crate::datagram::hello::Hello;
use crate::datagram::multicast;
use crate::datagram::peers::Route;
use crate::datagram::route_slot::{ReplyPath, note_reply_path};
use crate::datagram::sidr::resolve_peer;
use crate::verbs::{GRH_LEN, UdParam, WorkCompletion};

impl RDatagram {
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
    pub(super) fn cached_route(&self, target: SocketAddr) -> io::Result<Option<Arc<Route>>> {
        if target.ip().is_multicast() {
            return self.group_route(target.ip()).map(Some);
        }
        Ok(lock(&self.routes)
            .get(&target)
            .and_then(|slot| slot.route().cloned()))
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

    /// The route to `target`: cached, or made once by whichever sender asks first, from a
    /// datagram `target` sent us or else by resolving it.
    pub(super) async fn route_to(&self, target: SocketAddr) -> io::Result<Arc<Route>> {
        if target.ip().is_multicast() {
            return self.group_route(target.ip());
        }
        let slot = lock(&self.routes)
            .get_or_insert_with(target, RouteSlot::default)
            .clone();
        slot.get_or_make(
            |path| self.reply_route(target, path),
            || self.resolve_route(target),
        )
        .await
        .cloned()
    }

    /// The route back to `target` that one of its datagrams gave (as `udaddy`'s server
    /// answers): no rdma_cm exchange; senders that are not bound sockets (C `udaddy` clients)
    /// can only be answered this way.
    async fn reply_route(&self, target: SocketAddr, path: ReplyPath) -> io::Result<Arc<Route>> {
        let ah = self
            .handles
            .reply_to(path, self.port_num)
            .await
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot make a route back to {target} from its datagram: {e}"),
                )
            })?;
        Ok(Arc::new(Route::new(
            ah,
            path.wc.src_qp,
            self.qp.qkey(),
            path.sequenced,
        )))
    }

    /// The SIDR exchange with `target`, from this socket's address and with its id options.
    pub(super) async fn ask_peer(
        &self,
        target: SocketAddr,
    ) -> io::Result<(UdParam, Option<Hello>)> {
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

    /// Records the way back to the sender of a datagram, unless a route to it is made, so
    /// that the first send to it makes the route without an rdma_cm exchange (see
    /// [`Self::reply_route`]); nothing here blocks. A route forgotten to make room for others is
    /// learned again from the next datagram.
    pub(super) fn learn_reply_route(
        &self,
        from: SocketAddr,
        sequenced: bool,
        wc: &WorkCompletion,
        header: &[u8; GRH_LEN],
    ) {
        let path = ReplyPath {
            wc: *wc,
            grh: *header,
            sequenced,
        };
        note_reply_path(&mut lock(&self.routes), from, path);
    }
}

fn already_joined(group: IpAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::AddrInUse,
        format!("the socket has already joined {group}"),
    )
}
