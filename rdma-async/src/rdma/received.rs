//! [`Received`]: what a receive delivered, and what consumed it.

use crate::verbs::WorkCompletion;

/// What consumed a posted receive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ReceivedOp {
    /// A send (or send with immediate): its bytes are in the receive's buffer.
    Send,
    /// An RDMA write with immediate: its bytes went to the memory the peer wrote, and the
    /// receive's buffer is untouched.
    RdmaWriteWithImm,
}

/// What a receive delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Received {
    op: ReceivedOp,
    /// The completion's byte count: the send's length, or the RDMA write's.
    byte_len: usize,
    imm: Option<u32>,
    qp_num: u32,
}

impl Received {
    /// Bytes written into the receive's buffer from the start of its range: the send's
    /// length, or 0 when an RDMA write with immediate consumed the receive (see
    /// [`Self::write_len`]). Never more than the range, so `&buf[..got.len()]` is always in
    /// bounds.
    pub fn len(&self) -> usize {
        match self.op {
            ReceivedOp::Send => self.byte_len,
            ReceivedOp::RdmaWriteWithImm => 0,
        }
    }

    /// Whether no bytes arrived in the buffer.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What consumed the receive.
    pub fn op(&self) -> ReceivedOp {
        self.op
    }

    /// The length of the RDMA write with immediate that consumed the receive (its bytes are
    /// in the memory the peer wrote); `None` for a send.
    pub fn write_len(&self) -> Option<usize> {
        (self.op == ReceivedOp::RdmaWriteWithImm).then_some(self.byte_len)
    }

    /// The immediate data of a send or RDMA write with immediate.
    pub fn imm(&self) -> Option<u32> {
        self.imm
    }

    /// The local queue pair that received it ([`super::RdmaConnection::qp_num`]): which
    /// connection a message on a [`super::SharedReceiveQueue`] came from.
    pub fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub(super) fn from_completion(wc: &WorkCompletion) -> Self {
        Received {
            op: if wc.is_rdma_write_with_imm() {
                ReceivedOp::RdmaWriteWithImm
            } else {
                ReceivedOp::Send
            },
            byte_len: wc.byte_len as usize,
            imm: wc.imm_data,
            qp_num: wc.qp_num,
        }
    }
}
