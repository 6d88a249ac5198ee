//! A connection request received by a listener.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::events::CmEvents;
use super::handshake::expect;
use super::link::CmLink;
use super::params::{ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use crate::error;
use crate::verbs::{CmEvent, CmId};

/// A peer's connection request: accept it into a connection type, or reject it.
///
/// Dropping a request without either rejects it.
#[derive(Debug)]
pub struct ConnectRequest {
    id: Arc<CmId>,
    events: Option<CmEvents>,
    private_data: Vec<u8>,
    peer: SocketAddr,
    local: SocketAddr,
    peer_initiator_depth: u8,
    peer_responder_resources: u8,
    answered: bool,
}

impl ConnectRequest {
    pub(super) fn new(
        id: Arc<CmId>,
        events: CmEvents,
        event: CmEvent,
        listener_addr: SocketAddr,
    ) -> io::Result<Self> {
        let peer = id.peer_addr()?;
        let local = id.local_addr().unwrap_or(listener_addr);
        tracing::debug!(%peer, %local, "connection request");
        Ok(ConnectRequest {
            id,
            events: Some(events),
            private_data: event.private_data,
            peer,
            local,
            peer_initiator_depth: event.initiator_depth,
            peer_responder_resources: event.responder_resources,
            answered: false,
        })
    }

    /// The private data the peer sent with its request (zero-padded to 56 bytes on IB/RoCE).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The address of the peer that asks to connect.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }

    /// The local address the request arrived on.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// Rejects the request; the peer's connect fails with `ConnectionRefused` and sees
    /// `private_data` (at most [`super::MAX_REJECT_PRIVATE_DATA`] bytes).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the private data is too long (the request is then still rejected,
    /// without data), or the OS error of `rdma_reject`.
    pub fn reject(mut self, private_data: &[u8]) -> io::Result<()> {
        self.answered = true;
        if private_data.len() > MAX_REJECT_PRIVATE_DATA {
            let _ = self.id.reject(&[]);
            return Err(error::invalid_input(format!(
                "reject private data is {} bytes; at most {MAX_REJECT_PRIVATE_DATA} fit",
                private_data.len()
            )));
        }
        tracing::debug!(peer = %self.peer, private_data_len = private_data.len(), "rejecting connection request");
        self.id.reject(private_data)
    }

    /// Accepts with `params` once `build` created the queue pair; returns when established.
    pub(crate) async fn accept_with<R>(
        mut self,
        params: &ConnParams,
        build: impl FnOnce(&Arc<CmId>) -> io::Result<(R, Option<Vec<u8>>)>,
    ) -> io::Result<(R, CmLink)> {
        // Never promise more RDMA reads than the peer asked to issue or can serve.
        let params = params
            .clone()
            .responder_resources(params_min(params, self.peer_initiator_depth, true))
            .initiator_depth(params_min(params, self.peer_responder_resources, false));
        let (resources, private_data) = build(&self.id)?;
        let params = match private_data {
            Some(data) => params.private_data(data),
            None => params,
        };
        let raw = params.to_raw(MAX_ACCEPT_PRIVATE_DATA, "accept")?;
        self.answered = true;
        self.id.accept(&raw)?;
        let peer = Some(self.peer);
        expect(
            self.events
                .as_ref()
                .ok_or_else(|| error::invalid_input("request already used"))?,
            ev::RDMA_CM_EVENT_ESTABLISHED,
            peer,
            "accepting",
        )
        .await?;
        let private_data = std::mem::take(&mut self.private_data);
        let events = self
            .events
            .take()
            .ok_or_else(|| error::invalid_input("request already used"))?;
        let link = CmLink::new(self.id.clone(), events, private_data, self.peer)?;
        tracing::debug!(parent: link.span(), "accepted");
        Ok((resources, link))
    }
}

/// Our value for a resource count, capped by what the peer offered.
fn params_min(params: &ConnParams, peer: u8, responder: bool) -> u8 {
    let ours = if responder {
        params.get_responder_resources()
    } else {
        params.get_initiator_depth()
    };
    ours.min(peer)
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if !self.answered {
            tracing::debug!(peer = %self.peer, "connection request dropped: rejecting it");
            let _ = self.id.reject(&[]);
        }
    }
}
