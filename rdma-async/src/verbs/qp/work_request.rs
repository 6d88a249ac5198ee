//! The vocabulary of work requests: what a queue pair is asked to do ([`Opcode`]), over which
//! bytes ([`Segment`], [`Payload`]), as one request of the send queue ([`WorkRequest`]); what
//! became of a request posted from caller memory ([`Posted`], [`Doorbell`]); and how an opcode is
//! written into a C `ibv_send_wr`.
//!
//! Both kinds of queue pair, the send chain and the shared receive queue speak it, so it lives
//! below all of them.

use rdma_async_sys as sys;

use super::in_flight::Ticket;

/// Whether a send-queue request reached the device when it was posted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Doorbell {
    /// Posted with its own `ibv_post_send`.
    Rung,
    /// Left for [`CallerMemoryQueuePair::ring`](super::CallerMemoryQueuePair::ring); `first`
    /// when the requests waiting before it were none, so that its operation is the one that
    /// rings.
    Deferred { first: bool },
}

/// A request moved into the in-flight table and posted, or left to be posted.
#[derive(Debug)]
pub(crate) struct Posted {
    pub(crate) ticket: Ticket,
    pub(crate) doorbell: Doorbell,
}

impl From<Ticket> for Posted {
    fn from(ticket: Ticket) -> Self {
        Posted {
            ticket,
            doorbell: Doorbell::Rung,
        }
    }
}

/// A range of one buffer of a work request: one of an
/// [`OwnedBufferQueuePair`](super::OwnedBufferQueuePair)'s own buffers, or one of the
/// [`Held`](super::Held) buffers a [`CallerMemoryQueuePair`](super::CallerMemoryQueuePair) posts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index into the queue pair's buffers (or into the `Held` buffers).
    pub(crate) buffer: usize,
    pub(crate) offset: usize,
    pub(crate) len: usize,
}

/// Where the bytes of a send or write come from.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Payload<'a> {
    /// No bytes (a zero-length write with immediate, for example).
    Empty,
    /// Up to [`MAX_SEGMENTS`] ranges of the queue pair's buffers, gathered in order.
    Segments(&'a [Segment]),
    /// Bytes copied into the work request itself (at most `max_inline_data`).
    Inline(&'a [u8]),
    /// `len` bytes at `offset` of a caller's buffer attached to the queue pair
    /// ([`OwnedBufferQueuePair::attach`](super::OwnedBufferQueuePair::attach)).
    Attached { id: u64, offset: usize, len: usize },
}

/// What a work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opcode {
    /// A send, consuming one of the peer's posted receives.
    Send { imm: Option<u32> },
    /// An RDMA write into the peer's registered memory at `remote_addr`, which the peer's
    /// `rkey` protects; with an immediate it also consumes one of the peer's posted receives.
    Write {
        remote_addr: u64,
        rkey: u32,
        imm: Option<u32>,
    },
    /// An RDMA read of the peer's memory at `remote_addr` into the scatter list.
    Read { remote_addr: u64, rkey: u32 },
    /// An atomic compare-and-swap of the peer's 8-byte word; the old value lands in the list.
    CompareSwap {
        remote_addr: u64,
        rkey: u32,
        compare: u64,
        swap: u64,
    },
    /// An atomic fetch-and-add of the peer's 8-byte word; the old value lands in the list.
    FetchAdd {
        remote_addr: u64,
        rkey: u32,
        add: u64,
    },
}

/// One work request for the send queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkRequest<'a> {
    pub(crate) wr_id: u64,
    pub(crate) opcode: Opcode,
    pub(crate) payload: Payload<'a>,
    pub(crate) signaled: bool,
}

/// Most scatter/gather entries a work request may carry (a ring buffer's wrap needs two; the
/// vectored operations of caller memory up to this many).
pub(crate) const MAX_SEGMENTS: usize = 16;

/// Sets the opcode, its remote address and key or atomic operands, and the immediate data.
pub(super) fn set_opcode(wr: &mut sys::ibv_send_wr, opcode: Opcode) {
    let imm = match opcode {
        Opcode::Send { imm } => {
            wr.opcode = if imm.is_some() {
                sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM
            } else {
                sys::ibv_wr_opcode::IBV_WR_SEND
            };
            imm
        }
        Opcode::Write {
            remote_addr,
            rkey,
            imm: Some(imm),
        } => {
            set_write_with_imm(wr, remote_addr, rkey, imm);
            return;
        }
        Opcode::Write {
            remote_addr,
            rkey,
            imm: None,
        } => {
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            None
        }
        Opcode::Read { remote_addr, rkey } => {
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_READ;
            wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
            None
        }
        Opcode::CompareSwap {
            remote_addr,
            rkey,
            compare,
            swap,
        } => {
            let op = sys::ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP;
            set_atomic(wr, op, remote_addr, rkey, compare, swap);
            None
        }
        Opcode::FetchAdd {
            remote_addr,
            rkey,
            add,
        } => {
            let op = sys::ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD;
            set_atomic(wr, op, remote_addr, rkey, add, 0);
            None
        }
    };
    if let Some(imm) = imm {
        wr.__bindgen_anon_1.imm_data = imm.to_be();
    }
}

/// Sets an RDMA write of its gather entries to `remote_addr` under `rkey`, with the immediate
/// `imm` (in network order on the wire). Always inlined: a stream's data write sets it
/// straight, without an [`Opcode`] to match.
#[inline(always)]
pub(super) fn set_write_with_imm(wr: &mut sys::ibv_send_wr, remote_addr: u64, rkey: u32, imm: u32) {
    wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
    wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
    wr.__bindgen_anon_1.imm_data = imm.to_be();
}

fn set_atomic(
    wr: &mut sys::ibv_send_wr,
    opcode: sys::ibv_wr_opcode::Type,
    remote_addr: u64,
    rkey: u32,
    compare_add: u64,
    swap: u64,
) {
    wr.opcode = opcode;
    wr.wr.atomic = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_2 {
        remote_addr,
        compare_add,
        swap,
        rkey,
    };
}
