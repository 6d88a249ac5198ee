//! A connected rdma_cm id and what its event channel says about the connection.

use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use std::task::{Context, Poll, ready};

use super::event_steps::{LinkEvent, LinkState};
use super::events::CmEvents;
use crate::device::DeviceEvent;
use crate::device::events::{QueuePairOwner, Registration};
use crate::reactor::FdWaiter;
use crate::sync::{Lock, LockGuard};
use crate::verbs::CmId;

/// An established connection's id and event channel.
///
/// Any number of tasks may wait on it: events are read and recorded under one lock, and every
/// waiter checks the record after reading finds the channel empty, so none misses a disconnect.
#[derive(Debug)]
pub(crate) struct CmLink {
    id: Arc<CmId>,
    events: CmEvents,
    /// Shared with the device event reader, which may end the connection (see
    /// [`crate::device::events()`]).
    state: Arc<Lock<LinkState>>,
    /// The link's entry among the queue pair owners the device event reader knows.
    registered: Option<Registration>,
    peer_private_data: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
    /// The connection's span (peer, local address, queue pair number): the parent of every
    /// event about this connection.
    span: tracing::Span,
}

impl CmLink {
    pub(crate) fn new(
        id: Arc<CmId>,
        events: CmEvents,
        peer_private_data: Vec<u8>,
        peer: SocketAddr,
    ) -> io::Result<Self> {
        let local = id.local_addr()?;
        let span = tracing::debug_span!("rdma_conn", %peer, %local, qp = tracing::field::Empty);
        let state = Arc::new(Lock::new(LinkState::default()));
        let mut registered = None;
        if let Some(qp) = id.qp_num() {
            span.record("qp", qp);
            if let Ok(ctx) = id.verbs() {
                registered = Some(crate::device::events::register_queue_pair(
                    ctx.as_ptr() as usize,
                    qp,
                    Box::new(LinkOwner {
                        state: Arc::downgrade(&state),
                        id: Arc::downgrade(&id),
                        span: span.clone(),
                    }),
                ));
            }
        }
        Ok(CmLink {
            id,
            events,
            state,
            registered,
            peer_private_data,
            peer,
            local,
            span,
        })
    }

    /// The connection's span.
    pub(crate) fn span(&self) -> &tracing::Span {
        &self.span
    }

    fn state(&self) -> LockGuard<'_, LinkState> {
        // A set of flags: nothing a panic could leave half-updated, so nothing to poison.
        self.state.lock()
    }

    pub(crate) fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The connection's queue pair number (0 if the id has none).
    pub(crate) fn qp_num(&self) -> u32 {
        self.id.qp_num().unwrap_or(0)
    }

    pub(crate) fn peer_private_data(&self) -> &[u8] {
        &self.peer_private_data
    }

    /// The ACK timeout exponent rdma_cm gave the connection's queue pair.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn qp_ack_timeout(&self) -> io::Result<u8> {
        self.id
            .qp_ack_timeout()?
            .ok_or_else(|| io::Error::other("the connection has no queue pair"))
    }

    /// The RNR timer of the connection's queue pair.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn qp_min_rnr_timer(&self) -> io::Result<u8> {
        self.id
            .qp_min_rnr_timer()?
            .ok_or_else(|| io::Error::other("the connection has no queue pair"))
    }

    /// Sets the RNR timer of the connection's queue pair, as the handshake does.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn set_qp_min_rnr_timer(&self, code: u8) -> io::Result<()> {
        self.id.set_qp_min_rnr_timer(code)
    }

    /// Reads every queued event into the state. Returns `WouldBlock` once the channel is empty.
    fn drain_events(&self, state: &mut LinkState) -> io::Result<()> {
        loop {
            let Some(event) = self.events.try_next()? else {
                return Err(io::ErrorKind::WouldBlock.into());
            };
            match state.on_event(event.kind) {
                LinkEvent::PeerDisconnected => {
                    tracing::debug!(parent: &self.span, "peer disconnected");
                    // Completes the exchange and flushes our queue pair, as librdmacm's
                    // examples do on a peer's disconnect.
                    if let Err(e) = self.id.disconnect() {
                        tracing::debug!(parent: &self.span, error = %e, "rdma_disconnect after peer disconnect failed");
                    }
                }
                LinkEvent::Disconnected => {}
                LinkEvent::DeviceRemoved { disconnect } => {
                    tracing::warn!(parent: &self.span, "the RDMA device was removed");
                    // Moves the queue pair to the error state, so every pending work request
                    // completes (flushed) and its waiter learns of the removal.
                    if disconnect && let Err(e) = self.id.disconnect() {
                        tracing::debug!(parent: &self.span, error = %e, "rdma_disconnect after device removal failed");
                    }
                }
                LinkEvent::Ignored => {
                    tracing::debug!(parent: &self.span, event = event.name(), "rdma_cm event on a connection")
                }
            }
        }
    }

    /// Reads the events already queued, without waiting; returns whether rdma_cm reported the
    /// connection closed.
    pub(crate) fn try_disconnected(&self) -> io::Result<bool> {
        Ok(self.poll_state()?.disconnected)
    }

    /// Whether the connection is closed or being closed by either side (no more data can move),
    /// as recorded: without reading the channel (see `CmWatch::try_closed`, which reads it
    /// when the reactor reports it readable).
    pub(crate) fn is_closed_or_closing(&self) -> bool {
        self.state().is_closed_or_closing()
    }

    fn poll_state(&self) -> io::Result<LockGuard<'_, LinkState>> {
        let mut state = self.state();
        match self.drain_events(&mut state) {
            Err(e) if e.kind() != io::ErrorKind::WouldBlock => Err(e),
            _ => Ok(state),
        }
    }

    /// A registration for one more task that waits with [`Self::poll_disconnected`].
    pub(crate) fn waiter(&self) -> FdWaiter {
        self.events.waiter()
    }

    /// Waits until rdma_cm reports the connection closed (`RDMA_CM_EVENT_DISCONNECTED`),
    /// through this task's own `waiter`.
    pub(crate) fn poll_disconnected(
        &self,
        waiter: &FdWaiter,
        cx: &mut Context<'_>,
    ) -> Poll<io::Result<()>> {
        loop {
            // Only the recorded state here: reading the channel is a system call, made only
            // when the reactor says there is something to read.
            if self.state().disconnected {
                return Poll::Ready(Ok(()));
            }
            let mut guard = ready!(waiter.poll_readable(cx))?;
            if let Ok(Err(e)) = guard.try_io(|_| {
                let mut state = self.state();
                self.drain_events(&mut state)
            }) {
                return Poll::Ready(Err(e));
            }
        }
    }

    /// Runs `post` unless the connection is closed or closing, holding the state lock so that a
    /// disconnect (which moves the queue pair to the error state) happens either before (and
    /// `None` is returned) or after the work request is posted, which it then flushes. Some
    /// providers never complete receives posted to a queue pair already in the error state.
    pub(crate) fn while_open<R>(&self, post: impl FnOnce() -> R) -> Option<R> {
        let state = self.state();
        if state.is_closed_or_closing() {
            return None;
        }
        let out = post();
        drop(state);
        Some(out)
    }

    /// Whether the connection ended without an orderly close: rdma_cm reported its device
    /// removed, or a device event broke its queue pair.
    pub(crate) fn is_device_removed(&self) -> bool {
        self.state().is_device_removed()
    }

    /// Whether the connection is known to be closed.
    pub(crate) fn is_disconnected(&self) -> bool {
        self.state().disconnected
    }

    /// Waits until the connection is disconnected, by either side.
    ///
    /// Cancel safety: cancel safe; events read before cancellation are recorded.
    pub(crate) async fn closed(&self) -> io::Result<()> {
        loop {
            if self.try_disconnected()? {
                return Ok(());
            }
            let mut guard = self.events.readable().await?;
            let _ = guard.try_io(|_| {
                let mut state = self.state();
                self.drain_events(&mut state)
            });
        }
    }

    /// Starts a disconnect (idempotent). The queue pair moves to the error state at once.
    pub(crate) fn disconnect(&self) -> io::Result<()> {
        let mut state = self.state();
        if !state.start_disconnect() {
            return Ok(());
        }
        tracing::debug!(parent: &self.span, "disconnecting");
        self.id.disconnect()
    }

    /// The error for using a connection rdma_cm reported closed.
    ///
    /// Reads the events already queued first: when a device goes, a peer on the same device can
    /// be torn down (and its disconnect reach this end) before rdma_cm queues this end's own
    /// `DEVICE_REMOVAL`, and the removal is the cause to name once it is known.
    pub(crate) fn closed_error(&self, writing: bool) -> io::Error {
        let state = self.poll_state().unwrap_or_else(|_| self.state());
        state.closed_error(self.peer, writing)
    }
}

impl Drop for CmLink {
    fn drop(&mut self) {
        // An orderly goodbye: the peer sees DISCONNECTED rather than a transport timeout.
        if let Some(registration) = self.registered.take() {
            registration.forget();
        }
        let state = self.state.lock();
        if !state.local_disconnect {
            tracing::debug!(parent: &self.span, "disconnecting");
            let _ = self.id.disconnect();
        }
        tracing::debug!(parent: &self.span, "connection released");
    }
}

/// What the device event reader holds of a connection: enough to end it, not to keep it.
struct LinkOwner {
    state: Weak<Lock<LinkState>>,
    id: Weak<CmId>,
    span: tracing::Span,
}

impl QueuePairOwner for LinkOwner {
    fn abort(&self, event: &DeviceEvent) -> bool {
        let (Some(state), Some(id)) = (self.state.upgrade(), self.id.upgrade()) else {
            return false;
        };
        let mut state = state.lock();
        tracing::warn!(parent: &self.span, %event, "a device event broke the queue pair: disconnecting");
        // Over now, as after a device removal: waiters woken by the flushed work requests
        // find it closed instead of waiting for rdma_cm's DISCONNECTED, which needs the peer's
        // answer to our disconnect request (or its timeout). The disconnect moves the queue
        // pair to the error state: pending work requests complete (flushed) and wake their
        // waiters, who find the connection closed.
        if state.broken(event.to_string())
            && let Err(e) = id.disconnect()
        {
            tracing::debug!(parent: &self.span, error = %e, "rdma_disconnect after a device event failed");
        }
        true
    }
}
