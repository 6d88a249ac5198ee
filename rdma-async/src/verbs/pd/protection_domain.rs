//! `ibv_pd`: the protection domain queue pairs and memory regions belong to.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_async_sys as sys;

use crate::error;
use crate::verbs::cm::CmId;
use crate::verbs::device::{CmDevices, DeviceLimits, device_name};

/// An owned protection domain on one device context of librdmacm.
///
/// It holds what keeps that context open (librdmacm closes a device when nothing refers to it):
/// the id it was created from, or the `rdma_get_devices` list it was found in.
#[derive(Debug)]
pub(crate) struct ProtectionDomain {
    raw: NonNull<sys::ibv_pd>,
    context: NonNull<sys::ibv_context>,
    device: String,
    _keeper: ContextKeeper,
}

/// What holds a protection domain's device context open.
#[derive(Debug)]
enum ContextKeeper {
    Id(#[allow(dead_code)] Arc<CmId>),
    Devices(#[allow(dead_code)] Arc<CmDevices>),
}

// SAFETY: libibverbs objects may be used from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: as above; the domain is only passed to thread-safe verbs calls.
unsafe impl Sync for ProtectionDomain {}

impl ProtectionDomain {
    /// Allocates a protection domain on the device `id` is bound to, keeping `id` alive.
    pub(crate) fn new(id: Arc<CmId>) -> io::Result<Self> {
        let ctx = id.verbs()?;
        Self::alloc(ctx, ContextKeeper::Id(id))
    }

    /// Allocates a protection domain on `ctx`, one of the contexts of `devices`.
    pub(crate) fn on_device(
        devices: Arc<CmDevices>,
        ctx: NonNull<sys::ibv_context>,
    ) -> io::Result<Self> {
        if !devices.holds(ctx) {
            return Err(error::no_device(format!(
                "device {} is not among librdmacm's devices",
                device_name(ctx)
            )));
        }
        Self::alloc(ctx, ContextKeeper::Devices(devices))
    }

    fn alloc(ctx: NonNull<sys::ibv_context>, keeper: ContextKeeper) -> io::Result<Self> {
        // SAFETY: `ctx` is a live verbs context, held open by `keeper` for the domain's life.
        let raw = unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) };
        let raw = NonNull::new(raw).ok_or_else(|| error::last_error("ibv_alloc_pd"))?;
        Ok(ProtectionDomain {
            raw,
            context: ctx,
            device: device_name(ctx),
            _keeper: keeper,
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.raw.as_ptr()
    }

    /// The verbs context the domain was allocated on.
    pub(crate) fn context(&self) -> NonNull<sys::ibv_context> {
        self.context
    }

    /// The name of the domain's device.
    pub(crate) fn device_name(&self) -> &str {
        &self.device
    }

    /// The most work requests a queue of the domain's device holds (`max_qp_wr`, queried:
    /// a system call), or `None` when the query fails.
    pub(crate) fn max_qp_wr(&self) -> Option<u32> {
        DeviceLimits::of(self.context).map(|limits| limits.max_qp_wr.max(0) as u32)
    }

    /// Whether `id` is bound to this domain's device, so its queue pair may use the domain.
    pub(crate) fn is_device_of(&self, id: &CmId) -> io::Result<bool> {
        Ok(id.verbs()? == self.context)
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: every queue pair and memory region of this domain holds an `Arc` to it, so none
        // is left; the domain is deallocated once.
        unsafe { sys::ibv_dealloc_pd(self.raw.as_ptr()) };
    }
}
