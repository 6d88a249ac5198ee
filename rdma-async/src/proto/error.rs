//! The protocol core's error type.
//!
//! Every value a peer controls (connection data, immediate words, SGL entries) is checked; a
//! violation becomes a [`ProtoError`] with a message naming the field and the values, never a
//! panic. Once a connection has returned an error it stays in the error state (the error is
//! sticky), so a driver can report it from whichever call notices it first.

use std::fmt;
use std::io;

/// What kind of failure a [`ProtoError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ProtoErrorKind {
    /// The peer's connection private data is malformed or unsupported.
    InvalidConnData,
    /// The peer broke the wire protocol (wrote more than granted, unknown control code, ...).
    PeerViolation,
    /// A send work request completed with an error status (C rsockets: `rs_error`, `EIO`).
    SendFailed,
    /// The peer disconnected without closing the stream first (no DISCONNECT or SHUTDOWN
    /// message before the CM's disconnect): bytes it wrote may be missing.
    Reset,
    /// The driver called the core out of order (a driver bug, not the peer's fault).
    Usage,
}

/// A protocol error: a kind plus a message that says which field or rule was violated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ProtoError {
    kind: ProtoErrorKind,
    message: String,
}

impl ProtoError {
    /// An error of `kind` with `message`.
    pub(crate) fn new(kind: ProtoErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }

    /// Malformed peer connection data.
    pub(crate) fn conn_data(message: impl Into<String>) -> Self {
        Self::new(ProtoErrorKind::InvalidConnData, message)
    }

    /// A peer protocol violation.
    pub(crate) fn peer(message: impl Into<String>) -> Self {
        Self::new(ProtoErrorKind::PeerViolation, message)
    }

    /// A driver calling the core out of order.
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self::new(ProtoErrorKind::Usage, message)
    }

    /// The kind of failure.
    pub(crate) fn kind(&self) -> ProtoErrorKind {
        self.kind
    }

    /// The human-readable description.
    pub(crate) fn message(&self) -> &str {
        &self.message
    }

    /// The `io::ErrorKind` a stream user should see for this error.
    pub(crate) fn io_kind(&self) -> io::ErrorKind {
        match self.kind {
            ProtoErrorKind::InvalidConnData | ProtoErrorKind::PeerViolation => {
                io::ErrorKind::InvalidData
            }
            // C reports EIO; a transport failure usually means the peer is gone.
            ProtoErrorKind::SendFailed | ProtoErrorKind::Reset => io::ErrorKind::ConnectionReset,
            ProtoErrorKind::Usage => io::ErrorKind::Other,
        }
    }
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let what = match self.kind {
            ProtoErrorKind::InvalidConnData => "invalid rsocket connection data",
            ProtoErrorKind::PeerViolation => "rsocket protocol violation by the peer",
            ProtoErrorKind::SendFailed => "rsocket send failed",
            ProtoErrorKind::Reset => "connection reset",
            ProtoErrorKind::Usage => "rsocket protocol core misused",
        };
        write!(f, "{what}: {}", self.message)
    }
}

impl std::error::Error for ProtoError {}

impl From<ProtoError> for io::Error {
    fn from(err: ProtoError) -> Self {
        io::Error::new(err.io_kind(), err)
    }
}
