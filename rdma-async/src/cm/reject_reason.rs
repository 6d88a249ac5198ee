//! Why a server rejected a connection request, in the reject's private data, so that the
//! client's error can say it ("the server at ADDR could not set up the connection: memory
//! registration of 139264 bytes failed (locked-memory limit ...)") instead of a bare refusal.
//!
//! When an accepting side cannot set up a connection it was asked for (registering its memory
//! or creating its queue pair or completion queue fails, or the request cannot be served), it
//! rejects the request with this private data (at most [`MAX_REJECT_PRIVATE_DATA`] bytes):
//!
//! | bytes | field |
//! |---|---|
//! | 0..4 | magic `RDAR` (`52 44 41 52`) |
//! | 4 | format version, 1 |
//! | 5 | cause: 1 the server could not set up the connection (its resources or its device failed), 2 the request was invalid (e.g. its rsockets connection data) |
//! | 6..8 | reserved, zero |
//! | 8.. | the reason, UTF-8, up to 140 bytes; it ends at the first NUL or at the end of the data (IB and RoCE pad private data with zeros) |
//!
//! C rsockets peers ignore a reject's private data (their `rconnect` fails with
//! `ECONNREFUSED`), so the same reject serves them as a plain one. A client of this crate
//! recognises the magic; any other private data (an application's own `reject`) is reported as
//! it always was.

use std::io;

use super::accept_failure::caused_by_peer;
use super::params::MAX_REJECT_PRIVATE_DATA;
use super::peer_warnings::peer_warning;
use super::request::ConnectRequest;
use crate::verbs::ResourceError;

const MAGIC: [u8; 4] = *b"RDAR";
const VERSION: u8 = 1;
const HEADER: usize = 8;

/// Why the server rejected, as the reject's private data tells it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RejectCause {
    /// The server could not set up the connection (resources, device).
    SetupFailed,
    /// The request was invalid.
    InvalidRequest,
}

impl RejectCause {
    fn code(self) -> u8 {
        match self {
            RejectCause::SetupFailed => 1,
            RejectCause::InvalidRequest => 2,
        }
    }

    /// What the server did, for the client's message ("the server at ADDR {what}: reason").
    pub(crate) fn describe(self) -> &'static str {
        match self {
            RejectCause::SetupFailed => "could not set up the connection",
            RejectCause::InvalidRequest => "rejected the connection request as invalid",
        }
    }
}

/// The private data that tells a client why its request is rejected because of `err`.
pub(crate) fn encode(err: &io::Error) -> Vec<u8> {
    let cause = match err.kind() {
        io::ErrorKind::InvalidData => RejectCause::InvalidRequest,
        _ => RejectCause::SetupFailed,
    };
    // A limit's own summary is short and says all; other errors are cut to fit.
    let reason = crate::error::cause::<ResourceError>(err)
        .map_or_else(|| err.to_string(), |e| e.summary().to_owned());
    let room = MAX_REJECT_PRIVATE_DATA - HEADER;
    let mut end = reason.len().min(room);
    while !reason.is_char_boundary(end) {
        end -= 1;
    }
    let mut data = Vec::with_capacity(HEADER + end);
    data.extend_from_slice(&MAGIC);
    data.extend_from_slice(&[VERSION, cause.code(), 0, 0]);
    data.extend_from_slice(&reason.as_bytes()[..end]);
    data
}

/// The cause and reason in a reject's private data, if it is in this format.
pub(crate) fn decode(data: &[u8]) -> Option<(RejectCause, String)> {
    if data.len() < HEADER || data[..4] != MAGIC || data[4] != VERSION {
        return None;
    }
    let cause = match data[5] {
        1 => RejectCause::SetupFailed,
        2 => RejectCause::InvalidRequest,
        _ => return None,
    };
    let text = &data[HEADER..];
    let end = text.iter().position(|&b| b == 0).unwrap_or(text.len());
    Some((cause, String::from_utf8_lossy(&text[..end]).into_owned()))
}

/// Rejects `request`, which could not be set up because of `err`, telling the peer why; logs
/// it (the server's operator needs to know as much as the client).
pub(crate) fn reject_with_reason(request: ConnectRequest, err: &io::Error) {
    let peer = request.peer();
    if caused_by_peer(err) {
        peer_warning!(%peer, error = %err, "could not set up an incoming connection; rejecting it with the reason");
    } else {
        tracing::warn!(%peer, error = %err, "could not set up an incoming connection; rejecting it with the reason");
    }
    send_reject(request, err);
}

/// Rejects `request`, which the listener would not take (too many handshakes from its
/// address, or too much memory pinned by handshakes), telling the peer why. Logged as a peer's
/// doing (limited), since peers can send such requests by the thousand.
pub(crate) fn refuse(request: ConnectRequest, err: &io::Error) {
    let peer = request.peer();
    peer_warning!(%peer, error = %err, "connection request refused");
    send_reject(request, err);
}

fn send_reject(request: ConnectRequest, err: &io::Error) {
    let peer = request.peer();
    if let Err(e) = request.reject(&encode(err)) {
        tracing::debug!(%peer, error = %e, "rdma_reject failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reason_survives_the_zero_padding_of_the_transport() {
        let err = io::Error::new(io::ErrorKind::OutOfMemory, "out of queue pairs");
        let mut data = encode(&err);
        assert_eq!(&data[..8], b"RDAR\x01\x01\x00\x00");
        data.resize(MAX_REJECT_PRIVATE_DATA, 0);
        assert_eq!(
            decode(&data),
            Some((RejectCause::SetupFailed, "out of queue pairs".to_owned()))
        );
    }

    #[test]
    fn invalid_requests_are_told_apart_and_long_reasons_are_cut_at_a_char_boundary() {
        let err = io::Error::new(io::ErrorKind::InvalidData, "é".repeat(100));
        let data = encode(&err);
        assert!(data.len() <= MAX_REJECT_PRIVATE_DATA, "{}", data.len());
        let (cause, reason) = decode(&data).unwrap();
        assert_eq!(cause, RejectCause::InvalidRequest);
        assert_eq!(reason, "é".repeat(70));
    }

    #[test]
    fn other_private_data_is_not_taken_for_a_reason() {
        assert_eq!(decode(b"go away: server full"), None);
        assert_eq!(decode(&[0; MAX_REJECT_PRIVATE_DATA]), None);
        assert_eq!(
            decode(b"RDAR\x02\x01\x00\x00future"),
            None,
            "another version"
        );
        assert_eq!(decode(b"RDAR\x01"), None, "too short");
    }
}
