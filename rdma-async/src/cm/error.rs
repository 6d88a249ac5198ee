//! Connection-management failures: which event, why, and what the peer said.

use std::fmt;
use std::io;
use std::net::SocketAddr;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::reject_reason;
use crate::verbs::CmEvent;

/// IB CM reject reason: no listener for the service id (the peer's port has no listener).
const REJ_INVALID_SERVICE_ID: i32 = 8;
/// IB CM reject reason: the peer application called `rdma_reject`.
const REJ_CONSUMER_DEFINED: i32 = 28;

/// Details of a failed connection-management step, carried inside the `io::Error` the crate
/// returns (get it with `err.get_ref().and_then(|e| e.downcast_ref::<CmError>())`).
#[derive(Debug, Clone)]
pub struct CmError {
    event: &'static str,
    status: i32,
    peer: Option<SocketAddr>,
    private_data: Vec<u8>,
    message: String,
}

impl CmError {
    /// The same failure told in other words (a caller that knows better what it meant).
    pub(crate) fn retold(mut self, message: String) -> Self {
        self.message = message;
        self
    }

    /// The librdmacm event that reported the failure, e.g. `RDMA_CM_EVENT_REJECTED`.
    pub fn event(&self) -> &'static str {
        self.event
    }

    /// The event's status: a negative errno, or for a rejection the transport's reject reason.
    pub fn status(&self) -> i32 {
        self.status
    }

    /// The peer's address, when known.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.peer
    }

    /// Private data the peer attached (to a rejection), possibly zero-padded by the transport.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// Why the server rejected the request, when it said so in rdma-async's reject format (a
    /// server of this crate that could not set up the connection, e.g. "memory registration
    /// of 139264 bytes failed (locked-memory limit RLIMIT_MEMLOCK is 65536 bytes; raise
    /// ulimit -l)"). The format is documented in the repository's `docs/deployment.md`.
    pub fn reject_reason(&self) -> Option<String> {
        if !self.is_consumer_reject() {
            return None;
        }
        reject_reason::decode(&self.private_data).map(|(_, reason)| reason)
    }

    /// Whether the peer application rejected the request (as opposed to no listener).
    pub fn is_consumer_reject(&self) -> bool {
        self.event == "RDMA_CM_EVENT_REJECTED" && self.status == REJ_CONSUMER_DEFINED
    }
}

impl fmt::Display for CmError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}, status {})",
            self.message, self.event, self.status
        )
    }
}

impl std::error::Error for CmError {}

fn errno_text(status: i32) -> String {
    io::Error::from_raw_os_error(status.saturating_neg()).to_string()
}

/// The `io::Error` for an event that ended a handshake step, with the kind a TCP user expects.
pub(crate) fn event_error(event: &CmEvent, peer: Option<SocketAddr>, step: &str) -> io::Error {
    let target = peer.map_or_else(|| "the peer".to_owned(), |p| p.to_string());
    let errno_kind = |default| {
        if event.status < 0 {
            // The status is librdmacm's: a negative errno is expected, but `-i32::MIN` overflows.
            match crate::error::errno_kind(event.status.saturating_neg()) {
                io::ErrorKind::NotFound => io::ErrorKind::AddrNotAvailable,
                kind => kind,
            }
        } else {
            default
        }
    };
    let (kind, message) = match event.kind {
        ev::RDMA_CM_EVENT_ADDR_ERROR => (
            errno_kind(io::ErrorKind::HostUnreachable),
            format!(
                "cannot resolve the RDMA address of {target}: {}",
                errno_text(event.status)
            ),
        ),
        ev::RDMA_CM_EVENT_ROUTE_ERROR => (
            errno_kind(io::ErrorKind::HostUnreachable),
            format!(
                "cannot resolve an RDMA route to {target}: {}",
                errno_text(event.status)
            ),
        ),
        ev::RDMA_CM_EVENT_UNREACHABLE => (
            io::ErrorKind::TimedOut,
            format!("{target} is unreachable: the connection request timed out"),
        ),
        ev::RDMA_CM_EVENT_REJECTED => (
            io::ErrorKind::ConnectionRefused,
            match event.status {
                REJ_INVALID_SERVICE_ID => {
                    format!("connection refused: nothing listens at {target}")
                }
                REJ_CONSUMER_DEFINED => match reject_reason::decode(&event.private_data) {
                    Some((cause, reason)) => format!(
                        "connection refused: the server at {target} {}: {reason}",
                        cause.describe()
                    ),
                    None => format!("connection refused: {target} rejected the request"),
                },
                reason => format!("connection refused by {target} (reject reason {reason})"),
            },
        ),
        ev::RDMA_CM_EVENT_CONNECT_ERROR => (
            errno_kind(io::ErrorKind::ConnectionAborted),
            format!("connection with {target} failed while {step}"),
        ),
        ev::RDMA_CM_EVENT_DISCONNECTED => (
            io::ErrorKind::ConnectionAborted,
            format!("{target} disconnected while {step}"),
        ),
        ev::RDMA_CM_EVENT_DEVICE_REMOVAL => (
            io::ErrorKind::ConnectionAborted,
            "the RDMA device was removed".to_owned(),
        ),
        _ => (
            io::ErrorKind::Other,
            format!("unexpected {} from {target} while {step}", event.name()),
        ),
    };
    io::Error::new(
        kind,
        CmError {
            event: event.name(),
            status: event.status,
            peer,
            private_data: event.private_data.clone(),
            message,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{StickyError, cause};

    fn peer() -> SocketAddr {
        "10.0.0.2:7471".parse().unwrap()
    }

    /// Found by the `private_data` fuzz target: negating the status overflowed (a panic in
    /// debug builds) for `i32::MIN`.
    #[test]
    fn any_event_status_is_an_error_not_a_panic() {
        for kind in [
            ev::RDMA_CM_EVENT_ADDR_ERROR,
            ev::RDMA_CM_EVENT_ROUTE_ERROR,
            ev::RDMA_CM_EVENT_CONNECT_ERROR,
        ] {
            for status in [i32::MIN, i32::MIN + 1, -1, 0, i32::MAX] {
                let event = CmEvent {
                    kind,
                    status,
                    private_data: Vec::new(),
                    responder_resources: 0,
                    initiator_depth: 0,
                    incoming: None,
                    ud: None,
                };
                let err = event_error(&event, Some(peer()), "connecting");
                assert_ne!(err.kind(), io::ErrorKind::NotFound, "{err}");
                assert_eq!(cause::<CmError>(&err).unwrap().status(), status);
            }
        }
    }

    #[test]
    fn a_rejection_with_a_reason_says_the_server_could_not_set_up_the_connection() {
        let why = io::Error::new(io::ErrorKind::OutOfMemory, "out of queue pairs (max_qp 7)");
        let mut private_data = reject_reason::encode(&why);
        private_data.resize(148, 0);
        let event = CmEvent {
            kind: ev::RDMA_CM_EVENT_REJECTED,
            status: 28,
            private_data,
            responder_resources: 0,
            initiator_depth: 0,
            incoming: None,
            ud: None,
        };
        let err = event_error(&event, Some(peer()), "connecting");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
        assert_eq!(
            err.to_string(),
            "connection refused: the server at 10.0.0.2:7471 could not set up the connection: \
             out of queue pairs (max_qp 7) (RDMA_CM_EVENT_REJECTED, status 28)"
        );
        let cm = cause::<CmError>(&err).unwrap();
        assert_eq!(
            cm.reject_reason().as_deref(),
            Some("out of queue pairs (max_qp 7)")
        );
    }

    #[test]
    fn a_rejection_keeps_its_private_data_in_every_report() {
        let event = CmEvent {
            kind: ev::RDMA_CM_EVENT_REJECTED,
            status: 28,
            private_data: b"go away: server full".to_vec(),
            responder_resources: 0,
            initiator_depth: 0,
            incoming: None,
            ud: None,
        };
        let first = event_error(&event, Some(peer()), "connecting");
        let first_text = first.to_string();
        let sticky = StickyError::default();
        assert!(sticky.set(first));
        for _ in 0..2 {
            let again = sticky.report().expect("a failure is recorded");
            assert_eq!(again.kind(), io::ErrorKind::ConnectionRefused);
            assert_eq!(again.to_string(), first_text, "the same message");
            let cm = cause::<CmError>(&again).expect("the CmError behind the report");
            assert!(cm.is_consumer_reject(), "{cm}");
            assert_eq!(cm.private_data(), b"go away: server full");
            let source = std::error::Error::source(again.get_ref().unwrap()).unwrap();
            assert!(
                source.downcast_ref::<CmError>().is_some(),
                "source() is the CmError"
            );
        }
    }
}
