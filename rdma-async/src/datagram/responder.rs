//! Answering peers that ask for our queue pair: the SIDR requests that arrive on the bound id.
//!
//! Peers resolve a datagram socket before their first datagram and need an answer whether or
//! not anyone is reading, as ARP needs one from a host, so a task of the socket's own answers
//! them (the socket aborts it when dropped). Before answering, it records who asked: the
//! answer lets the peer send, and its datagrams must find their sender known.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio::sync::Notify;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::hello::Hello;
use super::peers::Sources;
use super::stats::Counters;
use crate::cm::CmEvents;
use crate::error::StickyError;
use crate::verbs::{CmEvent, CmId};

/// What a socket shares with its responder task.
#[derive(Debug)]
pub(crate) struct ResponderShared {
    sources: Mutex<Sources>,
    pub(crate) counters: Counters,
    /// How we introduce ourselves: bound port and queue pair number.
    pub(crate) hello: Hello,
    /// Why the socket can no longer work (its device was removed, or its rdma_cm channel
    /// failed): the responder records it before it ends, so no operation waits for ever.
    ended: StickyError,
    end_signal: Notify,
}

impl ResponderShared {
    /// Shared state of a socket that introduces itself with `hello` and remembers at most
    /// `max_peers` senders.
    pub(crate) fn new(hello: Hello, max_peers: usize) -> Self {
        ResponderShared {
            sources: Mutex::new(Sources::new(max_peers)),
            counters: Counters::default(),
            hello,
            ended: StickyError::default(),
            end_signal: Notify::new(),
        }
    }

    /// Records why the socket ended and wakes every operation waiting in [`Self::ended`].
    fn end(&self, err: io::Error) {
        self.ended.set(err);
        self.end_signal.notify_waiters();
    }

    /// The error every operation reports once the socket ended, if it has.
    pub(crate) fn end_error(&self) -> Option<io::Error> {
        self.ended.report()
    }

    /// Waits until the socket ends; returns why.
    ///
    /// Cancel safety: cancel safe.
    pub(crate) async fn ended(&self) -> io::Error {
        loop {
            // Enabled before the check, so an `end` between the two is not missed.
            let notified = self.end_signal.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.end_error() {
                return e;
            }
            notified.await;
        }
    }

    pub(crate) fn sources(&self) -> MutexGuard<'_, Sources> {
        // Every update of the tables is a single insert: a panic elsewhere cannot leave them
        // half-changed.
        self.sources.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// Answers SIDR requests on `events` (the bound id's channel) until the channel fails or the
/// device goes away.
pub(crate) fn answer_requests(
    events: CmEvents,
    shared: Arc<ResponderShared>,
    local: SocketAddr,
) -> impl std::future::Future<Output = ()> + Send + 'static {
    // Dropped with the task, when its runtime is shut down (or the socket aborts it): the
    // socket's operations then end with a clear error instead of waiting for the responder.
    // Made here, not at the task's first poll, so a task dropped before it ever ran (its
    // runtime shut down at once) records the end too.
    let ended = EndOnDrop {
        shared: shared.clone(),
        local,
    };
    answer_loop(events, shared, local, ended)
}

async fn answer_loop(
    events: CmEvents,
    shared: Arc<ResponderShared>,
    local: SocketAddr,
    _ended: EndOnDrop,
) {
    loop {
        let mut event = match events.next().await {
            Ok(event) => event,
            Err(e) => {
                tracing::warn!(%local, error = %e, "datagram socket: reading rdma_cm events failed");
                shared.end(e);
                return;
            }
        };
        match event.kind {
            ev::RDMA_CM_EVENT_CONNECT_REQUEST => answer(&mut event, &events, &shared, local),
            ev::RDMA_CM_EVENT_DEVICE_REMOVAL => {
                tracing::warn!(%local, "datagram socket: the RDMA device was removed");
                shared.end(io::Error::new(
                    io::ErrorKind::NetworkDown,
                    format!("the RDMA device of datagram socket {local} was removed"),
                ));
                return;
            }
            _ => tracing::debug!(
                event = event.name(),
                "ignoring rdma_cm event on a datagram socket"
            ),
        }
    }
}

/// Records, when the responder task is dropped, that the socket can no longer work (unless it
/// ended already for another reason).
struct EndOnDrop {
    shared: Arc<ResponderShared>,
    local: SocketAddr,
}

impl Drop for EndOnDrop {
    fn drop(&mut self) {
        self.shared.end(io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "datagram socket {} ended: the Tokio runtime that ran it (where it was bound) was \
                 shut down; bind sockets on a runtime that outlives them",
                self.local
            ),
        ));
    }
}

fn answer(event: &mut CmEvent, events: &CmEvents, shared: &ResponderShared, local: SocketAddr) {
    let Some(incoming) = event.incoming.take() else {
        return;
    };
    // Dropping the request's id after the answer is fine: UD requests have no further events.
    let id = CmId::adopt_incoming(incoming, events.channel().clone());
    let peer = match id.peer_addr() {
        Ok(peer) => peer,
        Err(e) => {
            tracing::debug!(%local, error = %e, "SIDR request without a peer address: ignored");
            return;
        }
    };
    match Hello::decode(&event.private_data) {
        Some(hello) => shared
            .sources()
            .learn_peer(SocketAddr::new(peer.ip(), hello.port), hello.qpn),
        None => shared.sources().learn_anonymous(peer),
    }
    if let Err(e) = id.accept_ud(shared.hello.qpn, &shared.hello.encode()) {
        tracing::debug!(%local, %peer, error = %e, "answering a SIDR request failed");
    } else {
        tracing::debug!(%local, %peer, "answered a SIDR request");
    }
}
