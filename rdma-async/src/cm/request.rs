//! A connection request received by a listener.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use super::events::CmEvents;
use super::id_options::IdOptions;
use super::params::MAX_REJECT_PRIVATE_DATA;
use crate::error;
use crate::verbs::{CmEvent, CmId, RawConnParam};

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
    listener_options: IdOptions,
    answered: bool,
}

impl ConnectRequest {
    pub(super) fn new(
        id: Arc<CmId>,
        events: CmEvents,
        event: CmEvent,
        listener_addr: SocketAddr,
        listener_options: IdOptions,
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
            listener_options,
            answered: false,
        })
    }

    /// The private data the peer sent with its request (zero-padded to 56 bytes on IB/RoCE).
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's address, for the crate's own messages.
    pub(crate) fn peer(&self) -> SocketAddr {
        self.peer
    }

    /// The address of the peer that asks to connect.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.peer)
    }

    /// The local address the request arrived on.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.local)
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

    /// The listener's id options, which apply to the accepted id where the accepting type's do
    /// not set them.
    pub(super) fn listener_options(&self) -> &IdOptions {
        &self.listener_options
    }

    /// The request's id, to create the queue pair on.
    pub(super) fn id(&self) -> &Arc<CmId> {
        &self.id
    }

    /// The RDMA reads the peer asked to issue (its initiator depth) and to serve (its responder
    /// resources).
    pub(super) fn peer_rdma_read_limits(&self) -> (u8, u8) {
        (self.peer_initiator_depth, self.peer_responder_resources)
    }

    /// Sends the accept; returns what the established connection keeps: the id, its events, the
    /// peer's private data and address.
    pub(super) fn answer_accept(
        mut self,
        params: &RawConnParam,
    ) -> io::Result<(Arc<CmId>, CmEvents, Vec<u8>, SocketAddr)> {
        self.answered = true;
        self.id.accept(params)?;
        let events = self
            .events
            .take()
            .ok_or_else(|| error::invalid_input("request already used"))?;
        let private_data = std::mem::take(&mut self.private_data);
        Ok((self.id.clone(), events, private_data, self.peer))
    }
}

impl Drop for ConnectRequest {
    fn drop(&mut self) {
        if !self.answered {
            tracing::debug!(peer = %self.peer, "connection request dropped: rejecting it");
            let _ = self.id.reject(&[]);
        }
    }
}
