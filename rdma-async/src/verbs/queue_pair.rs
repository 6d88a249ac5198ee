//! `ibv_qp`: a reliable-connected queue pair created through rdma_cm, and safe posting.
//!
//! Posting is safe here because the queue pair owns every buffer it can post from: work requests
//! name a buffer by index and a range that is checked against it, and `Drop` destroys the queue
//! pair (after which the device touches none of its buffers) before the buffers are freed.

use std::io;
use std::ptr::{self, NonNull};
use std::sync::Arc;

use rdma_async_sys as sys;

use super::cm_id::CmId;
use super::comp_queue::CompletionQueue;
use super::memory::RegisteredBuffer;
use super::protection_domain::ProtectionDomain;
use crate::error;

/// Queue sizes requested for a queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct QpCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_inline_data: u32,
    /// Gather entries per send work request (at most [`MAX_SEGMENTS`]).
    pub(crate) max_send_sge: u32,
}

/// A connected queue pair, with the registered buffers it posts from.
#[derive(Debug)]
pub(crate) struct QueuePair {
    id: Arc<CmId>,
    qp_num: u32,
    max_inline_data: u32,
    buffers: Vec<RegisteredBuffer>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: posting to a QP is thread-safe in libibverbs; the struct hands out no references into
// C memory or registered buffers.
unsafe impl Send for QueuePair {}
// SAFETY: as above.
unsafe impl Sync for QueuePair {}

/// A range of one of the queue pair's own buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Segment {
    /// Index into the queue pair's buffers.
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
}

/// One work request for the send queue.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WorkRequest<'a> {
    pub(crate) wr_id: u64,
    pub(crate) opcode: Opcode,
    pub(crate) payload: Payload<'a>,
    pub(crate) signaled: bool,
}

/// Most gather entries a work request may carry (a ring buffer's wrap needs two).
pub(crate) const MAX_SEGMENTS: usize = 2;

impl QueuePair {
    /// Creates the RC queue pair of `id` on `pd`. `buffers` must be registered on `pd`.
    pub(crate) fn new(
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: QpCaps,
        buffers: Vec<RegisteredBuffer>,
    ) -> io::Result<Self> {
        let id = pd.id().clone();
        // SAFETY: ibv_qp_init_attr is plain old data; zero is valid for every field.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = caps.max_send_sge.clamp(1, MAX_SEGMENTS as u32);
        attr.cap.max_recv_sge = 1;
        attr.cap.max_inline_data = caps.max_inline_data;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
        attr.sq_sig_all = 0;
        // SAFETY: id, pd and CQs are live and on the same device; `attr` is initialised.
        if unsafe { sys::rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut attr) } != 0 {
            return Err(error::last_error("rdma_create_qp"));
        }
        // SAFETY: on success rdma_create_qp stored the new QP in the id.
        let qp = unsafe { (*id.as_ptr()).qp };
        let qp = NonNull::new(qp).ok_or_else(|| error::call_error("rdma_create_qp", libc::EIO))?;
        // SAFETY: `qp` is the live QP just created.
        let qp_num = unsafe { (*qp.as_ptr()).qp_num };
        Ok(QueuePair {
            id,
            qp_num,
            max_inline_data: attr.cap.max_inline_data,
            buffers,
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _pd: pd,
        })
    }

    fn raw(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id's QP lives until our Drop.
        unsafe { (*self.id.as_ptr()).qp }
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    /// The inline limit the provider granted (it may exceed the one asked for).
    pub(crate) fn max_inline_data(&self) -> u32 {
        self.max_inline_data
    }

    pub(crate) fn buffer(&self, index: usize) -> &RegisteredBuffer {
        &self.buffers[index]
    }

    fn sge(&self, buffer: usize, offset: usize, len: usize) -> io::Result<sys::ibv_sge> {
        let buf = self
            .buffers
            .get(buffer)
            .ok_or_else(|| error::invalid_input(format!("no registered buffer {buffer}")))?;
        if offset.checked_add(len).is_none_or(|end| end > buf.len()) {
            return Err(error::invalid_input(format!(
                "work request range {offset}+{len} is outside the {}-byte buffer",
                buf.len()
            )));
        }
        let length =
            u32::try_from(len).map_err(|_| error::invalid_input("work request too long"))?;
        Ok(sys::ibv_sge {
            addr: buf.addr(offset),
            length,
            lkey: buf.lkey(),
        })
    }

    /// Posts one work request to the send queue.
    pub(crate) fn post(&self, req: &WorkRequest<'_>) -> io::Result<()> {
        let mut sges = [sys::ibv_sge {
            addr: 0,
            length: 0,
            lkey: 0,
        }; MAX_SEGMENTS];
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = req.wr_id;
        let num_sge = match req.payload {
            Payload::Empty => 0,
            Payload::Segments(segments) => {
                if segments.len() > MAX_SEGMENTS {
                    return Err(error::invalid_input("too many gather segments"));
                }
                for (sge, seg) in sges.iter_mut().zip(segments) {
                    *sge = self.sge(seg.buffer, seg.offset, seg.len)?;
                }
                segments.len()
            }
            Payload::Inline(bytes) => {
                // The device must copy the bytes while posting: a longer "inline" request would
                // leave it reading `bytes` after this call returned.
                if bytes.len() > self.max_inline_data as usize {
                    return Err(error::invalid_input(format!(
                        "{} bytes exceed the queue pair's inline limit of {}",
                        bytes.len(),
                        self.max_inline_data
                    )));
                }
                let length = u32::try_from(bytes.len())
                    .map_err(|_| error::invalid_input("inline too long"))?;
                sges[0] = sys::ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length,
                    lkey: 0,
                };
                wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE;
                usize::from(!bytes.is_empty())
            }
        };
        wr.sg_list = sges.as_mut_ptr();
        wr.num_sge = num_sge as i32;
        let imm = match req.opcode {
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
                imm,
            } => {
                wr.opcode = if imm.is_some() {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                };
                wr.wr.rdma = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_1 { remote_addr, rkey };
                imm
            }
        };
        if let Some(imm) = imm {
            wr.__bindgen_anon_1.imm_data = imm.to_be();
        }
        if req.signaled {
            wr.send_flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED;
        }
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live. Gather entries cover checked ranges of buffers this QP owns,
        // which stay allocated and registered until after the QP is destroyed in Drop; an inline
        // payload is copied by the provider during this call (its length was checked against
        // the QP's inline limit). A remote address is the peer's memory, which the device accesses only
        // through the peer's rkey.
        let ret = unsafe { sys::rdma_async_post_send(self.raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(error::call_error("ibv_post_send", ret));
        }
        Ok(())
    }

    /// Posts a receive into `segment`, or with no buffer (for RDMA writes with immediate,
    /// which deliver only the immediate).
    pub(crate) fn post_recv(&self, wr_id: u64, segment: Option<Segment>) -> io::Result<()> {
        let mut sge = match segment {
            Some(seg) => self.sge(seg.buffer, seg.offset, seg.len)?,
            None => sys::ibv_sge {
                addr: 0,
                length: 0,
                lkey: 0,
            },
        };
        // SAFETY: ibv_recv_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = i32::from(segment.is_some());
        let mut bad = ptr::null_mut();
        // SAFETY: as in `post`: the device may write only a checked range of a buffer this QP
        // owns and frees after destroying the QP.
        let ret = unsafe { sys::rdma_async_post_recv(self.raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(error::call_error("ibv_post_recv", ret));
        }
        Ok(())
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        // SAFETY: the QP is live and destroyed once. After this returns the device no longer
        // accesses the QP's work requests, so the buffers (dropped after this) can be freed.
        unsafe { sys::rdma_destroy_qp(self.id.as_ptr()) };
    }
}
