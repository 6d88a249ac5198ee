//! Target `private_data`: what a peer puts in the private data of the rdma_cm handshake and how
//! it reaches the application: rsockets connection data in a connect request or accept reply
//! (what `RStream::accept` and `RStream::connect` parse), and the private data and status of an
//! event that ended a step (a rejection's reason), which every error report keeps.

use std::io;
use std::net::SocketAddr;

use rdma_async_sys::rdma_cm_event_type as ev;

use crate::cm::{CmError, event_error};
use crate::proto::{Config, ConnData};
use crate::verbs::CmEvent;

/// The events that can end a handshake step, and one librdmacm does not define.
const KINDS: [u32; 8] = [
    ev::RDMA_CM_EVENT_REJECTED,
    ev::RDMA_CM_EVENT_UNREACHABLE,
    ev::RDMA_CM_EVENT_ADDR_ERROR,
    ev::RDMA_CM_EVENT_ROUTE_ERROR,
    ev::RDMA_CM_EVENT_CONNECT_ERROR,
    ev::RDMA_CM_EVENT_DISCONNECTED,
    ev::RDMA_CM_EVENT_DEVICE_REMOVAL,
    0x7fff_0000,
];

/// `bytes`: one byte choosing the event and the local ring sizes, four of status, then the
/// private data (at most the 196 bytes a reply carries).
pub fn private_data(bytes: &[u8]) {
    let (head, data) = bytes.split_at(bytes.len().min(5));
    let mut head5 = [0u8; 5];
    head5[..head.len()].copy_from_slice(head);
    let data = &data[..data.len().min(196)];
    let kind = KINDS[usize::from(head5[0] % 8)];
    let status = i32::from_le_bytes([head5[1], head5[2], head5[3], head5[4]]);
    let peer: SocketAddr = "10.77.0.2:7471".parse().unwrap();

    // As connection data: the same answer from the decoder and from the connection taking it.
    let config = if head5[0] & 0x80 == 0 {
        Config::new()
    } else {
        Config::new().with_rbuf_size(64).with_rq_size(16)
    };
    let mut conn = super::connection(config);
    match ConnData::decode(data) {
        Ok(d) => conn
            .handle_peer_conn_data(&d)
            .expect("decoded connection data is taken"),
        Err(e) => assert_eq!(io::Error::from(e).kind(), io::ErrorKind::InvalidData),
    }

    // As the private data of an event that ended a step.
    let event = CmEvent {
        kind,
        status,
        private_data: data.to_vec(),
        responder_resources: 0,
        initiator_depth: 0,
        incoming: None,
        ud: None,
    };
    let err = event_error(&event, Some(peer), "connecting");
    let expected = match kind {
        ev::RDMA_CM_EVENT_REJECTED => Some(io::ErrorKind::ConnectionRefused),
        ev::RDMA_CM_EVENT_UNREACHABLE => Some(io::ErrorKind::TimedOut),
        ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
            Some(io::ErrorKind::ConnectionAborted)
        }
        ev::RDMA_CM_EVENT_ADDR_ERROR | ev::RDMA_CM_EVENT_ROUTE_ERROR if status >= 0 => {
            Some(io::ErrorKind::HostUnreachable)
        }
        ev::RDMA_CM_EVENT_CONNECT_ERROR if status >= 0 => Some(io::ErrorKind::ConnectionAborted),
        // A negative errno decides these.
        ev::RDMA_CM_EVENT_ADDR_ERROR
        | ev::RDMA_CM_EVENT_ROUTE_ERROR
        | ev::RDMA_CM_EVENT_CONNECT_ERROR => None,
        _ => Some(io::ErrorKind::Other),
    };
    if let Some(expected) = expected {
        assert_eq!(err.kind(), expected, "{err}");
    }
    assert_ne!(err.kind(), io::ErrorKind::NotFound, "{err}");
    let cm = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<CmError>())
        .expect("a CmError behind the error");
    assert_eq!(cm.private_data(), data);
    assert_eq!(cm.status(), status);
    assert_eq!(cm.peer(), Some(peer));
    assert_eq!(cm.event(), event.name());
    assert!(err.to_string().contains(cm.event()), "{err}");

    // As the private data of a SIDR request or reply.
    super::hello(data);
}
