//! Readiness for a set of interests at once, as tokio's `Ready`: what a read and a write would
//! do now, and whether either direction is closed for good.

use std::io;

use tokio::io::{Interest, Ready};

use crate::proto::{ReadStatus, WriteError};

use super::{CoreState, Side, StreamCore, StreamDevice};

impl<D: StreamDevice> StreamCore<D> {
    /// Waits until the stream is ready for any of `interest` (readable, writable, or both) and
    /// returns what it is ready for now.
    pub(in crate::stream) async fn ready_for(&self, interest: Interest) -> io::Result<Ready> {
        match (interest.is_readable(), interest.is_writable()) {
            (true, false) => self.ready(Side::Read).await?,
            (false, true) => self.ready(Side::Write).await?,
            // Both waits are cancel safe: the one that loses is dropped with nothing taken.
            (true, true) => tokio::select! {
                read = self.ready(Side::Read) => read?,
                write = self.ready(Side::Write) => write?,
            },
            (false, false) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "a stream can wait only for READABLE or WRITABLE interest, not {interest:?}"
                    ),
                ));
            }
        }
        Ok(Self::readiness(&self.lock(), interest))
    }

    /// What the stream is ready for among `interest`, from what it has handled so far.
    ///
    /// As with a socket's poll flags: readable when a read would not block (data, end of stream
    /// or an error), `READ_CLOSED` once no more data will arrive (the peer shut down or
    /// disconnected, or the connection failed; POLLRDHUP); writable when a write would not
    /// block (room and credits, or an error to report), `WRITE_CLOSED` once the connection is
    /// disconnected or failed (POLLHUP, POLLERR). A local shutdown leaves the stream
    /// writable (a write then fails with `BrokenPipe`), as it does a socket.
    fn readiness(state: &CoreState, interest: Interest) -> Ready {
        let conn = &state.conn;
        let mut ready = Ready::EMPTY;
        if interest.is_readable() {
            if conn.read_status() != ReadStatus::Blocked {
                ready |= Ready::READABLE;
            }
            if conn.is_read_closed() {
                ready |= Ready::READ_CLOSED;
            }
        }
        if interest.is_writable() {
            if !matches!(conn.write_readiness(), Err(WriteError::Blocked(_))) {
                ready |= Ready::WRITABLE;
            }
            if conn.is_disconnected() || conn.error().is_some() {
                ready |= Ready::WRITE_CLOSED;
            }
        }
        ready
    }

    /// The failure that broke the connection, if one did: reported again, not cleared.
    pub(in crate::stream) fn error(&self) -> Option<io::Error> {
        let state = self.lock();
        let proto = state.conn.error().cloned();
        (proto.is_some() || state.transport_error.is_set()).then(|| self.failure(&state, proto))
    }
}
