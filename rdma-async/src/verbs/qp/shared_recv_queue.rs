//! `ibv_srq`: a shared receive queue, posted from caller memory held in its own table.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::held_posting::post_recv_into;
use super::in_flight::{Held, InFlightTable, Ticket};
use super::work_request::{MAX_SEGMENTS, Segment};
use crate::error;
use crate::verbs::pd::ProtectionDomain;

/// A shared receive queue: receives posted here are consumed by any queue pair created on it.
///
/// Queue pairs that use it hold an `Arc` to it, so it is destroyed after all of them; its table
/// (a field, dropped after `Drop::drop` destroyed the queue) keeps posted buffers until then.
#[derive(Debug)]
pub(crate) struct SharedRecvQueue {
    raw: NonNull<sys::ibv_srq>,
    table: Arc<InFlightTable>,
    max_sge: u32,
    pd: Arc<ProtectionDomain>,
}

// SAFETY: libibverbs SRQs may be posted to from any thread; no reference into C memory escapes.
unsafe impl Send for SharedRecvQueue {}
// SAFETY: as above.
unsafe impl Sync for SharedRecvQueue {}

impl SharedRecvQueue {
    /// Creates a shared receive queue of `max_wr` receives with `max_sge` entries each.
    pub(crate) fn new(pd: Arc<ProtectionDomain>, max_wr: u32, max_sge: u32) -> io::Result<Self> {
        // SAFETY: ibv_srq_init_attr is plain old data; zero is valid for every field.
        let mut attr: sys::ibv_srq_init_attr = unsafe { std::mem::zeroed() };
        attr.attr.max_wr = max_wr.max(1);
        attr.attr.max_sge = max_sge.clamp(1, MAX_SEGMENTS as u32);
        // SAFETY: `pd` is live and `attr` initialised; the provider writes back the granted sizes.
        let raw = unsafe { sys::ibv_create_srq(pd.as_ptr(), &mut attr) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_create_srq"))?;
        Ok(SharedRecvQueue {
            raw,
            // The provider may grant more receives than asked for; the table holds them all.
            table: Arc::new(InFlightTable::new(attr.attr.max_wr as usize, true)),
            max_sge: attr.attr.max_sge,
            pd,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_srq {
        self.raw.as_ptr()
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    pub(crate) fn table(&self) -> &Arc<InFlightTable> {
        &self.table
    }

    /// Moves `held` into the table and posts a receive scattering into `segments`.
    pub(crate) fn post_recv_caller(
        &self,
        held: Held,
        segments: &[Segment],
    ) -> Result<Ticket, (io::Error, Held)> {
        post_recv_into(&self.table, held, segments, self.max_sge, |wr, bad| {
            // SAFETY: the SRQ is live; every entry covers a checked range of a buffer that the
            // table holds until this request's completion is polled, and the table outlives the
            // SRQ (it is a field, dropped after `Drop::drop` destroyed the queue).
            let ret = unsafe { sys::rdma_async_post_srq_recv(self.raw.as_ptr(), wr, bad) };
            if ret != 0 {
                return Err(error::call_error("ibv_post_srq_recv", ret));
            }
            Ok(())
        })
    }
}

impl Drop for SharedRecvQueue {
    fn drop(&mut self) {
        // SAFETY: the SRQ is live and destroyed once; every queue pair on it holds an `Arc` to
        // it, so none is left. Buffers still posted are freed after this, with the table.
        if unsafe { sys::ibv_destroy_srq(self.raw.as_ptr()) } != 0 {
            // The device may still own the posted buffers: leak them rather than free them.
            std::mem::forget(self.table.clone());
            tracing::warn!("ibv_destroy_srq failed; leaking its posted buffers");
        }
    }
}
