//! Reaching a datagram peer through rdma_cm: address and route resolution, then a SIDR
//! exchange (`rdma_connect` on a UDP id) whose reply names the peer's queue pair and Q_Key.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::hello::Hello;
use crate::cm::event_steps::CmStep;
use crate::cm::handshake;
use crate::cm::{CmError, CmEvents, IdOptions};
use crate::error;
use crate::verbs::{CmEvent, CmId, PortSpace, RawConnParam, UdParam};

/// A fresh UDP id on its own event channel, with the socket's id options.
pub(crate) fn udp_id(options: &IdOptions) -> io::Result<(Arc<CmId>, CmEvents)> {
    handshake::new_id(PortSpace::Udp, options)
}

/// Waits for `wanted` as a connection step does ([`crate::cm`]'s error kinds), except that a
/// SIDR failure (`UNREACHABLE`) is `ConnectionRefused` when the peer answered (nothing is
/// bound there) and stays `TimedOut` when it did not answer.
pub(crate) async fn expect(
    events: &CmEvents,
    step: CmStep,
    peer: SocketAddr,
) -> io::Result<CmEvent> {
    handshake::expect(events, step, Some(peer))
        .await
        .map_err(|e| sidr_error(e, peer))
}

fn sidr_error(e: io::Error, peer: SocketAddr) -> io::Error {
    let Some(cm) = e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<CmError>())
    else {
        return e;
    };
    if cm.event() != "RDMA_CM_EVENT_UNREACHABLE" {
        return e;
    }
    let (kind, message) = if cm.status() > 0 {
        (
            io::ErrorKind::ConnectionRefused,
            format!(
                "no datagram socket is bound at {peer} (SIDR reply status {})",
                cm.status()
            ),
        )
    } else {
        (
            io::ErrorKind::TimedOut,
            format!("{peer} did not answer the SIDR request"),
        )
    };
    io::Error::new(kind, cm.clone().retold(message))
}

/// Resolves `dst` from `local` and waits for the id to have an address (and a device).
pub(crate) async fn resolve_addr(
    id: &CmId,
    events: &CmEvents,
    local: IpAddr,
    dst: SocketAddr,
    timeout: Duration,
) -> io::Result<()> {
    id.resolve_addr(
        Some(SocketAddr::new(local, 0)),
        dst,
        handshake::timeout_ms(timeout),
    )?;
    expect(events, CmStep::ResolvingAddr, dst).await?;
    Ok(())
}

/// Asks the datagram socket at `dst` for its queue pair, introducing ourselves with `hello`.
/// Returns the route rdma_cm reported and the peer's own hello, if it is an rdma-async socket.
pub(crate) async fn resolve_peer(
    local: IpAddr,
    dst: SocketAddr,
    timeout: Duration,
    options: &IdOptions,
    hello: Hello,
) -> io::Result<(UdParam, Option<Hello>)> {
    if local.is_ipv4() != dst.is_ipv4() {
        return Err(error::invalid_input(format!(
            "cannot send from {local} to {dst}: the address families differ"
        )));
    }
    let (id, events) = udp_id(options)?;
    let bind = Some(SocketAddr::new(local, 0));
    handshake::resolve_route(&id, &events, bind, dst, timeout)
        .await
        .map_err(|e| sidr_error(e, dst))?;
    id.connect(&RawConnParam {
        private_data: hello.encode().to_vec(),
        ..RawConnParam::default()
    })?;
    let event = expect(&events, CmStep::AskingForQp, dst).await?;
    let ud = event
        .ud
        .ok_or_else(|| io::Error::other(format!("the SIDR reply of {dst} carried no route")))?;
    tracing::debug!(%dst, qpn = ud.qp_num, "datagram peer resolved");
    Ok((ud, Hello::decode(&event.private_data)))
}
