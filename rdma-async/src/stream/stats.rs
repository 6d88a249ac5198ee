//! What a stream did on the device: work requests, completions, bytes, and what its writers
//! waited for.

use crate::proto::WriteBlocked;

/// Counters of one [`RStream`](super::RStream), for comparing its cost per message with other
/// transports (work requests and completions per message decide small-message performance).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StreamStats {
    /// RDMA writes with immediate that carried application data.
    pub data_writes: u64,
    /// Control messages posted: credit and buffer grants, SHUTDOWN, DISCONNECT, keepalives.
    pub control_writes: u64,
    /// Of the data writes, those whose bytes went inline (copied into the work request, not
    /// read by the device from the send ring).
    pub inline_writes: u64,
    /// `ibv_post_send` calls. A write call posts its chunks, and the control messages due
    /// with them, as one chain of work requests (up to 16, or 256 bytes of inline data).
    pub post_send_calls: u64,
    /// Send completions polled. Unlike rsockets, which signals every send, only every
    /// n-th data write, n a quarter of the send queue's data entries (every 95th at the
    /// default depth), the one that brings the unsignaled
    /// writes to three quarters of the send ring, the one that fills the send queue or ring
    /// (unless an earlier signaled write still to complete frees enough), the credit update
    /// that takes the last of the 4 control slots, and SHUTDOWN, DISCONNECT and keepalives
    /// are signaled; a completion also completes the unsignaled sends before it.
    pub send_completions: u64,
    /// Sends posted signaled: each produces one send completion, so while
    /// `send_completions` is smaller a completion is still to come.
    pub signaled_sends: u64,
    /// Receive completions polled (one per data or control message from the peer).
    pub recv_completions: u64,
    /// Application bytes written to the device.
    pub bytes_sent: u64,
    /// Of those, bytes sent straight from the caller's registered memory
    /// ([`RStream::write_region`](super::RStream::write_region)), without a copy.
    pub zero_copy_bytes: u64,
    /// Application bytes handed to readers.
    pub bytes_received: u64,
    /// Of those, bytes lent from the receive ring without a copy
    /// ([`RStream::read_lent`](super::RStream::read_lent)).
    pub lent_bytes: u64,
    /// Probes sent while a writer waited for the peer's credits (counted in `control_writes`
    /// too): one per second of waiting, so a dead peer is noticed even without keepalive.
    pub write_probes: u64,
    /// Busy-poll windows a waiting task ended early because another thread wanted the
    /// stream's lock (the other half of a split stream on another worker): the task sleeps
    /// until its completion instead, and the other thread goes on at once.
    pub busy_polls_yielded: u64,
    /// Times a task waiting for completions yielded to the runtime's other tasks instead of
    /// sleeping: it looks again when its turn comes, which with many connections on a thread
    /// saves arming the queue, the wake-up and their system calls. Waits whose yields keep
    /// finding nothing make the following waits sleep at once.
    pub waits_yielded: u64,
    /// Times the stream armed its completion queue to be woken by the next completion
    /// (`ibv_req_notify_cq`: a system call on Soft-RoCE, a doorbell on a NIC): one before a
    /// wait sleeps with no arm outstanding. A reader that reads until it finds nothing (as
    /// hyper's does) arms as its wake-up takes the event, before the bytes are handed up, and
    /// its read that then finds nothing sleeps under that arm.
    pub cq_arms: u64,
    /// Writes (and `writable()` calls) that had to wait because the peer had granted no room:
    /// its receive ring was full or its receive credits were used up. One per wait, however
    /// often the waiting task is polled meanwhile; `try_write` never waits. The peer's reader is behind, as when a TCP
    /// peer advertises a zero window; a larger receive buffer on the peer
    /// ([`RStreamOptions::recv_buffer_size`](super::RStreamOptions::recv_buffer_size)) or a
    /// faster reader helps.
    pub writer_waits_for_peer: u64,
    /// Writes (and `writable()` calls) that had to wait for the stream's own sends to
    /// complete, counted like `writer_waits_for_peer`: the send queue
    /// ([`RStreamOptions::sq_size`](super::RStreamOptions::sq_size)) or the send buffer
    /// ([`RStreamOptions::send_buffer_size`](super::RStreamOptions::send_buffer_size)) was
    /// full. The device is behind the writer.
    pub writer_waits_for_sends: u64,
}

impl StreamStats {
    /// A writer is about to wait, for `reason`.
    pub(crate) fn count_writer_wait(&mut self, reason: WriteBlocked) {
        match reason {
            WriteBlocked::Credits | WriteBlocked::TargetBuffer => self.writer_waits_for_peer += 1,
            WriteBlocked::SendQueue | WriteBlocked::SendBuffer => self.writer_waits_for_sends += 1,
        }
    }
}
