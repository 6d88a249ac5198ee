//! What an rdma_cm event does, decided without an id or a device: to a step of a handshake
//! ([`CmStep::on_event`]: the event ends the step, is ignored, or fails it with the error the
//! handshake returns) and to an established connection ([`LinkState::on_event`]: what it
//! records and whether to disconnect). The futures in `handshake` and [`CmLink`](super::link::CmLink)
//! carry these decisions out; the fuzz target `cm_events` feeds them every event in any order.

use std::io;
use std::net::SocketAddr;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::error::event_error;
use crate::verbs::CmEvent;

/// A step of a handshake: the rdma_cm operation under way, which one event ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmStep {
    /// `rdma_resolve_addr`: ends with `ADDR_RESOLVED`.
    ResolvingAddr,
    /// `rdma_resolve_route`: ends with `ROUTE_RESOLVED`.
    ResolvingRoute,
    /// `rdma_connect` of a connection: ends with `ESTABLISHED`.
    Connecting,
    /// `rdma_accept`: ends with `ESTABLISHED` (the peer's RTU).
    Accepting,
    /// `rdma_connect` of a datagram id (a SIDR request): ends with `ESTABLISHED`.
    AskingForQp,
    /// `rdma_join_multicast`: ends with `MULTICAST_JOIN`.
    Joining,
}

impl CmStep {
    /// The event that ends the step.
    pub(crate) const fn wanted(self) -> u32 {
        match self {
            CmStep::ResolvingAddr => ev::RDMA_CM_EVENT_ADDR_RESOLVED,
            CmStep::ResolvingRoute => ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
            CmStep::Connecting | CmStep::Accepting | CmStep::AskingForQp => {
                ev::RDMA_CM_EVENT_ESTABLISHED
            }
            CmStep::Joining => ev::RDMA_CM_EVENT_MULTICAST_JOIN,
        }
    }

    /// What the step is doing, for error messages ("... while connecting").
    pub(crate) const fn doing(self) -> &'static str {
        match self {
            CmStep::ResolvingAddr => "resolving the address",
            CmStep::ResolvingRoute => "resolving the route",
            CmStep::Connecting => "connecting",
            CmStep::Accepting => "accepting",
            CmStep::AskingForQp => "asking for its queue pair",
            CmStep::Joining => "joining",
        }
    }

    /// What `event` does to this step, with `peer` (when known) for the error: the wanted
    /// event ends it; `ADDR_CHANGE` and `TIMEWAIT_EXIT` only inform (an address moved, an
    /// earlier connection's id left its time-wait) and are ignored; any other event fails the
    /// step, with the `io::Error` of [`event_error`] (its kind a TCP user expects, its
    /// [`CmError`](super::CmError) naming the event, status and private data).
    pub(crate) fn on_event(self, event: &CmEvent, peer: Option<SocketAddr>) -> StepOutcome {
        match event.kind {
            k if k == self.wanted() => StepOutcome::Done,
            ev::RDMA_CM_EVENT_ADDR_CHANGE | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => StepOutcome::Ignored,
            _ => StepOutcome::Failed(event_error(event, peer, self.doing())),
        }
    }
}

/// What an event did to a handshake step.
#[derive(Debug)]
pub(crate) enum StepOutcome {
    /// The step is over: its operation succeeded.
    Done,
    /// An informational event: the step goes on waiting.
    Ignored,
    /// The handshake ends with this error.
    Failed(io::Error),
}

/// State of an established connection as rdma_cm (and the device event reader) reported it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct LinkState {
    /// We asked to disconnect (or must have: `rdma_disconnect` was called once).
    pub(crate) local_disconnect: bool,
    /// `RDMA_CM_EVENT_DISCONNECTED` arrived (after a local or a peer disconnect), or the
    /// device went away.
    pub(crate) disconnected: bool,
    /// The peer disconnected first.
    pub(crate) peer_initiated: bool,
    /// The device went away.
    pub(crate) device_removed: bool,
    /// A device event broke the queue pair (`IBV_EVENT_QP_FATAL`, ...): what it said.
    pub(crate) broken_by: Option<String>,
}

/// What an event on an established connection meant, and what the link does about it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LinkEvent {
    /// `DISCONNECTED` before we asked: the peer closed. The link calls `rdma_disconnect`,
    /// which completes the exchange and flushes our queue pair.
    PeerDisconnected,
    /// `DISCONNECTED` after we asked (the answer to ours), or a repeated one.
    Disconnected,
    /// `DEVICE_REMOVAL`. With `disconnect`, the link calls `rdma_disconnect` to move the queue
    /// pair to the error state (every pending work request completes flushed).
    DeviceRemoved { disconnect: bool },
    /// Any other event: nothing changes.
    Ignored,
}

impl LinkState {
    /// Records `kind`, an event read from the connection's channel.
    pub(crate) fn on_event(&mut self, kind: u32) -> LinkEvent {
        match kind {
            ev::RDMA_CM_EVENT_DISCONNECTED => {
                self.disconnected = true;
                if self.local_disconnect {
                    LinkEvent::Disconnected
                } else {
                    self.peer_initiated = true;
                    self.local_disconnect = true;
                    LinkEvent::PeerDisconnected
                }
            }
            ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                self.device_removed = true;
                self.disconnected = true;
                LinkEvent::DeviceRemoved {
                    disconnect: self.start_disconnect(),
                }
            }
            _ => LinkEvent::Ignored,
        }
    }

    /// We disconnect (idempotent). Returns whether `rdma_disconnect` is to be called now:
    /// only the first time.
    pub(crate) fn start_disconnect(&mut self) -> bool {
        !std::mem::replace(&mut self.local_disconnect, true)
    }

    /// A device event (`what`) broke the queue pair: the connection is over now, as after a
    /// device removal. Returns whether `rdma_disconnect` is to be called now.
    pub(crate) fn broken(&mut self, what: String) -> bool {
        self.broken_by = Some(what);
        self.disconnected = true;
        self.start_disconnect()
    }

    /// Whether the connection is closed or being closed by either side.
    pub(crate) fn is_closed_or_closing(&self) -> bool {
        self.disconnected || self.local_disconnect
    }

    /// Whether the connection ended without an orderly close.
    pub(crate) fn is_device_removed(&self) -> bool {
        self.device_removed || self.broken_by.is_some()
    }

    /// The error for using the connection to `peer` now that it is closed (`writing`: by a
    /// writer), naming the cause: a device event, the device's removal, or which side closed.
    pub(crate) fn closed_error(&self, peer: SocketAddr, writing: bool) -> io::Error {
        let (kind, message) = if let Some(event) = &self.broken_by {
            (
                io::ErrorKind::ConnectionAborted,
                format!("the connection to {peer} was ended by a device event: {event}"),
            )
        } else if self.device_removed {
            (
                io::ErrorKind::ConnectionAborted,
                format!("the RDMA device of the connection to {peer} was removed"),
            )
        } else if writing {
            (
                io::ErrorKind::BrokenPipe,
                format!("connection to {peer} is closed"),
            )
        } else if self.peer_initiated {
            (
                io::ErrorKind::ConnectionReset,
                format!("connection closed by {peer} (RDMA_CM_EVENT_DISCONNECTED)"),
            )
        } else {
            (
                io::ErrorKind::NotConnected,
                format!("the connection to {peer} was disconnected locally"),
            )
        };
        io::Error::new(kind, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cm::CmError;
    use crate::error::cause;

    fn peer() -> SocketAddr {
        "10.0.0.2:7471".parse().unwrap()
    }

    fn event(kind: u32, status: i32) -> CmEvent {
        CmEvent {
            kind,
            status,
            private_data: b"why".to_vec(),
            responder_resources: 0,
            initiator_depth: 0,
            incoming: None,
            ud: None,
        }
    }

    const STEPS: [CmStep; 6] = [
        CmStep::ResolvingAddr,
        CmStep::ResolvingRoute,
        CmStep::Connecting,
        CmStep::Accepting,
        CmStep::AskingForQp,
        CmStep::Joining,
    ];

    #[test]
    fn each_step_ends_with_its_own_event_only() {
        let ends = [
            (CmStep::ResolvingAddr, ev::RDMA_CM_EVENT_ADDR_RESOLVED),
            (CmStep::ResolvingRoute, ev::RDMA_CM_EVENT_ROUTE_RESOLVED),
            (CmStep::Connecting, ev::RDMA_CM_EVENT_ESTABLISHED),
            (CmStep::Accepting, ev::RDMA_CM_EVENT_ESTABLISHED),
            (CmStep::AskingForQp, ev::RDMA_CM_EVENT_ESTABLISHED),
            (CmStep::Joining, ev::RDMA_CM_EVENT_MULTICAST_JOIN),
        ];
        for (step, wanted) in ends {
            for kind in 0..=ev::RDMA_CM_EVENT_TIMEWAIT_EXIT + 1 {
                let outcome = step.on_event(&event(kind, 0), Some(peer()));
                match outcome {
                    StepOutcome::Done => assert_eq!(kind, wanted, "{step:?}"),
                    StepOutcome::Ignored => assert!(
                        kind == ev::RDMA_CM_EVENT_ADDR_CHANGE
                            || kind == ev::RDMA_CM_EVENT_TIMEWAIT_EXIT,
                        "{step:?} ignored event {kind}"
                    ),
                    StepOutcome::Failed(_) => assert_ne!(kind, wanted, "{step:?}"),
                }
            }
        }
    }

    #[test]
    fn an_unexpected_event_fails_the_step_naming_it() {
        for step in STEPS {
            let kind = if step == CmStep::ResolvingAddr {
                ev::RDMA_CM_EVENT_ROUTE_RESOLVED
            } else {
                ev::RDMA_CM_EVENT_ADDR_RESOLVED
            };
            let StepOutcome::Failed(err) = step.on_event(&event(kind, i32::MIN), Some(peer()))
            else {
                panic!("{step:?} took an unexpected event");
            };
            let text = err.to_string();
            assert!(text.contains(event(kind, 0).name()), "{text}");
            assert!(text.contains(step.doing()), "{text}");
            let cm = cause::<CmError>(&err).expect("a CmError inside");
            assert_eq!(cm.status(), i32::MIN);
            assert_eq!(cm.private_data(), b"why");
        }
    }

    #[test]
    fn a_rejection_while_connecting_is_connection_refused() {
        let StepOutcome::Failed(err) =
            CmStep::Connecting.on_event(&event(ev::RDMA_CM_EVENT_REJECTED, 8), Some(peer()))
        else {
            panic!("a rejection did not fail the connect");
        };
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    }

    #[test]
    fn a_peer_disconnect_disconnects_once_and_reads_as_reset() {
        let mut link = LinkState::default();
        assert_eq!(
            link.on_event(ev::RDMA_CM_EVENT_DISCONNECTED),
            LinkEvent::PeerDisconnected
        );
        assert_eq!(
            link.on_event(ev::RDMA_CM_EVENT_DISCONNECTED),
            LinkEvent::Disconnected
        );
        assert!(
            !link.start_disconnect(),
            "rdma_disconnect was called already"
        );
        assert_eq!(
            link.closed_error(peer(), false).kind(),
            io::ErrorKind::ConnectionReset
        );
        assert_eq!(
            link.closed_error(peer(), true).kind(),
            io::ErrorKind::BrokenPipe
        );
    }

    #[test]
    fn a_local_disconnect_answered_is_not_connected_for_a_reader() {
        let mut link = LinkState::default();
        assert!(link.start_disconnect());
        assert!(link.is_closed_or_closing() && !link.disconnected);
        assert_eq!(
            link.on_event(ev::RDMA_CM_EVENT_DISCONNECTED),
            LinkEvent::Disconnected
        );
        assert!(!link.peer_initiated);
        assert_eq!(
            link.closed_error(peer(), false).kind(),
            io::ErrorKind::NotConnected
        );
    }

    #[test]
    fn a_device_removal_disconnects_unless_done_and_is_aborted() {
        let mut link = LinkState::default();
        assert_eq!(
            link.on_event(ev::RDMA_CM_EVENT_DEVICE_REMOVAL),
            LinkEvent::DeviceRemoved { disconnect: true }
        );
        assert_eq!(
            link.on_event(ev::RDMA_CM_EVENT_DEVICE_REMOVAL),
            LinkEvent::DeviceRemoved { disconnect: false }
        );
        assert!(link.is_device_removed() && link.disconnected);
        for writing in [false, true] {
            assert_eq!(
                link.closed_error(peer(), writing).kind(),
                io::ErrorKind::ConnectionAborted
            );
        }
    }

    #[test]
    fn a_broken_queue_pair_ends_the_link_and_is_named() {
        let mut link = LinkState::default();
        assert!(link.broken("IBV_EVENT_QP_FATAL".to_owned()));
        assert!(link.disconnected && link.is_device_removed());
        let err = link.closed_error(peer(), false);
        assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted);
        assert!(err.to_string().contains("IBV_EVENT_QP_FATAL"), "{err}");
    }

    #[test]
    fn informational_events_change_nothing_on_a_link() {
        for kind in [
            ev::RDMA_CM_EVENT_ADDR_CHANGE,
            ev::RDMA_CM_EVENT_TIMEWAIT_EXIT,
            ev::RDMA_CM_EVENT_ESTABLISHED,
            ev::RDMA_CM_EVENT_CONNECT_ERROR,
            0x7fff_0000,
        ] {
            let mut link = LinkState::default();
            assert_eq!(link.on_event(kind), LinkEvent::Ignored);
            assert_eq!(link, LinkState::default());
        }
    }
}
