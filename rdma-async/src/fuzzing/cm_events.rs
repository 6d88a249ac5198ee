//! Target `cm_events`: rdma_cm events in any order into the decisions of `cm/event_steps.rs`
//! ([`CmStep::on_event`] for each step of a handshake, [`LinkState`] for an established
//! connection), walked as the handshake futures and `CmLink` walk them: a client (address,
//! route, connect), a server (accept), a SIDR request (address, route, the request) and a
//! multicast join (address, join), each followed, once established, by the connection's link;
//! or a link alone. The events are every kind rdma_cm has and unknown ones, duplicates, events
//! of a step already passed, any status (`i32::MIN` and `i32::MAX` among them) and private data
//! of any length; on the link, local disconnects and device events that break the queue pair
//! come in between.
//!
//! Checked, besides "no panic":
//! - only the wanted event of the current step ends it, and the walk goes on to the next step;
//!   only `ADDR_CHANGE` and `TIMEWAIT_EXIT` are ignored (as documented at `CmStep::on_event`);
//!   every other event ends the handshake with an `io::Error` whose message names the event
//!   and the step, whose `CmError` keeps the event, status and private data, and whose kind is
//!   the documented one for the event (`Other` only for events no step expects, with the
//!   event named);
//! - the handshake ends once (established or failed), and after it failed nothing is taken
//!   from the channel: no later event revives it;
//! - on a link, `rdma_disconnect` is called at most once whatever comes (the first local
//!   disconnect, peer disconnect, device removal or device event); closed stays closed, a
//!   removal stays a removal; the peer is said to have closed only when its `DISCONNECTED`
//!   came before any disconnect of ours; events other than `DISCONNECTED` and
//!   `DEVICE_REMOVAL` change nothing; and the error for using the closed link names its cause
//!   with the kind documented for it.

use std::io;
use std::net::SocketAddr;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::input::Input;
use crate::cm::CmError;
use crate::cm::event_steps::{CmStep, LinkEvent, LinkState, StepOutcome};
use crate::error::cause;
use crate::verbs::CmEvent;

/// At most this many events of an input are fed (a bigger input is the same run).
const MAX_EVENTS: usize = 256;

/// The walks of the handshakes, in the order their futures take the steps.
const WALKS: [&[CmStep]; 5] = [
    &[
        CmStep::ResolvingAddr,
        CmStep::ResolvingRoute,
        CmStep::Connecting,
    ],
    &[CmStep::Accepting],
    &[
        CmStep::ResolvingAddr,
        CmStep::ResolvingRoute,
        CmStep::AskingForQp,
    ],
    &[CmStep::ResolvingAddr, CmStep::Joining],
    // A link alone.
    &[],
];

/// Statuses worth meeting often; others come whole from the input.
const STATUSES: [i32; 7] = [0, -110, -111, -19, 8, 28, i32::MIN];

/// What the input does next on a link, besides an event.
enum Action {
    Event(CmEvent),
    /// `CmLink::disconnect` (a close, a drop).
    LocalDisconnect,
    /// A device event breaks the queue pair (`LinkOwner::abort`).
    Broken,
}

/// The next event: its kind (every rdma_cm kind, or an unknown one), its status and its
/// private data (up to 255 bytes).
fn event(input: &mut Input<'_>) -> CmEvent {
    let k = input.byte();
    let kind = match k {
        0..=15 => u32::from(k),
        16..=239 => u32::from(k % 16),
        _ => u32::from(k) << 20,
    };
    let s = input.byte();
    let status = match usize::from(s) {
        i if i < STATUSES.len() => STATUSES[i],
        i if i < 16 => i32::from_le_bytes([input.byte(), input.byte(), input.byte(), input.byte()]),
        _ => 0,
    };
    let len = usize::from(input.byte() % 4) * usize::from(input.byte());
    let private_data = input.take(len).to_vec();
    CmEvent {
        kind,
        status,
        private_data,
        responder_resources: 0,
        initiator_depth: 0,
        incoming: None,
        ud: None,
    }
}

fn peer() -> SocketAddr {
    "10.9.0.2:7471".parse().unwrap()
}

/// One run: a walk chosen by the first byte, then events (and, on the link, local disconnects
/// and device events).
pub fn cm_events(bytes: &[u8]) {
    let mut input = Input(bytes);
    let choice = input.byte();
    let walk = WALKS[usize::from(choice) % WALKS.len()];
    // Some handshakes run with an unknown peer (a listener's resolve has none yet).
    let peer = (choice & 0x80 == 0).then(peer);
    let mut fed = 0;
    let mut at = 0;
    while at < walk.len() {
        if input.is_empty() || fed == MAX_EVENTS {
            return;
        }
        let step = walk[at];
        let event = event(&mut input);
        fed += 1;
        match step.on_event(&event, peer) {
            StepOutcome::Done => {
                assert_eq!(
                    event.kind,
                    step.wanted(),
                    "{step:?} ended by {}",
                    event.name()
                );
                at += 1;
            }
            StepOutcome::Ignored => assert!(
                event.kind == ev::RDMA_CM_EVENT_ADDR_CHANGE
                    || event.kind == ev::RDMA_CM_EVENT_TIMEWAIT_EXIT,
                "{step:?} ignored {}",
                event.name()
            ),
            StepOutcome::Failed(err) => {
                assert_ne!(
                    event.kind,
                    step.wanted(),
                    "{step:?} failed on its own event"
                );
                check_failure(step, &event, peer, &err);
                // The handshake's future returns here: nothing more is read, whatever the
                // input still holds.
                return;
            }
        }
    }
    link(&mut input, fed);
}

/// The error of a step that `event` failed: named, keeping the event, with its documented
/// kind.
fn check_failure(step: CmStep, event: &CmEvent, peer: Option<SocketAddr>, err: &io::Error) {
    let text = err.to_string();
    assert!(
        text.contains(event.name()),
        "{step:?}: the error for {} does not name it: {text}",
        event.name()
    );
    let cm = cause::<CmError>(err).expect("a CmError inside a step's failure");
    assert_eq!(cm.event(), event.name());
    assert_eq!(cm.status(), event.status);
    assert_eq!(cm.private_data(), &event.private_data[..]);
    assert_eq!(cm.peer(), peer);
    let errno = |default: io::ErrorKind| {
        if event.status < 0 {
            // An errno's own kind, but never `NotFound`: that means "no RDMA device".
            assert_ne!(err.kind(), io::ErrorKind::NotFound, "{text}");
        } else {
            assert_eq!(err.kind(), default, "{text}");
        }
    };
    match event.kind {
        ev::RDMA_CM_EVENT_ADDR_ERROR | ev::RDMA_CM_EVENT_ROUTE_ERROR => {
            errno(io::ErrorKind::HostUnreachable);
        }
        ev::RDMA_CM_EVENT_CONNECT_ERROR => errno(io::ErrorKind::ConnectionAborted),
        ev::RDMA_CM_EVENT_UNREACHABLE => assert_eq!(err.kind(), io::ErrorKind::TimedOut),
        ev::RDMA_CM_EVENT_REJECTED => assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused),
        ev::RDMA_CM_EVENT_DISCONNECTED | ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
            assert_eq!(err.kind(), io::ErrorKind::ConnectionAborted, "{text}");
        }
        _ => {
            assert_eq!(err.kind(), io::ErrorKind::Other, "{text}");
            assert!(
                text.contains(step.doing()),
                "{step:?}: the error does not say what failed: {text}"
            );
        }
    }
}

/// The established connection's link, under the rest of the input.
fn link(input: &mut Input<'_>, mut fed: usize) {
    let mut state = LinkState::default();
    let mut disconnects = 0;
    // Whether any disconnect of ours (asked, or forced by a removal or device event) came
    // before the peer's DISCONNECTED.
    let mut ours_first = false;
    while !input.is_empty() && fed < MAX_EVENTS {
        fed += 1;
        let action = match input.byte() % 8 {
            0 => Action::LocalDisconnect,
            1 => Action::Broken,
            _ => Action::Event(event(input)),
        };
        let before = state.clone();
        match action {
            Action::LocalDisconnect => {
                if state.start_disconnect() {
                    disconnects += 1;
                    ours_first |= !state.peer_initiated;
                }
                assert!(state.local_disconnect);
            }
            Action::Broken => {
                if state.broken("IBV_EVENT_QP_FATAL".to_owned()) {
                    disconnects += 1;
                    ours_first |= !state.peer_initiated;
                }
                assert!(state.disconnected && state.is_device_removed());
            }
            Action::Event(event) => {
                let outcome = state.on_event(event.kind);
                match (event.kind, outcome) {
                    (ev::RDMA_CM_EVENT_DISCONNECTED, LinkEvent::PeerDisconnected) => {
                        assert!(!before.local_disconnect, "a peer disconnect after ours");
                        assert!(!ours_first);
                        disconnects += 1;
                        assert!(state.peer_initiated);
                    }
                    (ev::RDMA_CM_EVENT_DISCONNECTED, LinkEvent::Disconnected) => {
                        assert!(before.local_disconnect, "our disconnect was never asked");
                    }
                    (ev::RDMA_CM_EVENT_DEVICE_REMOVAL, LinkEvent::DeviceRemoved { disconnect }) => {
                        assert_eq!(disconnect, !before.local_disconnect);
                        if disconnect {
                            disconnects += 1;
                            ours_first |= !state.peer_initiated;
                        }
                        assert!(state.device_removed);
                    }
                    (kind, LinkEvent::Ignored)
                        if kind != ev::RDMA_CM_EVENT_DISCONNECTED
                            && kind != ev::RDMA_CM_EVENT_DEVICE_REMOVAL =>
                    {
                        assert_eq!(state, before, "{} changed the link", event.name());
                    }
                    (_, outcome) => panic!("{} on a link gave {outcome:?}", event.name()),
                }
                if event.kind == ev::RDMA_CM_EVENT_DISCONNECTED {
                    assert!(state.disconnected);
                }
            }
        }
        assert!(
            disconnects <= 1,
            "rdma_disconnect called {disconnects} times"
        );
        assert_eq!(disconnects, usize::from(state.local_disconnect));
        // What was true stays true.
        for (was, is, what) in [
            (before.disconnected, state.disconnected, "closed"),
            (before.device_removed, state.device_removed, "removed"),
            (
                before.peer_initiated,
                state.peer_initiated,
                "closed by the peer",
            ),
            (
                before.local_disconnect,
                state.local_disconnect,
                "disconnecting",
            ),
            (
                before.broken_by.is_some(),
                state.broken_by.is_some(),
                "broken",
            ),
        ] {
            assert!(!was || is, "the link stopped being {what}");
        }
        assert!(!state.peer_initiated || !ours_first);
        check_closed_error(&state);
    }
}

/// The error for using the link names its cause with the documented kind.
fn check_closed_error(state: &LinkState) {
    for writing in [false, true] {
        let err = state.closed_error(peer(), writing);
        let expected = if state.is_device_removed() {
            io::ErrorKind::ConnectionAborted
        } else if writing {
            io::ErrorKind::BrokenPipe
        } else if state.peer_initiated {
            io::ErrorKind::ConnectionReset
        } else {
            io::ErrorKind::NotConnected
        };
        assert_eq!(err.kind(), expected, "{state:?}: {err}");
        assert!(err.to_string().contains("10.9.0.2:7471"), "{err}");
    }
}
