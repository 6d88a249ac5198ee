//! Further registrations of parts of a [`RegisteredBuffer`](super::RegisteredBuffer), each with
//! access rights and a key of its own: a zero-copy receive ring grants, and revokes, each half
//! separately. They belong to the buffer, which deregisters them before its own registration and
//! before freeing the memory.

use std::io;
use std::ptr::NonNull;
use std::sync::{Mutex, MutexGuard, PoisonError};

use rdma_async_sys as sys;

use super::registration::deregister;

/// One registration of `len` bytes at `offset` of the buffer; `None` once deregistered.
#[derive(Debug)]
struct RangeMr {
    mr: Option<NonNull<sys::ibv_mr>>,
    offset: usize,
    len: usize,
    /// Registered with remote access.
    remote: bool,
}

/// A buffer's further registrations, by index in the order they were made.
#[derive(Debug, Default)]
pub(crate) struct RangeRegistrations {
    ranges: Mutex<Vec<RangeMr>>,
}

// SAFETY: the pointers are only passed to thread-safe verbs calls (and read for their keys),
// under the mutex.
unsafe impl Send for RangeRegistrations {}
// SAFETY: as above.
unsafe impl Sync for RangeRegistrations {}

impl RangeRegistrations {
    fn lock(&self) -> MutexGuard<'_, Vec<RangeMr>> {
        self.ranges.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records `mr`, a registration of `len` bytes at `offset`; returns its index.
    pub(super) fn add(
        &self,
        mr: NonNull<sys::ibv_mr>,
        offset: usize,
        len: usize,
        remote: bool,
    ) -> usize {
        let mut ranges = self.lock();
        ranges.push(RangeMr {
            mr: Some(mr),
            offset,
            len,
            remote,
        });
        ranges.len() - 1
    }

    /// Whether a live registration with remote access covers any of `len` bytes at `offset`.
    pub(super) fn remotely_writable(&self, offset: usize, len: usize) -> bool {
        self.lock().iter().any(|r| {
            r.mr.is_some() && r.remote && r.offset < offset + len && offset < r.offset + r.len
        })
    }

    /// Registration `index`'s remote key, while it is registered.
    pub(crate) fn rkey(&self, index: usize) -> Option<u32> {
        let ranges = self.lock();
        let mr = ranges.get(index)?.mr?;
        // SAFETY: the registration is live while it is in the list (deregistering takes it out).
        Some(unsafe { (*mr.as_ptr()).rkey })
    }

    /// Registration `index` as a memory window bind names it: the registration, and the offset
    /// and length it covers.
    pub(crate) fn for_bind(&self, index: usize) -> Option<(*mut sys::ibv_mr, usize, usize)> {
        let ranges = self.lock();
        let range = ranges.get(index)?;
        Some((range.mr?.as_ptr(), range.offset, range.len))
    }

    /// Deregisters registration `index` now (the peer loses the access it gave). A registration
    /// whose deregistration failed stays in the list: the peer may still use its key, so its
    /// range is still remotely writable (no view of it) and the buffer may not be freed.
    pub(crate) fn deregister(&self, index: usize) -> io::Result<()> {
        let mut ranges = self.lock();
        let Some(range) = ranges.get_mut(index) else {
            return Err(crate::error::invalid_input(format!(
                "no range registration {index}"
            )));
        };
        let Some(mr) = range.mr else {
            return Err(crate::error::invalid_input(format!(
                "range registration {index} is already deregistered"
            )));
        };
        // SAFETY: the registration is live while it is in the list, and leaves it only once
        // deregistered.
        unsafe { deregister(mr, range.len) }?;
        range.mr = None;
        Ok(())
    }

    /// Deregisters every registration still registered; whether all of them could be (if one
    /// could not, it stays listed and the memory must not be freed: the peer might still
    /// write it).
    pub(super) fn deregister_all(&self) -> bool {
        let mut ranges = self.lock();
        let mut ok = true;
        for range in ranges.iter_mut() {
            if let Some(mr) = range.mr {
                // SAFETY: as in `Self::deregister`.
                match unsafe { deregister(mr, range.len) } {
                    Ok(()) => range.mr = None,
                    Err(e) => {
                        tracing::warn!(len = range.len, error = %e, "a part of a buffer stays registered");
                        ok = false;
                    }
                }
            }
        }
        ok
    }
}

/// The error for a part outside the buffer.
pub(super) fn outside(offset: usize, len: usize, buffer_len: usize) -> io::Error {
    crate::error::invalid_input(format!(
        "range {offset}+{len} is outside the {buffer_len}-byte registered buffer"
    ))
}
