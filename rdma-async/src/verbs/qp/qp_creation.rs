//! `rdma_create_qp`: creating the queue pair of an rdma_cm id on a protection domain of the id's
//! device, counted while it lives; when the device or the process has run out, the error names
//! the limit hit. Both the connected and the datagram queue pairs are created here.

use std::io;

use rdma_async_sys as sys;

use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::device::{
    DeviceLimits, Memlock, QUEUE_PAIRS, Resource, device_name, injected_failure, queue_pair_error,
};
use crate::verbs::pd::ProtectionDomain;

impl CmId {
    /// Creates the id's queue pair (`rdma_create_qp`) on `pd`; `attr` is updated with the
    /// capabilities granted. Returns the queue pair's number.
    ///
    /// # Safety
    ///
    /// The completion queues (and shared receive queue, if any) named in `attr` are live, on
    /// `pd`'s device, and outlive the queue pair.
    pub(crate) unsafe fn create_qp(
        &self,
        pd: &ProtectionDomain,
        attr: &mut sys::ibv_qp_init_attr,
    ) -> io::Result<u32> {
        let device = self.verbs()?;
        if pd.context() != device {
            return Err(error::invalid_input(format!(
                "the protection domain is on RDMA device {}, but the connection goes through {}",
                pd.device_name(),
                device_name(device)
            )));
        }
        let (send_wr, recv_wr) = (attr.cap.max_send_wr, attr.cap.max_recv_wr);
        let failed = injected_failure(Resource::QueuePair).or_else(|| {
            // SAFETY: the id and `pd` are live; the caller vouches for the queues in `attr`.
            let ret = unsafe { sys::rdma_create_qp(self.as_ptr(), pd.as_ptr(), attr) };
            (ret != 0).then(|| {
                io::Error::last_os_error()
                    .raw_os_error()
                    .unwrap_or(libc::EIO)
            })
        });
        if let Some(errno) = failed {
            let device = self.verbs().ok().and_then(DeviceLimits::of);
            return Err(queue_pair_error(
                send_wr,
                recv_wr,
                errno,
                Memlock::current(),
                device.as_ref(),
            ));
        }
        QUEUE_PAIRS.created(0);
        self.qp_num()
            .ok_or_else(|| error::call_error("rdma_create_qp", libc::EIO))
    }
}
