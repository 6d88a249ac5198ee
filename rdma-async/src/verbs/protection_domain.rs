//! `ibv_pd`: the protection domain queue pairs and memory regions belong to.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::cm_id::CmId;
use crate::error;

/// An owned protection domain on the device of an rdma_cm id.
///
/// It holds the id it was created from: librdmacm keeps a device's verbs context open while an
/// id refers to it, so the context outlives the domain.
#[derive(Debug)]
pub(crate) struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    id: Arc<CmId>,
}

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; the domain is only passed to thread-safe verbs calls.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on the device `id` is bound to.
    pub(crate) fn new(id: Arc<CmId>) -> io::Result<Self> {
        let ctx = id.verbs()?;
        // SAFETY: `ctx` is the live verbs context of a live id.
        let raw = unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_alloc_pd"))?;
        Ok(ProtectionDomain { raw, id })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    pub(crate) fn id(&self) -> &Arc<CmId> {
        &self.id
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every queue pair and memory region of this domain holds an `Arc` to it, so none
        // is left; the domain is deallocated once.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
