//! [`ForeignMemory`]: memory the application owns, vouched for so it can be registered.

use std::any::Any;
use std::fmt;
use std::ptr::NonNull;

/// Memory the application owns, described for registration with
/// [`DeviceContext::register_foreign`](crate::device::DeviceContext::register_foreign) (with no
/// remote access) or
/// [`register_foreign_shared`](crate::device::DeviceContext::register_foreign_shared).
///
/// Creating one is the only `unsafe` step: it is a promise about the memory. The region made from
/// it keeps the `owner` and drops it right after deregistration, so whatever frees the memory
/// (a `Box<[u8]>`, a mapping, an allocator handle) goes in as the owner.
pub struct ForeignMemory {
    pub(crate) ptr: NonNull<u8>,
    pub(crate) len: usize,
    pub(crate) owner: Box<dyn Any + Send + Sync>,
}

// SAFETY: `new`'s contract gives the holder exclusive use of the memory, like a `Box<[u8]>`; the
// owner is `Send + Sync` itself.
unsafe impl Send for ForeignMemory {}
// SAFETY: `&ForeignMemory` gives no access to the memory.
unsafe impl Sync for ForeignMemory {}

impl ForeignMemory {
    /// Vouches for `len` bytes at `ptr`, kept alive by `owner`.
    ///
    /// # Safety
    ///
    /// - `ptr..ptr + len` is readable and writable memory of this process that stays allocated
    ///   until `owner` is dropped (a region made from this drops it last, after deregistering).
    /// - Until then, nothing reads or writes that memory except through this value and the
    ///   region made from it: a region with no remote access hands out `&mut [u8]` views of it,
    ///   the device writes it when it is the destination of a receive or RDMA read, and a peer
    ///   writes it at any time when it is registered for remote write or atomics.
    pub unsafe fn new<O: Send + Sync + 'static>(ptr: NonNull<u8>, len: usize, owner: O) -> Self {
        ForeignMemory {
            ptr,
            len,
            owner: Box::new(owner),
        }
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the memory is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl fmt::Debug for ForeignMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ForeignMemory")
            .field("ptr", &self.ptr)
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}
