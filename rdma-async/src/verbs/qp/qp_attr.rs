//! `ibv_query_qp` and `ibv_modify_qp` on a connection's queue pair after rdma_cm set it up:
//! reading back what it set (so tests can check that an option reached the queue pair) and its
//! state, and tuning what rdma_cm does not (the RNR timer).

use std::io;

use rdma_async_sys as sys;

use crate::error;
use crate::verbs::cm::CmId;

impl CmId {
    /// The local ACK timeout exponent of the id's queue pair (`ibv_qp_attr::timeout`), which
    /// rdma_cm sets when the connection moves to RTS; `None` when the id has no queue pair.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn qp_ack_timeout(&self) -> io::Result<Option<u8>> {
        Ok(self
            .query_qp(sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT)?
            .map(|attr| attr.timeout))
    }

    /// The RNR timer of the id's queue pair (`ibv_qp_attr::min_rnr_timer`); `None` when the id
    /// has no queue pair.
    #[cfg(rdma_async_hooks)]
    pub(crate) fn qp_min_rnr_timer(&self) -> io::Result<Option<u8>> {
        Ok(self
            .query_qp(sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)?
            .map(|attr| attr.min_rnr_timer))
    }

    /// Sets the RNR timer of the id's queue pair, which must be ready to send (an RTS to RTS
    /// modification); does nothing when the id has no queue pair, or when the queue pair has
    /// already failed.
    ///
    /// The peer may send as soon as the connection is up, before this runs: a message that fails
    /// the queue pair (too long for its receive) moves it to the error state, where the
    /// modification is refused. That connection is over, and its data path reports the failure
    /// with the work completion's status, so the refusal is not the error to report.
    pub(crate) fn set_qp_min_rnr_timer(&self, code: u8) -> io::Result<()> {
        let Some(qp) = self.qp_ptr() else {
            return Ok(());
        };
        // SAFETY: a plain C struct for which all-zero bytes are a valid value.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.min_rnr_timer = code;
        let mask = sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER as i32;
        // SAFETY: `qp` is live (see `qp_ptr`); `attr` is initialised and the mask names its only
        // field used. Called while the connection is set up, before any work request of its
        // transport is posted.
        let ret = unsafe { sys::ibv_modify_qp(qp, &mut attr, mask) };
        if ret != 0 {
            // A failed query leaves the modification's own error to report.
            if matches!(self.qp_failed(), Ok(true)) {
                tracing::debug!("the queue pair failed before its RNR timer was set");
                return Ok(());
            }
            return Err(error::call_error("ibv_modify_qp (min_rnr_timer)", ret));
        }
        Ok(())
    }

    /// Whether the id's queue pair is in the error state (or its send queue is).
    fn qp_failed(&self) -> io::Result<bool> {
        use sys::ibv_qp_state::{IBV_QPS_ERR, IBV_QPS_SQE};
        Ok(self
            .query_qp(sys::ibv_qp_attr_mask::IBV_QP_STATE)?
            .is_some_and(|attr| matches!(attr.qp_state, IBV_QPS_ERR | IBV_QPS_SQE)))
    }

    /// The id's queue pair, if it has one.
    fn qp_ptr(&self) -> Option<*mut sys::ibv_qp> {
        // SAFETY: the id is valid for `self`'s lifetime; `qp` is null or the id's queue pair,
        // which rdma_cm keeps alive until `rdma_destroy_qp`.
        let qp = unsafe { (*self.as_ptr()).qp };
        (!qp.is_null()).then_some(qp)
    }

    /// `ibv_query_qp` for the attributes in `mask`; `None` when the id has no queue pair.
    fn query_qp(&self, mask: u32) -> io::Result<Option<sys::ibv_qp_attr>> {
        let Some(qp) = self.qp_ptr() else {
            return Ok(None);
        };
        // SAFETY: a plain C struct for which all-zero bytes are a valid value.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `qp` is live (see `qp_ptr`), and `attr` and `init` are valid for writes during
        // the call; querying is allowed concurrently with posting.
        let ret = unsafe { sys::ibv_query_qp(qp, &mut attr, mask as i32, &mut init) };
        if ret != 0 {
            return Err(error::call_error("ibv_query_qp", ret));
        }
        Ok(Some(attr))
    }
}
