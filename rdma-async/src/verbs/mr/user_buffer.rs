//! Caller-owned registered memory: a whole registration, or a slice of a pool's slab.

use std::fmt;
use std::io;
use std::sync::Arc;

use rdma_async_sys as sys;

use super::access::Access;
use super::memory::RegisteredBuffer;
use crate::error;
use crate::verbs::pd::ProtectionDomain;

/// Caller-owned registered memory: the only kind an in-flight table accepts.
///
/// Outside a table nothing is posted on it, so memory that no peer can reach may be viewed as a
/// slice. (The crate's own ring and slot buffers are [`RegisteredBuffer`]s that stay posted; they
/// can never become a `UserBuffer`.)
#[derive(Debug)]
pub(crate) struct UserBuffer(Memory);

#[derive(Debug)]
enum Memory {
    /// Boxed: a `UserBuffer` moves through every operation's future and in-flight slot, and a
    /// registration is 112 bytes, which made each move a `memcpy` call.
    Whole(Box<RegisteredBuffer>),
    Slice(SlabSlice),
}

/// Where a slab slice goes back to when it is dropped (a buffer pool's free list).
pub(crate) trait SliceHome: Send + Sync + fmt::Debug {
    /// Takes back the slice at `offset` of the slab; the device no longer uses it.
    fn give_back(&self, offset: usize);
}

/// `len` bytes at `offset` of a slab registration, owned exclusively until dropped.
#[derive(Debug)]
pub(crate) struct SlabSlice {
    slab: Arc<RegisteredBuffer>,
    offset: usize,
    len: usize,
    home: Arc<dyn SliceHome>,
}

impl SlabSlice {
    /// A slice the caller hands out once: `home` must not give the range to anyone else until
    /// its `give_back` is called for it.
    pub(crate) fn new(
        slab: Arc<RegisteredBuffer>,
        offset: usize,
        len: usize,
        home: Arc<dyn SliceHome>,
    ) -> io::Result<Self> {
        if offset.checked_add(len).is_none_or(|end| end > slab.len()) {
            return Err(error::invalid_input(format!(
                "slice {offset}+{len} is outside the {}-byte slab",
                slab.len()
            )));
        }
        Ok(SlabSlice {
            slab,
            offset,
            len,
            home,
        })
    }
}

impl Drop for SlabSlice {
    fn drop(&mut self) {
        self.home.give_back(self.offset);
    }
}

impl UserBuffer {
    pub(crate) fn new(buffer: RegisteredBuffer) -> Self {
        UserBuffer(Memory::Whole(Box::new(buffer)))
    }

    pub(crate) fn slice(slice: SlabSlice) -> Self {
        UserBuffer(Memory::Slice(slice))
    }

    /// The registered bytes this buffer covers.
    pub(crate) fn registered(&self) -> RegisteredRange<'_> {
        match &self.0 {
            Memory::Whole(buffer) => RegisteredRange {
                buffer,
                offset: 0,
                len: buffer.len(),
            },
            Memory::Slice(slice) => RegisteredRange {
                buffer: &slice.slab,
                offset: slice.offset,
                len: slice.len,
            },
        }
    }

    /// Deregisters and returns the bytes (a copy for a pool's slice, which goes back to its
    /// pool).
    pub(crate) fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Memory::Whole(buffer) => (*buffer).into_vec(),
            Memory::Slice(slice) => {
                let mut out = vec![0; slice.len];
                if slice.slab.read_at(slice.offset, &mut out).is_err() {
                    out.clear();
                }
                out
            }
        }
    }

    /// The bytes, when no peer can reach them (`None` for remotely accessible memory).
    pub(crate) fn as_slice(&self) -> Option<&[u8]> {
        match &self.0 {
            // SAFETY: a `UserBuffer` outside a table has no work request outstanding (posting
            // moves it into the table, and it comes back only after its completion was polled),
            // and no window bound over it (a bound window's region lives in its
            // `WindowBinding`, which gives no view and lets it out only once the window was
            // freed or its key revoked).
            Memory::Whole(buffer) => unsafe { buffer.local_slice() },
            // SAFETY: as above; the pool hands each slice out once, so this buffer is the only
            // owner of its range, and `&self` rules out the one mutable view (`as_mut_slice`).
            Memory::Slice(s) => unsafe { s.slab.local_range(s.offset, s.len) },
        }
    }

    /// The bytes, mutably, when no peer can reach them.
    pub(crate) fn as_mut_slice(&mut self) -> Option<&mut [u8]> {
        match &mut self.0 {
            // SAFETY: as in `as_slice`.
            Memory::Whole(buffer) => unsafe { buffer.local_slice_mut() },
            // SAFETY: as in `as_slice`; `&mut self` makes the view unique.
            Memory::Slice(s) => unsafe { s.slab.local_range_mut(s.offset, s.len) },
        }
    }
}

/// A range of a registration: what work requests and copies address.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RegisteredRange<'a> {
    buffer: &'a RegisteredBuffer,
    offset: usize,
    len: usize,
}

impl<'a> RegisteredRange<'a> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn pd(&self) -> &'a Arc<ProtectionDomain> {
        self.buffer.pd()
    }

    pub(crate) fn access(&self) -> Access {
        self.buffer.access()
    }

    /// Whether the device may write the memory (receives, RDMA read results, atomics).
    pub(crate) fn locally_writable(&self) -> bool {
        self.buffer.locally_writable()
    }

    /// The address of byte `offset` of the range.
    pub(crate) fn addr(&self, offset: usize) -> u64 {
        self.buffer.addr(self.offset + offset)
    }

    pub(crate) fn rkey(&self) -> u32 {
        self.buffer.rkey()
    }

    pub(crate) fn lkey(&self) -> u32 {
        self.buffer.lkey()
    }

    /// The registration, for a memory window bind (which names the region it exposes).
    pub(crate) fn mr_ptr(&self) -> *mut sys::ibv_mr {
        self.buffer.mr_ptr()
    }

    fn check(&self, offset: usize, len: usize) -> io::Result<()> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(()),
            _ => Err(error::invalid_input(format!(
                "range {offset}+{len} is outside the {}-byte registered buffer",
                self.len
            ))),
        }
    }

    /// A scatter/gather entry for `len` bytes at `offset` of the range.
    pub(crate) fn sge(&self, offset: usize, len: usize) -> io::Result<sys::ibv_sge> {
        self.check(offset, len)?;
        self.buffer.sge(self.offset + offset, len)
    }

    /// Copies `src` into the range at `offset`.
    pub(crate) fn write_at(&self, offset: usize, src: &[u8]) -> io::Result<()> {
        self.check(offset, src.len())?;
        self.buffer.write_at(self.offset + offset, src)
    }

    /// Copies `dst.len()` bytes at `offset` of the range out.
    pub(crate) fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        self.check(offset, dst.len())?;
        self.buffer.read_at(self.offset + offset, dst)
    }
}
