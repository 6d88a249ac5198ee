//! `ibv_qp` of type UD: an unreliable-datagram queue pair created through rdma_cm, with the
//! registered send and receive memory it posts from.
//!
//! As with the connected [`super::OwnedBufferQueuePair`], posting is safe because the queue pair
//! owns the memory: work requests name a checked range of its own buffers, and `Drop` destroys
//! the queue pair before the buffers are freed (or, when destroying it fails, leaks them with it).

use std::io;
use std::mem::ManuallyDrop;
use std::ptr;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::queue_pair::keep_forever;
use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::cq::CompletionQueue;
use crate::verbs::mr::{Access, RegisteredBuffer};
use crate::verbs::pd::{AddressHandle, ProtectionDomain};

/// Queue depths and buffer sizes of a datagram queue pair.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    /// Bytes of registered send memory.
    pub(crate) send_bytes: usize,
    /// Bytes of registered receive memory.
    pub(crate) recv_bytes: usize,
}

/// One datagram to post: a range of the send buffer and where it goes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct UdSend<'a> {
    pub(crate) wr_id: u64,
    pub(crate) offset: usize,
    pub(crate) len: usize,
    pub(crate) ah: &'a AddressHandle,
    pub(crate) remote_qpn: u32,
    pub(crate) remote_qkey: u32,
    /// Immediate data (host order) carried with the datagram.
    pub(crate) imm: u32,
}

/// A datagram queue pair on the rdma_cm id it was created on.
#[derive(Debug)]
pub(crate) struct UdQueuePair {
    id: Arc<CmId>,
    qp_num: u32,
    qkey: u32,
    /// The buffers work requests point into: dropped after the queue pair was destroyed, and
    /// never if that failed.
    send_buf: ManuallyDrop<RegisteredBuffer>,
    recv_buf: ManuallyDrop<RegisteredBuffer>,
    _send_cq: Arc<CompletionQueue>,
    _recv_cq: Arc<CompletionQueue>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: posting to a QP is thread-safe in libibverbs; the struct hands out no references into
// C memory, and its buffers are only accessed through raw copies.
unsafe impl Send for UdQueuePair {}
// SAFETY: as above.
unsafe impl Sync for UdQueuePair {}

impl UdQueuePair {
    /// Creates the UD queue pair of `id` (bound to a device) on `pd` (of that device) and its
    /// buffers. librdmacm moves it to ready-to-send with the id's P_Key and Q_Key
    /// (`RDMA_UDP_QKEY`).
    pub(crate) fn new(
        id: Arc<CmId>,
        pd: Arc<ProtectionDomain>,
        send_cq: Arc<CompletionQueue>,
        recv_cq: Arc<CompletionQueue>,
        caps: UdCaps,
    ) -> io::Result<Self> {
        let send_buf = RegisteredBuffer::new(pd.clone(), caps.send_bytes, Access::default())?;
        let recv_buf = RegisteredBuffer::new(pd.clone(), caps.recv_bytes, Access::default())?;
        // SAFETY: ibv_qp_init_attr is plain old data; zero is valid for every field.
        let mut attr: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        attr.send_cq = send_cq.as_ptr();
        attr.recv_cq = recv_cq.as_ptr();
        attr.cap.max_send_wr = caps.max_send_wr;
        attr.cap.max_recv_wr = caps.max_recv_wr;
        attr.cap.max_send_sge = 1;
        attr.cap.max_recv_sge = 1;
        attr.qp_type = sys::ibv_qp_type::IBV_QPT_UD;
        attr.sq_sig_all = 0;
        // SAFETY: the CQs in `attr` are on `pd`'s device and are kept by the queue
        // pair, which destroys itself before releasing them.
        let qp_num = unsafe { id.create_qp(&pd, &mut attr)? };
        let mut ud = UdQueuePair {
            id,
            qp_num,
            qkey: 0,
            send_buf: ManuallyDrop::new(send_buf),
            recv_buf: ManuallyDrop::new(recv_buf),
            _send_cq: send_cq,
            _recv_cq: recv_cq,
            _pd: pd,
        };
        ud.qkey = ud.query_qkey()?;
        Ok(ud)
    }

    fn raw(&self) -> *mut sys::ibv_qp {
        // SAFETY: the id's QP lives until our Drop.
        unsafe { (*self.id.as_ptr()).qp }
    }

    /// The Q_Key librdmacm gave the queue pair (what senders must use, as `udaddy` asks).
    fn query_qkey(&self) -> io::Result<u32> {
        // SAFETY: both attribute structs are plain old data; zero is valid for every field.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = sys::ibv_qp_attr_mask::IBV_QP_QKEY as i32;
        // SAFETY: the QP is live and both out-pointers are valid locals.
        let ret = unsafe { sys::ibv_query_qp(self.raw(), &mut attr, mask, &mut init) };
        if ret != 0 {
            return Err(error::call_error("ibv_query_qp", ret));
        }
        Ok(attr.qkey)
    }

    pub(crate) fn qp_num(&self) -> u32 {
        self.qp_num
    }

    pub(crate) fn qkey(&self) -> u32 {
        self.qkey
    }

    pub(crate) fn send_buffer(&self) -> &RegisteredBuffer {
        &self.send_buf
    }

    pub(crate) fn recv_buffer(&self) -> &RegisteredBuffer {
        &self.recv_buf
    }

    /// Posts one signaled datagram send with immediate data.
    pub(crate) fn post_send(&self, send: &UdSend<'_>) -> io::Result<()> {
        let mut sge = self.send_buf.sge(send.offset, send.len)?;
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = send.wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = i32::from(send.len > 0);
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED;
        wr.__bindgen_anon_1.imm_data = send.imm.to_be();
        wr.wr.ud = sys::ibv_send_wr__bindgen_ty_2__bindgen_ty_3 {
            ah: send.ah.as_ptr(),
            remote_qpn: send.remote_qpn,
            remote_qkey: send.remote_qkey,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is live. The gather entry covers a checked range of the send buffer,
        // which stays registered until after the QP is destroyed in Drop; the address handle is
        // live, and the owner keeps it alive until the send completes.
        let ret = unsafe { sys::rdma_async_post_send(self.raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(error::call_error("ibv_post_send", ret));
        }
        Ok(())
    }

    /// Posts a receive into `len` bytes of the receive buffer at `offset` (the first
    /// [`GRH_LEN`](crate::verbs::pd::GRH_LEN) of which receive the GRH).
    pub(crate) fn post_recv(&self, wr_id: u64, offset: usize, len: usize) -> io::Result<()> {
        let mut sge = self.recv_buf.sge(offset, len)?;
        // SAFETY: ibv_recv_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad = ptr::null_mut();
        // SAFETY: the device may write only a checked range of the receive buffer, which this
        // QP owns and frees after destroying the QP.
        let ret = unsafe { sys::rdma_async_post_recv(self.raw(), &mut wr, &mut bad) };
        if ret != 0 {
            return Err(error::call_error("ibv_post_recv", ret));
        }
        Ok(())
    }

    /// Starts delivering the multicast group `gid` (`lid` on InfiniBand) to this queue pair.
    pub(crate) fn attach_mcast(&self, gid: [u8; 16], lid: u16) -> io::Result<()> {
        let gid = sys::ibv_gid { raw: gid };
        // SAFETY: the QP is live; `gid` is a local the call only reads.
        let ret = unsafe { sys::ibv_attach_mcast(self.raw(), &gid, lid) };
        if ret != 0 {
            return Err(error::call_error("ibv_attach_mcast", ret));
        }
        Ok(())
    }

    /// Stops delivering the multicast group `gid` to this queue pair.
    pub(crate) fn detach_mcast(&self, gid: [u8; 16], lid: u16) -> io::Result<()> {
        let gid = sys::ibv_gid { raw: gid };
        // SAFETY: as in `attach_mcast`.
        let ret = unsafe { sys::ibv_detach_mcast(self.raw(), &gid, lid) };
        if ret != 0 {
            return Err(error::call_error("ibv_detach_mcast", ret));
        }
        Ok(())
    }
}

/// The largest datagram payload the port of `id` (bound to a device) carries: its active
/// MTU, as `udaddy` and `mckey` check it.
pub(crate) fn port_mtu(id: &CmId) -> io::Result<usize> {
    let ctx = id.verbs()?;
    // SAFETY: ibv_port_attr is plain old data; zero is valid for every field.
    let mut attr: sys::ibv_port_attr = unsafe { std::mem::zeroed() };
    // SAFETY: the context is live (the id holds it) and `attr` is a valid out-pointer.
    let ret = unsafe { sys::rdma_async_query_port(ctx.as_ptr(), id.port_num(), &mut attr) };
    if ret != 0 {
        return Err(error::call_error("ibv_query_port", ret));
    }
    // enum ibv_mtu: 1 = 256 bytes ... 5 = 4096 bytes.
    Ok(match attr.active_mtu {
        m @ 1..=5 => 128usize << m,
        _ => 256,
    })
}

impl Drop for UdQueuePair {
    fn drop(&mut self) {
        // SAFETY: the id has its QP, used by nothing else now (`self` is being dropped).
        match unsafe { self.id.destroy_qp() } {
            Ok(()) => {
                crate::verbs::device::QUEUE_PAIRS.destroyed(0);
                // SAFETY: dropped once, here; the device no longer accesses the QP's
                // work requests, so their buffers can be freed.
                unsafe { ManuallyDrop::drop(&mut self.send_buf) };
                // SAFETY: as above.
                unsafe { ManuallyDrop::drop(&mut self.recv_buf) };
            }
            Err(e) => {
                // The device may still use the buffers: they, and the objects the QP uses,
                // are leaked with it.
                tracing::warn!(
                    error = %e,
                    qp_num = self.qp_num,
                    "a datagram queue pair could not be destroyed; keeping it and its buffers \
                     (leaked)"
                );
                keep_forever(&self.id, [&self._send_cq, &self._recv_cq], &self._pd);
            }
        }
    }
}
