//! Why waiting for a connection failed: the listener itself, or only the request it took.
//!
//! The difference decides what a server does next. A listener whose device went away is dead,
//! and `into_incoming()` ends; a request that could not be set up (out of file descriptors,
//! memory or queue pairs) was rejected, and the listener goes on with the next one, as
//! `TcpListener::accept` does after `EMFILE`.

use std::fmt;
use std::io;
use std::net::SocketAddr;

/// A failed wait for a connection.
#[derive(Debug)]
pub(crate) enum AcceptFailure {
    /// The listener is unusable (its device was removed, its channel failed).
    Listener(io::Error),
    /// One request failed and was rejected; the listener goes on.
    Request(io::Error),
}

impl AcceptFailure {
    /// The error, for callers that treat both alike.
    pub(crate) fn into_error(self) -> io::Error {
        match self {
            AcceptFailure::Listener(e) | AcceptFailure::Request(e) => e,
        }
    }
}

/// Whether a failed handshake was the peer's doing (connection data that is not rsockets', no
/// answer in time, a peer that rejected, gave up or disconnected) rather than this host's
/// (out of descriptors, memory or queue pairs, options the device refused).
pub(crate) fn caused_by_peer(err: &io::Error) -> bool {
    matches!(
        err.kind(),
        io::ErrorKind::InvalidData
            | io::ErrorKind::TimedOut
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::NotConnected
            | io::ErrorKind::UnexpectedEof
    )
}

/// `err`, of the kind it has, saying which peer's connection could not be set up.
pub(crate) fn request_failed(peer: SocketAddr, err: io::Error) -> io::Error {
    io::Error::new(err.kind(), RequestFailed { peer, err })
}

/// A connection request that could not be set up on this host.
#[derive(Debug)]
struct RequestFailed {
    peer: SocketAddr,
    err: io::Error,
}

impl fmt::Display for RequestFailed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "setting up the connection from {} failed (its request was rejected; the listener \
             goes on): {}",
            self.peer, self.err
        )
    }
}

impl std::error::Error for RequestFailed {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The payload inside, so that `error::cause` finds it.
        Some(match self.err.get_ref() {
            Some(inner) => inner,
            None => &self.err,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_failure_keeps_its_kind_os_error_and_cause() {
        let peer: SocketAddr = "10.77.0.2:4000".parse().unwrap();
        let emfile = request_failed(peer, io::Error::from_raw_os_error(libc::EMFILE));
        assert_eq!(
            emfile.kind(),
            io::Error::from_raw_os_error(libc::EMFILE).kind()
        );
        let text = emfile.to_string();
        assert!(text.contains("10.77.0.2:4000"), "{text}");
        assert!(text.contains("os error 24"), "{text}");
        assert!(!caused_by_peer(&emfile));

        let call = crate::error::call_error("ibv_create_comp_channel", libc::EMFILE);
        let wrapped = request_failed(peer, call);
        assert!(
            crate::error::cause::<crate::error::CallError>(&wrapped).is_some(),
            "{wrapped:?}"
        );
    }

    #[test]
    fn peer_failures_are_told_from_local_ones() {
        for kind in [
            io::ErrorKind::InvalidData,
            io::ErrorKind::TimedOut,
            io::ErrorKind::ConnectionAborted,
        ] {
            assert!(caused_by_peer(&io::Error::from(kind)), "{kind:?}");
        }
        for errno in [libc::EMFILE, libc::ENFILE, libc::ENOMEM, libc::ENOBUFS] {
            let err = crate::error::call_error("rdma_create_event_channel", errno);
            assert!(!caused_by_peer(&err), "{err}");
        }
    }
}
