//! On-demand paging: whether a device can fault pages in itself, and prefetching.

use std::io;

use rdma_async_sys as sys;

use crate::verbs::pd::ProtectionDomain;

/// A device's on-demand paging capabilities (`ibv_device_attr_ex::odp_caps`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct OdpCaps {
    pub(crate) general: u64,
    pub(crate) rc: u32,
}

impl OdpCaps {
    /// Queries the device of `pd` (`ibv_query_device_ex`).
    pub(crate) fn of(pd: &ProtectionDomain) -> io::Result<Self> {
        let (mut general, mut rc) = (0u64, 0u32);
        // SAFETY: the context is live while `pd` is; the out-pointers are valid locals.
        let ret =
            unsafe { sys::rdma_async_query_odp_caps(pd.context().as_ptr(), &mut general, &mut rc) };
        if ret != 0 {
            return Err(io::Error::from_raw_os_error(ret));
        }
        Ok(OdpCaps { general, rc })
    }
}

/// Asks the device to fault in `len` bytes at `addr` of an on-demand registration with `lkey`
/// (`ibv_advise_mr` with `IBV_ADVISE_MR_ADVICE_PREFETCH_WRITE`), waiting until it has.
pub(crate) fn prefetch(pd: &ProtectionDomain, addr: u64, len: u32, lkey: u32) -> io::Result<()> {
    // SAFETY: the protection domain is live; the range was checked by the caller against a live
    // registration of it, and advice never writes memory the registration does not cover.
    let ret = unsafe { sys::rdma_async_prefetch_mr(pd.as_ptr(), addr, len, lkey) };
    match ret {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}
