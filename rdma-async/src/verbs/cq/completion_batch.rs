//! [`CompletionBatch`]: room for polled completions that is not initialised before use.
//!
//! The data path polls its completion queue several times per message, most often finding
//! nothing. A zeroed `[WorkCompletion; 32]` per poll is a 1.5 KiB `memset` each time (a tenth
//! of the instructions of a 64 B round trip, measured with callgrind); this leaves the room
//! uninitialised and hands out only the entries a poll wrote. The provider writes its entries
//! straight into the batch, and they are read there ([`PolledCompletion`]), not copied again.

use std::mem::MaybeUninit;

use rdma_async_sys as sys;

use super::polled_completion::PolledCompletion;
#[cfg(any(test, rdma_async_fuzzing))]
use super::work_completion::WorkCompletion;

/// The most completions one `ibv_poll_cq` call returns here.
pub(crate) const MAX_POLL: usize = 32;

/// Up to `N` (at most [`MAX_POLL`]) completions from the last poll into it.
pub(crate) struct CompletionBatch<const N: usize> {
    wcs: [MaybeUninit<PolledCompletion>; N],
    /// The first `len` entries of `wcs` are initialised.
    len: usize,
}

impl<const N: usize> CompletionBatch<N> {
    const FITS: () = assert!(N > 0 && N <= MAX_POLL, "a batch holds 1 to 32 completions");

    /// An empty batch.
    pub(crate) const fn new() -> Self {
        let () = Self::FITS;
        CompletionBatch {
            wcs: [const { MaybeUninit::uninit() }; N],
            len: 0,
        }
    }

    /// Room for the next batch: empties it (polls empty it themselves).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Empties the batch and hands its room, `N` entries, to `fill`, which writes the first of
    /// them and returns how many it wrote (or an error, leaving the batch empty).
    ///
    /// # Safety
    ///
    /// `fill` must initialise the first `n` (at most `N`) entries at the pointer it is given
    /// before it returns `Ok(n)`.
    pub(super) unsafe fn fill_with<E>(
        &mut self,
        fill: impl FnOnce(*mut sys::ibv_wc, usize) -> Result<usize, E>,
    ) -> Result<&[PolledCompletion], E> {
        self.len = 0;
        // `PolledCompletion` is a transparent `ibv_wc`, and `MaybeUninit` has its layout.
        let n = fill(self.wcs.as_mut_ptr().cast::<sys::ibv_wc>(), N)?;
        debug_assert!(n <= N, "a poll wrote {n} entries into room for {N}");
        self.len = n.min(N);
        Ok(self.as_slice())
    }

    /// Appends a completion; `false` (and nothing stored) when the batch is full. For fakes
    /// that hand out completions of their own.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        let Some(slot) = self.wcs.get_mut(self.len) else {
            return false;
        };
        slot.write(PolledCompletion::from(wc));
        self.len += 1;
        true
    }

    /// The completions of the last poll.
    pub(crate) fn as_slice(&self) -> &[PolledCompletion] {
        // SAFETY: the first `len` entries were written by `push` or by a poll (`fill_with`'s
        // contract; `len` is set only after, and `len <= N`); `MaybeUninit<T>` has the layout
        // of `T`.
        unsafe {
            std::slice::from_raw_parts(self.wcs.as_ptr().cast::<PolledCompletion>(), self.len)
        }
    }
}

impl<const N: usize> std::fmt::Debug for CompletionBatch<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holds_what_was_pushed_up_to_its_size() {
        let mut batch = CompletionBatch::<2>::new();
        assert!(batch.as_slice().is_empty());
        let wc = |wr_id| WorkCompletion {
            wr_id,
            ..WorkCompletion::EMPTY
        };
        assert!(batch.push(wc(1)));
        assert!(batch.push(wc(2)));
        assert!(!batch.push(wc(3)));
        let ids: Vec<u64> = batch.as_slice().iter().map(|wc| wc.wr_id()).collect();
        assert_eq!(ids, [1, 2]);
        batch.clear();
        assert!(batch.as_slice().is_empty());
    }
}
