//! [`Resource`]: the kinds of verbs object whose creation can run out. The errors that name the
//! limit hit and the test hook that makes a creation fail both speak of them, so they live
//! below both.

/// A verbs object whose creation can run out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resource {
    /// A memory registration (`ibv_reg_mr`).
    MemoryRegion,
    /// A queue pair (`rdma_create_qp`).
    QueuePair,
    /// A completion queue (`ibv_create_cq`).
    CompletionQueue,
}
