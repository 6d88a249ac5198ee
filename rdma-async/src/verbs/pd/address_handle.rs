//! `ibv_ah`: how a datagram queue pair addresses a remote port (or a multicast group).

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::protection_domain::ProtectionDomain;
use crate::error;
use crate::verbs::cm::AhAttr;
use crate::verbs::cq::WorkCompletion;

/// Bytes of the Global Route Header the device writes in front of every received datagram.
pub(crate) const GRH_LEN: usize = 40;

/// An owned address handle on a protection domain.
#[derive(Debug)]
pub(crate) struct AddressHandle {
    raw: NonNull<sys::ibv_ah>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: address handles are immutable after creation and may be used from any thread.
unsafe impl Send for AddressHandle {}
// SAFETY: as above; posting a send that names the handle only reads it.
unsafe impl Sync for AddressHandle {}

impl AddressHandle {
    /// Creates a handle from attributes rdma_cm reported (SIDR reply or multicast join).
    pub(crate) fn new(pd: Arc<ProtectionDomain>, attr: &AhAttr) -> io::Result<Self> {
        let mut attr = attr.0;
        // SAFETY: the domain is live and `attr` is an initialised attribute struct that
        // ibv_create_ah only reads during the call.
        let raw = unsafe { sys::ibv_create_ah(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_create_ah"))?;
        Ok(AddressHandle { raw, _pd: pd })
    }

    /// Creates a handle that answers the sender of a received datagram, from its work
    /// completion and the `GRH_LEN` bytes the device wrote in front of it (`ibv_create_ah_from_wc`).
    /// It may block: on RoCE the kernel can resolve the sender's neighbour (ARP or ND) during
    /// the call, so async callers make it on a blocking thread.
    pub(crate) fn reply_to(
        pd: Arc<ProtectionDomain>,
        wc: &WorkCompletion,
        grh: &[u8; GRH_LEN],
        port_num: u8,
    ) -> io::Result<Self> {
        // SAFETY: ibv_wc is plain old data; zero is valid for every field.
        let mut sys_wc: sys::ibv_wc = unsafe { std::mem::zeroed() };
        sys_wc.wr_id = wc.wr_id;
        sys_wc.status = wc.status.0;
        sys_wc.byte_len = wc.byte_len;
        sys_wc.src_qp = wc.src_qp;
        sys_wc.wc_flags = wc.wc_flags;
        sys_wc.pkey_index = wc.pkey_index;
        sys_wc.slid = wc.slid;
        sys_wc.sl = wc.sl;
        sys_wc.dlid_path_bits = wc.dlid_path_bits;
        #[cfg(rdma_async_hooks)]
        super::reply_handle_hold::wait_if_held();
        // A copy of the header in ordinary memory: libibverbs reads it through a pointer, and
        // the received bytes live in registered memory that must not be referenced.
        // SAFETY: ibv_grh is plain old data of exactly GRH_LEN bytes; any bytes are valid.
        let mut sys_grh: sys::ibv_grh = unsafe { std::mem::transmute(*grh) };
        // SAFETY: the domain is live; `sys_wc` and `sys_grh` are initialised locals that the
        // call only reads.
        let raw =
            unsafe { sys::ibv_create_ah_from_wc(pd.as_ptr(), &mut sys_wc, &mut sys_grh, port_num) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_create_ah_from_wc"))?;
        Ok(AddressHandle { raw, _pd: pd })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_ah {
        self.raw.as_ptr()
    }
}

impl Drop for AddressHandle {
    fn drop(&mut self) {
        // SAFETY: the handle is live and destroyed once. Owners keep an `Arc` to it in every
        // send slot that named it until that send completes or the queue pair is destroyed.
        unsafe { sys::ibv_destroy_ah(self.raw.as_ptr()) };
    }
}

const _: () = assert!(std::mem::size_of::<sys::ibv_grh>() == GRH_LEN);
