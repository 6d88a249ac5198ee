//! Test hook: a client that sends a connection request and then never completes the handshake,
//! so that tests can play the peer that parks a listener's handshake.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use rdma_async_sys::rdma_cm_event_type as ev;

use super::error::event_error;
use super::events::CmEvents;
use super::handshake::{DialOptions, new_id, resolve_route};
use super::params::{ConnParams, MAX_CONNECT_PRIVATE_DATA};
use crate::verbs::{CmId, PortSpace};

/// Made-up queue pair numbers for parked requests, one each: rdma_cm rejects a second request
/// that names a (host, queue pair) it already has as stale. They start above the queue pair
/// numbers Soft-RoCE hands out (below 2^17), so they never collide with real ones.
static NEXT_QP_NUM: AtomicU32 = AtomicU32::new(0xF0_0000);

/// A connection request without a queue pair that is never completed: librdmacm answers a
/// listener's accept (with the RTU that establishes the connection) only for an id with a queue
/// pair, and only when its events are read, so the listener waits for an answer that never comes.
#[derive(Debug)]
pub struct ParkedConnect {
    events: CmEvents,
    id: Arc<CmId>,
    peer: SocketAddr,
}

/// How a listener ended a parked request, from the parked side.
#[derive(Debug)]
pub struct ParkedOutcome {
    /// The listener accepted the request (rdma_cm's CONNECT_RESPONSE arrived).
    pub answered: bool,
    /// The event that ended it (a rejection is `ConnectionRefused`).
    pub end: io::Error,
}

impl ParkedConnect {
    /// Resolves a route to `addr`; nothing is sent yet.
    ///
    /// # Errors
    ///
    /// As resolving in `RStream::connect`.
    pub async fn resolve(addr: SocketAddr) -> io::Result<Self> {
        let dial = DialOptions::default();
        let (id, events) = new_id(PortSpace::Tcp, &dial.id)?;
        resolve_route(&id, &events, dial.bind, addr, dial.resolve_timeout).await?;
        Ok(ParkedConnect {
            events,
            id,
            peer: addr,
        })
    }

    /// Sends the connection request with `private_data`; nothing else will ever be sent.
    ///
    /// # Errors
    ///
    /// The error of `rdma_connect`; `InvalidInput` for oversized private data.
    pub fn send_request(&self, private_data: &[u8]) -> io::Result<()> {
        let params = ConnParams::new()
            .private_data(private_data)
            .to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")?;
        self.id
            .connect_announcing(&params, NEXT_QP_NUM.fetch_add(1, Ordering::Relaxed))
    }

    /// Waits for the listener's answer: `Ok` when it accepted the request (the handshake is
    /// then parked on the listener's side), else the error of the event that ended it (a
    /// rejection is `ConnectionRefused`, with the listener's reason in its message).
    ///
    /// # Errors
    ///
    /// The end of a request the listener did not accept.
    pub async fn answer(&self) -> io::Result<()> {
        match self.events.next().await {
            Ok(event) if event.kind == ev::RDMA_CM_EVENT_CONNECT_RESPONSE => Ok(()),
            Ok(event) => Err(event_error(&event, Some(self.peer), "parked")),
            Err(end) => Err(end),
        }
    }

    /// Waits for the event that ends the request, noting whether the listener accepted it first.
    /// Reading the events answers nothing: the id has no queue pair.
    pub async fn outcome(&self) -> ParkedOutcome {
        let mut answered = false;
        loop {
            match self.events.next().await {
                Ok(event) if event.kind == ev::RDMA_CM_EVENT_CONNECT_RESPONSE => answered = true,
                Ok(event) => {
                    return ParkedOutcome {
                        answered,
                        end: event_error(&event, Some(self.peer), "parked"),
                    };
                }
                Err(end) => return ParkedOutcome { answered, end },
            }
        }
    }
}
