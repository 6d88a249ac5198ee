//! Multicast group membership of a datagram socket.
//!
//! Each group gets its own UDP id, resolved from the socket's address to the group's and joined
//! with `rdma_join_multicast`; the `MULTICAST_JOIN` event carries the group's address handle
//! attributes, Q_Key and queue pair number (0xFFFFFF). librdmacm attaches a queue pair to the
//! group only when it is the joining id's own, so the socket's queue pair (on its bound id) is
//! attached with `ibv_attach_mcast` here, and detached before the group is left.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::address_handles::SocketHandles;
use super::peers::Route;
use super::sidr::{expect, resolve_addr, udp_id};
use crate::cm::event_steps::CmStep;
use crate::cm::{CmEvents, IdOptions};
use crate::error;
use crate::verbs::{CmId, UdQueuePair};

/// A joined group: its id (leaving destroys it) and the route for sending to it.
#[derive(Debug)]
pub(crate) struct Membership {
    id: Arc<CmId>,
    _events: CmEvents,
    pub(crate) route: Arc<Route>,
    group: SocketAddr,
    gid: [u8; 16],
    lid: u16,
}

/// Joins `group` from the socket bound to `local` and attaches its `qp` to it.
pub(crate) async fn join(
    local: SocketAddr,
    group: IpAddr,
    timeout: Duration,
    options: &IdOptions,
    handles: &SocketHandles,
    qp: &UdQueuePair,
) -> io::Result<Membership> {
    if !group.is_multicast() {
        return Err(error::invalid_input(format!(
            "{group} is not a multicast address"
        )));
    }
    if local.is_ipv4() != group.is_ipv4() {
        return Err(error::invalid_input(format!(
            "cannot join {group} from {local}: the address families differ"
        )));
    }
    let group = SocketAddr::new(group, 0);
    let (id, events) = udp_id(options)?;
    resolve_addr(&id, &events, local.ip(), group, timeout).await?;
    id.join_multicast(group)?;
    let event = expect(&events, CmStep::Joining, group).await?;
    let ud = event
        .ud
        .ok_or_else(|| io::Error::other(format!("joining {group} reported no address handle")))?;
    let ah = handles.create(&ud.ah_attr)?;
    let (gid, lid) = (ud.ah_attr.dgid(), ud.ah_attr.dlid());
    if let Err(e) = qp.attach_mcast(gid, lid) {
        let _ = id.leave_multicast(group);
        return Err(e);
    }
    tracing::debug!(%group, qkey = ud.qkey, "joined multicast group");
    Ok(Membership {
        id,
        _events: events,
        // Its datagrams name our bound port, so members can answer with `send_to(from)`.
        route: Arc::new(Route::to_group(ah, ud.qp_num, ud.qkey, local.port())),
        group,
        gid,
        lid,
    })
}

impl Membership {
    /// Detaches `qp` and leaves the group.
    pub(crate) fn leave(self, qp: &UdQueuePair) -> io::Result<()> {
        let detached = qp.detach_mcast(self.gid, self.lid);
        let left = self.id.leave_multicast(self.group);
        tracing::debug!(group = %self.group, "left multicast group");
        detached.and(left)
    }
}
