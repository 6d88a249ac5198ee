//! Connection state flags (rsocket-protocol.md §3.1), reduced to what a connected stream needs.
//!
//! C keeps `rs_connected | rs_readable | rs_writable` bits and replaces them wholesale with
//! `rs_disconnected` or `rs_error`. Same here: `connected` stays set after a local shutdown or
//! close until the DISCONNECT completes, the peer disconnects, or the CM reports it.

use super::error::ProtoError;

/// Where a connection is.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConnState {
    /// The peer's connection data was taken (C's `rs_connected`).
    pub(crate) connected: bool,
    /// Local reads may still see new data (cleared by a peer SHUTDOWN or a local close).
    pub(crate) readable: bool,
    /// Local writes are allowed (cleared by a local shutdown/close).
    pub(crate) writable: bool,
    /// Disconnected: no more messages either way (C's `rs_disconnected`).
    pub(crate) disconnected: bool,
    /// The sticky error, if any (C's `rs_error`).
    pub(crate) error: Option<ProtoError>,
}

impl ConnState {
    /// Peer data taken: connected, readable and writable (C's `rs_connect_rdwr`).
    pub(crate) fn connect(&mut self) {
        self.connected = true;
        self.readable = true;
        self.writable = true;
    }

    /// Become disconnected (unless already failed: the error is more useful).
    pub(crate) fn disconnect(&mut self) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
        if self.error.is_none() {
            self.disconnected = true;
        }
    }

    /// Enter the error state; the first error wins.
    pub(crate) fn fail(&mut self, err: ProtoError) {
        self.connected = false;
        self.readable = false;
        self.writable = false;
        if self.error.is_none() {
            self.error = Some(err);
        }
    }
}
