//! The work requests the core asks the driver to post: [`DataWrite`] and [`ControlWrite`].
//!
//! Both are plain data: the driver turns them into `ibv_send_wr`s (RDMA WRITE WITH IMM, or a
//! plain RDMA WRITE for a keepalive), converts `imm` to big-endian, and posts them **in the
//! order the core returned them** (completions are matched in that order), signaled only when
//! [`DataWrite::signaled`] or [`ControlWrite::signaled`] says so.

use super::imm::CtrlCode;
use super::ring::Segments;

/// One chunk of application data to write into the peer's receive ring.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DataWrite {
    /// The work-request id to post with; pass it back to `handle_send_completion`.
    pub(crate) wr_id: u64,
    /// Post with `IBV_SEND_SIGNALED`. Most chunks go unsignaled: the completion of a later
    /// signaled send completes them too.
    pub(crate) signaled: bool,
    /// Bytes in this chunk: the next `len` bytes of the application's buffer.
    pub(crate) len: usize,
    /// Where in the send ring to copy the chunk to and send it from (1 segment, or 2 when it
    /// wraps the end of the ring: post 2 SGEs). Empty when `inline`.
    pub(crate) sbuf: Segments,
    /// `len <= inline_size`: post with `IBV_SEND_INLINE` straight from the application's
    /// buffer; no copy into the send ring. The ring space is still charged until completion,
    /// as in C.
    pub(crate) inline: bool,
    /// Remote address (inside the buffer the peer granted).
    pub(crate) remote_addr: u64,
    /// Remote key of the peer's receive ring.
    pub(crate) rkey: u32,
    /// Host-order immediate word (`RS_OP_DATA | len`).
    pub(crate) imm: u32,
}

/// What a [`ControlWrite`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ControlKind {
    /// A 16-byte SGL entry (half of our receive ring) written into the peer's target SGL slot
    /// `slot`, plus a new send limit.
    SglUpdate {
        /// The peer's target SGL slot written.
        slot: u32,
        /// The new absolute send limit in the immediate.
        limit: u16,
    },
    /// A 0-byte write with immediate carrying only a new send limit.
    Credits {
        /// The new absolute send limit in the immediate.
        limit: u16,
    },
    /// A 0-byte write with an `RS_OP_CTRL` immediate (SHUTDOWN or DISCONNECT), or, for
    /// `Keepalive`, a plain 0-byte RDMA WRITE without immediate to address 0, rkey 0.
    Ctrl(CtrlCode),
}

/// A memory-window bind to post right before the control write that carries it: it gives the
/// window over receive-ring half `half` the key `rkey` (zero-copy reads). Unsignaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct WindowBind {
    /// The work-request id to post with.
    pub(crate) wr_id: u64,
    pub(crate) half: usize,
    pub(crate) rkey: u32,
}

/// What the driver does for a zero-copy read (`Connection::lend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LendStep {
    /// View `len` bytes at ring offset `offset`; `consume` them when done. No peer can write
    /// them until then.
    Ready { offset: usize, len: usize },
    /// Deregister half `half`'s first registration, call `Connection::deregistered(half, key)`,
    /// and ask again.
    Deregister { half: usize, key: u32 },
    /// Post a signaled local invalidation of window key `key` (over half `half`) with `wr_id`;
    /// ask again after its completion was handled.
    Invalidate { wr_id: u64, half: usize, key: u32 },
    /// A revocation is under way: wait for completions, then ask again.
    Wait,
    /// Copy the bytes instead (the peer is still filling their half, or the connection ended).
    Copy,
    /// Nothing is readable.
    Empty,
}

/// A control message: credits, a receive-buffer grant, or a CTRL message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ControlWrite {
    /// The work-request id to post with; pass it back to `handle_send_completion`.
    pub(crate) wr_id: u64,
    /// What it is.
    pub(crate) kind: ControlKind,
    /// Post with `IBV_SEND_SIGNALED`: CTRL messages always, credit and buffer updates only
    /// when they take the last free control slot (see `Connection::plan_control`).
    pub(crate) signaled: bool,
    /// Host-order immediate word; `None` means a plain RDMA WRITE (keepalive).
    pub(crate) imm: Option<u32>,
    /// The 16 bytes to write (SGL updates only), already in the peer's byte order.
    pub(crate) payload: Option<[u8; 16]>,
    /// Remote address (0 for 0-byte writes).
    pub(crate) remote_addr: u64,
    /// Remote key (0 for 0-byte writes).
    pub(crate) rkey: u32,
    /// Whether the payload may go inline (`inline_size >= 16`). Otherwise the driver copies it
    /// into its registered control buffer number `ctrl_slot` and sends from there.
    pub(crate) inline: bool,
    /// `0..RS_QP_CTRL_SIZE`: which 16-byte registered control buffer to use when not inline.
    /// A slot is reused only after the message that used it completed.
    pub(crate) ctrl_slot: usize,
    /// A window bind to post first (SGL updates of a zero-copy ring only).
    pub(crate) bind: Option<WindowBind>,
}
