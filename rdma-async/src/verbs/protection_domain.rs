//! `ibv_pd`: the protection domain queue pairs and memory regions belong to.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

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
    /// Live address handles on the domain (they bound a datagram socket's device resources).
    address_handles: AtomicUsize,
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
        Ok(ProtectionDomain {
            raw,
            id,
            address_handles: AtomicUsize::new(0),
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    pub(crate) fn id(&self) -> &Arc<CmId> {
        &self.id
    }

    /// How many address handles of the domain are alive.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn address_handles(&self) -> usize {
        self.address_handles.load(Ordering::Relaxed)
    }

    /// Counts an address handle created on the domain.
    pub(super) fn address_handle_created(&self) {
        self.address_handles.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts an address handle of the domain destroyed.
    pub(super) fn address_handle_destroyed(&self) {
        self.address_handles.fetch_sub(1, Ordering::Relaxed);
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every queue pair and memory region of this domain holds an `Arc` to it, so none
        // is left; the domain is deallocated once.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
