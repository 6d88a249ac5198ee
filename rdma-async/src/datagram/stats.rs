//! What a datagram socket counted.

use std::sync::atomic::{AtomicU64, Ordering};

/// Counters of one [`RDatagram`](super::RDatagram).
///
/// UD has no acknowledgements, so a datagram that finds no posted receive buffer (the receiver
/// is more than its receive depth behind) is dropped by the receiving device without a trace.
/// rdma-async peers number the datagrams they send to each unicast destination (in the
/// immediate data), so the receiver sees the gaps: `dropped` counts datagrams from rdma-async
/// peers that never arrived before a later one from the same peer did. Drops from other
/// senders (C tools, multicast) and drops of a peer's last datagrams are not visible.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct DatagramStats {
    /// Datagrams handed to the device.
    pub sent: u64,
    /// Datagrams received and queued for `recv_from` (including multicast ones).
    pub received: u64,
    /// Datagrams an rdma-async peer numbered and sent that never arrived (see above).
    pub dropped: u64,
    /// Datagrams longer than the buffer `recv_from` was given: the rest was discarded.
    pub truncated: u64,
    /// Received datagrams that were discarded as malformed (no usable address header).
    pub malformed: u64,
    /// Datagrams discarded because they did not come from the [`connect`](super::RDatagram::connect)ed peer.
    pub filtered: u64,
    /// Sends the device reported as failed after `send_to` returned.
    pub send_errors: u64,
}

#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) sent: AtomicU64,
    pub(crate) received: AtomicU64,
    pub(crate) dropped: AtomicU64,
    pub(crate) truncated: AtomicU64,
    pub(crate) malformed: AtomicU64,
    pub(crate) filtered: AtomicU64,
    pub(crate) send_errors: AtomicU64,
}

impl Counters {
    pub(crate) fn add(counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> DatagramStats {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        DatagramStats {
            sent: get(&self.sent),
            received: get(&self.received),
            dropped: get(&self.dropped),
            truncated: get(&self.truncated),
            malformed: get(&self.malformed),
            filtered: get(&self.filtered),
            send_errors: get(&self.send_errors),
        }
    }
}
