//! `ibv_query_qp`: reading back what rdma_cm set on a connection's queue pair, so tests can check
//! that an id option reached the queue pair.

use std::io;

use rdma_async_sys as sys;

use super::cm_id::CmId;
use crate::error;

impl CmId {
    /// The local ACK timeout exponent of the id's queue pair (`ibv_qp_attr::timeout`), which
    /// rdma_cm sets when the connection moves to RTS; `None` when the id has no queue pair.
    pub(crate) fn qp_ack_timeout(&self) -> io::Result<Option<u8>> {
        // SAFETY: the id is valid for `self`'s lifetime; `qp` is null or the id's queue pair,
        // which rdma_cm keeps alive until `rdma_destroy_qp`.
        let qp = unsafe { (*self.as_ptr()).qp };
        if qp.is_null() {
            return Ok(None);
        }
        // SAFETY: a plain C struct for which all-zero bytes are a valid value.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: `qp` is live (above), and `attr` and `init` are valid for writes during the
        // call; querying is allowed concurrently with posting.
        let ret = unsafe {
            sys::ibv_query_qp(
                qp,
                &mut attr,
                sys::ibv_qp_attr_mask::IBV_QP_TIMEOUT as i32,
                &mut init,
            )
        };
        if ret != 0 {
            return Err(error::call_error("ibv_query_qp", ret));
        }
        Ok(Some(attr.timeout))
    }
}
