//! Sending: planning each chunk of an application write as a [`DataWrite`] to post, and what
//! a send completion gives back (ring space, send-queue entries, control slots).

use super::Connection;
use crate::proto::error::{ProtoError, ProtoErrorKind};
use crate::proto::imm::{CtrlCode, Op};
use crate::proto::plan::{ControlKind, DataWrite};
use crate::proto::sender::{Chunk, WriteBlocked, WriteCall};
use crate::proto::wr::SendKind;

/// Why `prepare_write` produced nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteError {
    /// Nothing can be sent now; a send completion or a credit/SGL message from the peer will
    /// change that (the reason says which). Wait, then call again.
    Blocked(WriteBlocked),
    /// Writing is over: we shut down writing, or the connection is disconnected. C returns
    /// `ECONNRESET` here.
    Closed,
    /// The connection failed, or the call was invalid (the error says which).
    Failed(ProtoError),
}

impl Connection {
    /// `Ok` if `prepare_write` would produce a chunk now (C's `rs_can_send` plus state checks).
    pub(crate) fn write_readiness(&self) -> Result<(), WriteError> {
        self.write_open()?;
        match self.sender.blocked() {
            Some(reason) => Err(WriteError::Blocked(reason)),
            None => Ok(()),
        }
    }

    /// Whether the connection takes writes at all (no error, set up, not shut down), whatever
    /// its ring space and credits.
    #[inline(always)]
    fn write_open(&self) -> Result<(), WriteError> {
        if let Some(err) = &self.state.error {
            return Err(WriteError::Failed(err.clone()));
        }
        if !self.state.connected && !self.state.disconnected {
            return Err(WriteError::Failed(ProtoError::usage(
                "write before the peer's connection data was handled",
            )));
        }
        if !self.state.writable {
            return Err(WriteError::Closed);
        }
        Ok(())
    }

    /// Whether a write would make progress now (POLLOUT).
    #[cfg(test)]
    pub(crate) fn can_write(&self) -> bool {
        self.write_readiness().is_ok()
    }

    /// Plan the next chunk of an application write with `remaining` bytes (> 0) left in this
    /// call. The state is updated before returning (target SGE advanced, sequence number and
    /// send-queue accounting), so the driver must post the returned write. Always inlined, as
    /// is the planning under it: as a call of its own, returning the write through memory, it
    /// cost a streamed message some 130 instructions (and so did a closure for the sender's
    /// part, left a call of its own).
    #[inline(always)]
    pub(crate) fn prepare_write(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<DataWrite, WriteError> {
        self.chunk_allowed(remaining)?;
        let chunk = self
            .sender
            .next_chunk(call, remaining)
            .map_err(WriteError::Blocked)?;
        Ok(self.data_write(chunk))
    }

    /// Checks the connection can write `remaining` (> 0) bytes. The sender then says why it is
    /// blocked, if it is (`Sender::chunk_len`), so that is looked at once per chunk.
    #[inline(always)]
    fn chunk_allowed(&self, remaining: usize) -> Result<(), WriteError> {
        self.write_open()?;
        if remaining == 0 {
            return Err(WriteError::Failed(ProtoError::usage(
                "a 0-byte write sends nothing: no chunk to prepare",
            )));
        }
        Ok(())
    }

    /// Records `chunk`, just planned, as an outstanding send and returns its write.
    #[inline(always)]
    fn data_write(&mut self, chunk: Chunk) -> DataWrite {
        self.timers.writer_unblocked();
        let wr_id = self.sends.push_data(chunk.len, chunk.signaled);
        DataWrite {
            wr_id,
            signaled: chunk.signaled,
            len: chunk.len as usize,
            sbuf: chunk.sbuf,
            inline: chunk.inline,
            remote_addr: chunk.remote_addr,
            rkey: chunk.rkey,
            imm: Op::Data(chunk.len).encode(),
        }
    }

    /// Plan the next chunk of a zero-copy write (sent from the caller's registered memory, not
    /// the send ring) with `remaining` bytes (> 0) left; see `Sender::next_external_chunk`. The
    /// returned write has an empty `sbuf` and is not inline: the driver sends its `len` bytes
    /// from the caller's memory.
    pub(crate) fn prepare_external_write(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<DataWrite, WriteError> {
        self.chunk_allowed(remaining)?;
        let chunk = self
            .sender
            .next_external_chunk(call, remaining)
            .map_err(WriteError::Blocked)?;
        Ok(self.data_write(chunk))
    }

    /// Whether the send `wr_id` was posted and has not completed yet.
    pub(crate) fn is_send_outstanding(&self, wr_id: u64) -> bool {
        self.sends.is_outstanding(wr_id)
    }

    /// Plans a 0-byte DATA message: valid for the peer (it costs one of our credits and
    /// returns at once), but carrying nothing. Tests flood a peer with these.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn prepare_empty_write(&mut self) -> Result<DataWrite, WriteError> {
        self.write_readiness()?;
        let chunk = self
            .sender
            .next_empty_chunk()
            .map_err(WriteError::Blocked)?;
        let wr_id = self.sends.push_data(0, chunk.signaled);
        Ok(DataWrite {
            wr_id,
            signaled: chunk.signaled,
            len: 0,
            sbuf: chunk.sbuf,
            inline: true,
            remote_addr: chunk.remote_addr,
            rkey: chunk.rkey,
            imm: Op::Data(0).encode(),
        })
    }

    /// A send work request completed (`ok` = success status). Sends complete in post order, so
    /// this also completes every unsignaled send posted before it. Returns the error if this
    /// completion broke the connection.
    pub(crate) fn handle_send_completion(
        &mut self,
        wr_id: u64,
        ok: bool,
    ) -> Result<(), ProtoError> {
        let mut disconnect_done = false;
        let released = match self.sends.complete_through(wr_id) {
            Ok(released) => released,
            Err(err) => return Err(self.fail(err)),
        };
        // The data writes completed, and their bytes: given back to the sender in one step.
        let mut data = released.data;
        let unmarked = data.writes > 0;
        // The completed send itself, for an error status: the last one released.
        let mut last = None;
        for marked in self.sends.take_marked(released.marked) {
            data.merge(marked.data);
            match marked.kind {
                SendKind::Data { .. } | SendKind::Bind { .. } => {}
                SendKind::Control(kind) => {
                    self.control.release();
                    disconnect_done |= kind == ControlKind::Ctrl(CtrlCode::Disconnect);
                }
                SendKind::Invalidate { half, key } if ok => self.receiver.revoked(half, key),
                // A flushed or failed invalidation revoked nothing: its key may still reach the
                // half (even after a later key's invalidation succeeds), so it is never lent.
                SendKind::Invalidate { half, key } => self.receiver.revoke_failed(half, key),
            }
            last = Some(marked.kind);
        }
        if unmarked {
            // Unsignaled data writes came after the marked sends released.
            last = None;
        }
        self.sender.complete(data.writes, data.bytes);
        if disconnect_done {
            // C: our DISCONNECT is out (or flushed): the connection is over.
            self.enter_disconnected();
        }
        if !ok && self.state.connected {
            let err = ProtoError::new(
                ProtoErrorKind::SendFailed,
                match last {
                    Some(kind) => format!("a {kind:?} send completed with an error status"),
                    None => "a data write completed with an error status".to_string(),
                },
            );
            return Err(self.fail(err));
        }
        Ok(())
    }
}
