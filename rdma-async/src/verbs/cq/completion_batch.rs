//! [`CompletionBatch`]: room for polled completions that is not initialised before use.
//!
//! The data path polls its completion queue several times per message, most often finding
//! nothing. A zeroed `[WorkCompletion; 32]` per poll is a 1.5 KiB `memset` each time (a tenth
//! of the instructions of a 64 B round trip, measured with callgrind); this leaves the room
//! uninitialised and hands out only the entries a poll wrote.

use std::mem::MaybeUninit;

use super::work_completion::WorkCompletion;

/// The most completions one `ibv_poll_cq` call returns here.
pub(crate) const MAX_POLL: usize = 32;

/// Up to `N` (at most [`MAX_POLL`]) completions from the last poll into it.
pub(crate) struct CompletionBatch<const N: usize> {
    wcs: [MaybeUninit<WorkCompletion>; N],
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

    /// Room for the next poll: empties the batch.
    pub(crate) fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends a polled completion; `false` (and nothing stored) when the batch is full.
    pub(crate) fn push(&mut self, wc: WorkCompletion) -> bool {
        let Some(slot) = self.wcs.get_mut(self.len) else {
            return false;
        };
        slot.write(wc);
        self.len += 1;
        true
    }

    /// The completions of the last poll.
    pub(crate) fn as_slice(&self) -> &[WorkCompletion] {
        // SAFETY: the first `len` entries were written by `push` (`len` grows only after the
        // write, and `len <= N`); `MaybeUninit<T>` has the layout of `T`.
        unsafe { std::slice::from_raw_parts(self.wcs.as_ptr().cast::<WorkCompletion>(), self.len) }
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
        let ids: Vec<u64> = batch.as_slice().iter().map(|wc| wc.wr_id).collect();
        assert_eq!(ids, [1, 2]);
        batch.clear();
        assert!(batch.as_slice().is_empty());
    }
}
