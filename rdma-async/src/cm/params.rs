//! Connection parameters of `rdma_connect(3)` and `rdma_accept(3)`.

use std::io;

use crate::error;
use crate::verbs::RawConnParam;

/// Most private data a connection request can carry on InfiniBand and RoCE (92 bytes in the CM
/// REQ less rdma_cm's 36-byte header).
pub const MAX_CONNECT_PRIVATE_DATA: usize = 56;
/// Most private data an accept (CM REP) can carry on InfiniBand and RoCE.
pub const MAX_ACCEPT_PRIVATE_DATA: usize = 196;
/// Most private data a reject (CM REJ) can carry on InfiniBand and RoCE.
pub const MAX_REJECT_PRIVATE_DATA: usize = 148;

/// The default transport retry count (see [`ConnParams`]).
pub(crate) const DEFAULT_RETRY_COUNT: u8 = 6;

/// Parameters sent with a connection request or an accept, as in `struct rdma_conn_param`.
///
/// Private data travels in the connection handshake itself. InfiniBand and RoCE pad it with
/// zeros to the message's fixed size, so the peer may see more bytes than were sent (a request's
/// private data always arrives as 56 bytes): put a length in it if the exact size matters.
///
/// The defaults are those of rsockets (flow control on, 7 RNR retries, which means for ever,
/// one outstanding RDMA read or atomic each way) but for 6 transport retries where rsockets has
/// 7: Soft-RoCE (rxe) treats a transport retry count of 7 as "retry for ever", so a peer host
/// that vanished would never be noticed there; hardware retries 7 times, so 6 costs nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnParams {
    private_data: Vec<u8>,
    responder_resources: u8,
    initiator_depth: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    min_rnr_timer: u8,
    flow_control: bool,
}

/// The default [`ConnParams::min_rnr_timer`]: 0.64 ms, perftest's value.
const DEFAULT_MIN_RNR_TIMER: u8 = 12;

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            private_data: Vec::new(),
            responder_resources: 1,
            initiator_depth: 1,
            retry_count: DEFAULT_RETRY_COUNT,
            rnr_retry_count: 7,
            min_rnr_timer: DEFAULT_MIN_RNR_TIMER,
            flow_control: true,
        }
    }
}

impl ConnParams {
    /// Parameters with the defaults.
    pub fn new() -> Self {
        Self::default()
    }

    /// Private data for the peer (at most [`MAX_CONNECT_PRIVATE_DATA`] bytes in a request and
    /// [`MAX_ACCEPT_PRIVATE_DATA`] in an accept; checked when used).
    pub fn private_data(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.private_data = data.into();
        self
    }

    /// How many RDMA reads and atomics the peer may have outstanding against us.
    pub fn responder_resources(mut self, n: u8) -> Self {
        self.responder_resources = n;
        self
    }

    /// How many RDMA reads and atomics we may have outstanding against the peer.
    pub fn initiator_depth(mut self, n: u8) -> Self {
        self.initiator_depth = n;
        self
    }

    /// Transport retries after a timeout (0..=7; default 6). Each waits the ACK timeout
    /// (`IdOptions::ack_timeout`), so a dead peer fails an operation after about
    /// `(n + 1) × 4.096 µs × 2^ack_timeout`. Soft-RoCE treats 7 as "retry for ever".
    pub fn retry_count(mut self, n: u8) -> Self {
        self.retry_count = n.min(7);
        self
    }

    /// Retries when the peer has no receive posted (0..=7; 7 retries for ever).
    pub fn rnr_retry_count(mut self, n: u8) -> Self {
        self.rnr_retry_count = n.min(7);
        self
    }

    /// How long a peer waits before resending a message that found no receive posted here (an
    /// RNR NAK), in the InfiniBand encoding of `ibv_qp_attr::min_rnr_timer` (1 = 0.01 ms, 12 =
    /// 0.64 ms, 31 = 491.52 ms; 0 = 655.36 ms). Default 12 (0.64 ms), as perftest sets it;
    /// rdma_cm's own is 0, which stalls a message sender (`Endpoint`, `RdmaConnection` sends)
    /// that outruns its receiver for two thirds of a second each time. Set on the connection's
    /// queue pair once it is established. Soft-RoCE waits at least one kernel tick (4 ms at
    /// `HZ=250`) whatever is asked.
    pub fn min_rnr_timer(mut self, code: u8) -> Self {
        self.min_rnr_timer = code.min(31);
        self
    }

    pub(crate) fn get_min_rnr_timer(&self) -> u8 {
        self.min_rnr_timer
    }

    /// Whether the transport's end-to-end flow control is on (default `true`).
    pub fn flow_control(mut self, on: bool) -> Self {
        self.flow_control = on;
        self
    }

    pub(crate) fn get_responder_resources(&self) -> u8 {
        self.responder_resources
    }

    pub(crate) fn get_initiator_depth(&self) -> u8 {
        self.initiator_depth
    }

    pub(crate) fn to_raw(&self, max_private_data: usize, what: &str) -> io::Result<RawConnParam> {
        if self.private_data.len() > max_private_data {
            return Err(error::invalid_input(format!(
                "{what} private data is {} bytes; at most {max_private_data} fit",
                self.private_data.len()
            )));
        }
        Ok(RawConnParam {
            private_data: self.private_data.clone(),
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: u8::from(self.flow_control),
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_oversized_private_data() {
        let p = ConnParams::new().private_data(vec![1; MAX_CONNECT_PRIVATE_DATA + 1]);
        let err = p.to_raw(MAX_CONNECT_PRIVATE_DATA, "connect").unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("57 bytes"), "{err}");
        let p = ConnParams::new().private_data(vec![1; MAX_CONNECT_PRIVATE_DATA]);
        assert_eq!(
            p.to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")
                .unwrap()
                .private_data
                .len(),
            56
        );
    }

    #[test]
    fn clamps_retry_counts() {
        let raw = ConnParams::new()
            .retry_count(9)
            .rnr_retry_count(200)
            .to_raw(0, "x")
            .unwrap();
        assert_eq!((raw.retry_count, raw.rnr_retry_count), (7, 7));
    }
}
