//! [`RegionWrite`]: the state of one zero-copy write (`RStream::write_region`) between polls.
//!
//! The caller's registered buffer is attached to the stream's queue pair for the whole write: the
//! data goes by RDMA write straight from it into the peer's ring, and it comes back once the
//! completion of the last chunk that used it was polled (chunks complete in order).

use crate::verbs::UserBuffer;

/// Where a zero-copy write is.
#[derive(Debug)]
pub(super) struct RegionWrite {
    /// The buffer, until it is attached to the queue pair (and again once it is back).
    pub(super) buffer: Option<UserBuffer>,
    /// Its attach id while the queue pair holds it.
    pub(super) attached: Option<u64>,
    /// The range of the buffer to write: `start + done .. end` is left.
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) done: usize,
    /// Why the write cannot go on, once known; reported when the buffer is back.
    pub(super) failure: Option<std::io::Error>,
}

impl RegionWrite {
    pub(super) fn new(buffer: UserBuffer, start: usize, end: usize) -> Self {
        RegionWrite {
            buffer: Some(buffer),
            attached: None,
            start,
            end,
            done: 0,
            failure: None,
        }
    }

    pub(super) fn remaining(&self) -> usize {
        self.end - self.start - self.done
    }
}

/// An attached buffer and the last send that names it: once that send is no longer outstanding,
/// the device is done with the buffer.
#[derive(Debug, Clone, Copy)]
pub(super) struct AttachedBuffer {
    pub(super) attach_id: u64,
    pub(super) last_send: u64,
}

/// Drops of a zero-copy write's future hand its buffer to the stream, which frees it once the
/// device is done with it.
pub(super) struct RegionWriteGuard<'a> {
    pub(super) core: &'a super::driver::StreamCore,
    pub(super) op: RegionWrite,
}

impl Drop for RegionWriteGuard<'_> {
    fn drop(&mut self) {
        self.core.abandon_region_write(&mut self.op);
    }
}

/// `RStream::write_region` and the write halves': checks the range, then runs the write.
pub(super) async fn write_region<B: crate::rdma::RegisteredBytes>(
    core: &super::driver::StreamCore,
    region: B,
    range: impl std::ops::RangeBounds<usize>,
) -> (std::io::Result<()>, Option<B>) {
    use crate::memory::sealed::Carried;
    let (start, len) = match crate::memory::span(region.len(), range) {
        Ok(span) => span,
        Err(err) => return (Err(err), Some(region)),
    };
    let end = start + len;
    if start == end {
        return (Ok(()), Some(region));
    }
    let mut guard = RegionWriteGuard {
        core,
        op: RegionWrite::new(region.into_user().0, start, end),
    };
    let result = std::future::poll_fn(|cx| guard.core.poll_write_region(cx, &mut guard.op)).await;
    let region = guard.op.buffer.take().map(|b| B::from_user(Carried(b)));
    (result, region)
}
