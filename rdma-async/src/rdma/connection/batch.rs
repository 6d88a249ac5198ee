//! Batches of RDMA writes: many writes of an [`RdmaConnection`] posted as one list of work
//! requests, with one doorbell and one completion for all of them.

use std::io;
use std::ops::Range;

use super::RdmaConnection;
use super::posting::OpKind;
use crate::error;
use crate::memory::sealed::Carried;
use crate::memory::{RegisteredBytes, RemoteSlice, span};
use crate::rdma::completion_task::lost_buffer;
use crate::verbs::{Held, Opcode, Segment};

impl RdmaConnection {
    /// Writes each `(buf, range, remote)` of `writes` as [`Self::write`] does, posting them as
    /// one list of work requests (one `ibv_post_send`) of which only the last is signaled, and
    /// returns when the last has completed: the one doorbell, completion and wake-up of a
    /// batch stand for all of its writes, as a verbs program posts a chain of requests and
    /// signals its tail. The buffers come back in the order given.
    ///
    /// A batch takes one place of the send queue per write, so it holds at most
    /// [`RdmaOptions::send_depth`](crate::rdma::RdmaOptions::send_depth) writes, and it waits
    /// until that many places are free. A batch that waits has its turn: operations of one
    /// place issued meanwhile wait until it has its places, so a steady stream of single
    /// operations cannot hold it off. The writes of a reliable connection execute in order:
    /// when the last has completed, every write of the batch is in the peer's memory.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::rdma::{RdmaConnection, RemoteRegion};
    ///
    /// # async fn demo(conn: RdmaConnection, remote: RemoteRegion) -> std::io::Result<()> {
    /// // Four 4 KiB blocks into four places of the peer's region, with one completion.
    /// let mut writes = Vec::new();
    /// for i in 0..4 {
    ///     let mut block = conn.reg_msgs(4096)?;
    ///     block.fill(i as u8);
    ///     writes.push((block, 0..4096, remote.slice(i * 8192, 4096)?));
    /// }
    /// let (res, blocks) = conn.write_batch(writes).await;
    /// res?;
    /// assert_eq!(blocks.len(), 4);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` before anything is posted when the batch holds more writes than the send
    /// queue's depth, or when a write's range does not fit its region or its remote slice
    /// (the message names the write); otherwise as [`Self::write`], for the first write that
    /// failed. Writes before a failed one have landed; those after it were flushed, and the
    /// connection is in the error state. An empty batch succeeds at once.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::write`]: dropping the future leaves every buffer of the batch in the
    /// connection's table until the last write's completion (the device may be reading any of
    /// them until then); the writes still happen.
    pub async fn write_batch<B: RegisteredBytes>(
        &self,
        writes: Vec<(B, Range<usize>, RemoteSlice)>,
    ) -> (io::Result<()>, Vec<B>) {
        let n = writes.len();
        if n == 0 {
            return (Ok(()), Vec::new());
        }
        let depth = self.shared.send_depth();
        let mut bad = (n > depth).then(|| {
            error::invalid_input(format!(
                "a batch of {n} writes is more than the send queue's depth of {depth}"
            ))
        });
        let mut members = Vec::with_capacity(n);
        let mut users = Vec::with_capacity(n);
        for (i, (buf, range, remote)) in writes.into_iter().enumerate() {
            let checked = span(buf.len(), range)
                .and_then(|(offset, len)| {
                    Self::check_remote(len, remote, "write").map(|()| (offset, len))
                })
                .and_then(|at| self.admit(OpKind::Write(remote), &buf).map(|()| at));
            let (offset, len) = match checked {
                Ok(at) => at,
                Err(e) => {
                    bad.get_or_insert_with(|| {
                        io::Error::new(e.kind(), format!("write {i} of the batch: {e}"))
                    });
                    (0, 0)
                }
            };
            let segment = Segment {
                buffer: i,
                offset,
                len,
            };
            let opcode = Opcode::Write {
                remote_addr: remote.addr(),
                rkey: remote.rkey(),
                imm: None,
            };
            members.push((segment, opcode));
            users.push(buf.into_user().0);
        }
        let back = |held: Held| -> Vec<B> {
            match held {
                Held::Batch(v) => v.into_iter().map(|b| B::from_user(Carried(b))).collect(),
                // The table gives back exactly what it was given.
                _ => lost_buffer(),
            }
        };
        if let Some(e) = bad {
            return (Err(e), back(Held::Batch(users)));
        }
        let (result, held) = self.shared.execute_batch(Held::Batch(users), members).await;
        let result = self.check_completion(result, OpKind::WriteBatch(n));
        (result.map(drop), back(held))
    }
}
