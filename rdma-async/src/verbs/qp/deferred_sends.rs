//! [`DeferredSends`]: send work requests that operations built and left for one doorbell.
//!
//! Each `ibv_post_send` rings the device's doorbell: an MMIO write on a NIC, a system call that
//! runs the requester on Soft-RoCE. `RdmaConnection` operations posted while others are in
//! flight leave their requests here, and the first of them posts them all at once after letting
//! the others that run in the same scheduler pass add theirs (`rdma::completion_task`). On
//! Soft-RoCE, perftest's `ib_write_bw -t 64 -s 64` goes from 10–12k to 14–16k writes a second
//! with lists of 16 (`-l 16`) in one boot; the requests themselves are the same.

use std::io;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};

use rdma_async_sys as sys;

use crate::sync::{Lock, LockGuard};

/// Send work requests in the order they were added, not yet posted.
#[derive(Default)]
pub(crate) struct DeferredSends {
    /// Whether `chain` holds a request: a look without the lock.
    waiting: AtomicBool,
    chain: Lock<Chain>,
}

/// The requests and their gather lists. A request's `sg_list` and `next` are null while it is
/// stored (the vectors may move as they grow); they are set only while posting, under the lock.
#[derive(Default)]
struct Chain {
    wrs: Vec<sys::ibv_send_wr>,
    sges: Vec<sys::ibv_sge>,
    /// Where each request's gather entries start in `sges`.
    first_sge: Vec<usize>,
}

// SAFETY: the only raw pointers in a `Chain` are the requests' `sg_list` and `next`, which are
// null but while `post_all` links and posts them under the lock (pointing into the chain's own
// vectors); `sys::ibv_send_wr` is otherwise plain data.
unsafe impl Send for Chain {}

impl std::fmt::Debug for DeferredSends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeferredSends")
            .field("waiting", &self.is_waiting())
            .finish_non_exhaustive()
    }
}

impl DeferredSends {
    fn chain(&self) -> LockGuard<'_, Chain> {
        self.chain.lock()
    }

    /// Whether some request waits to be posted.
    pub(crate) fn is_waiting(&self) -> bool {
        self.waiting.load(Ordering::Acquire)
    }

    /// As [`Self::push_with`], for a request built beforehand (the tests').
    #[cfg(test)]
    pub(crate) fn push(&self, wr: sys::ibv_send_wr, sges: &[sys::ibv_sge]) -> bool {
        self.push_with(sges, |stored| *stored = wr)
    }

    /// Adds a request, filled by `fill` (given a zeroed one; its `sg_list` and `next` are
    /// ignored), with the gather list `sges`, which is copied. Returns whether it is the first
    /// since the last post: its operation then posts them ([`Self::post_all`]), or sees that
    /// they are posted. The request is built where it is stored: built first and then moved in,
    /// its 128 bytes were copied once more on every deferred post.
    pub(crate) fn push_with(
        &self,
        sges: &[sys::ibv_sge],
        fill: impl FnOnce(&mut sys::ibv_send_wr),
    ) -> bool {
        let mut chain = self.chain();
        let first = chain.wrs.is_empty();
        let at = chain.sges.len();
        chain.first_sge.push(at);
        // One entry (every single-buffer write) is pushed as it is, sparing
        // `extend_from_slice`'s general copy on every deferred post.
        match sges {
            [sge] => chain.sges.push(*sge),
            _ => chain.sges.extend_from_slice(sges),
        }
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        chain.wrs.push(unsafe { std::mem::zeroed() });
        if let Some(wr) = chain.wrs.last_mut() {
            fill(wr);
            wr.sg_list = ptr::null_mut();
            wr.next = ptr::null_mut();
        }
        self.waiting.store(true, Ordering::Release);
        first
    }

    /// Forgets the waiting requests without posting them; returns their `wr_id`s. For a
    /// connection that closed before they were posted: the device never saw them, so their
    /// buffers may be handed back at once.
    pub(crate) fn forget(&self) -> Vec<u64> {
        let mut chain = self.chain();
        let ids = chain.wrs.iter().map(|wr| wr.wr_id).collect();
        chain.wrs.clear();
        chain.sges.clear();
        chain.first_sge.clear();
        self.waiting.store(false, Ordering::Release);
        ids
    }

    /// Links the waiting requests in the order added and hands the head of the list to `post`
    /// (one `ibv_post_send`), then forgets them, posted or not. Nothing to post is `Ok`.
    ///
    /// # Errors
    ///
    /// `post`'s: then some of the requests may not have been posted, and which ones is the
    /// caller's to settle (it ends the connection, which flushes them all).
    pub(crate) fn post_all(
        &self,
        post: impl FnOnce(&mut sys::ibv_send_wr) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut chain = self.chain();
        let Chain {
            wrs,
            sges,
            first_sge,
        } = &mut *chain;
        if wrs.is_empty() {
            return Ok(());
        }
        let sge_base = sges.as_mut_ptr();
        let wr_base = wrs.as_mut_ptr();
        let len = wrs.len();
        for (i, (wr, first)) in wrs.iter_mut().zip(first_sge.iter()).enumerate() {
            wr.sg_list = if wr.num_sge == 0 {
                ptr::null_mut()
            } else {
                // `push` stored this request's `num_sge` entries from `first`, within `sges`.
                sge_base.wrapping_add(*first)
            };
            wr.next = if i + 1 < len {
                wr_base.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
        }
        let posted = wrs.first_mut().map_or(Ok(()), post);
        wrs.clear();
        sges.clear();
        first_sge.clear();
        self.waiting.store(false, Ordering::Release);
        posted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wr(wr_id: u64, num_sge: i32) -> sys::ibv_send_wr {
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.num_sge = num_sge;
        wr
    }

    fn sge(addr: u64) -> sys::ibv_sge {
        sys::ibv_sge {
            addr,
            length: 8,
            lkey: 1,
        }
    }

    /// Walks the posted list as a provider would: (wr_id, gather addresses) in list order.
    fn walk(head: &mut sys::ibv_send_wr) -> Vec<(u64, Vec<u64>)> {
        let mut seen = Vec::new();
        let mut at: *const sys::ibv_send_wr = head;
        while !at.is_null() {
            // SAFETY: `post_all` linked the list through its own vector, alive for this call.
            let wr = unsafe { &*at };
            let entries = if wr.num_sge == 0 {
                Vec::new()
            } else {
                // SAFETY: `sg_list` points at this request's `num_sge` stored entries, in the
                // chain's own vector, alive for this call.
                let list = unsafe { std::slice::from_raw_parts(wr.sg_list, wr.num_sge as usize) };
                list.iter().map(|e| e.addr).collect()
            };
            seen.push((wr.wr_id, entries));
            at = wr.next;
        }
        seen
    }

    /// How many times posting what waits calls `ibv_post_send` (0 or 1).
    fn doorbells(deferred: &DeferredSends) -> usize {
        let mut calls = 0;
        deferred
            .post_all(|_| {
                calls += 1;
                Ok(())
            })
            .unwrap();
        calls
    }

    #[test]
    fn requests_are_posted_once_in_order_with_their_own_gather_lists() {
        let deferred = DeferredSends::default();
        assert!(!deferred.is_waiting());
        assert!(deferred.push(wr(1, 1), &[sge(10)]));
        assert!(!deferred.push(wr(2, 0), &[]));
        assert!(!deferred.push(wr(3, 2), &[sge(30), sge(31)]));
        assert!(deferred.is_waiting());
        let mut seen = Vec::new();
        deferred
            .post_all(|head| {
                seen = walk(head);
                Ok(())
            })
            .unwrap();
        assert_eq!(
            seen,
            vec![(1, vec![10]), (2, vec![]), (3, vec![30, 31])],
            "one list, in the order added"
        );
        assert!(!deferred.is_waiting());
        assert_eq!(doorbells(&deferred), 0, "nothing waits: no doorbell");
        assert!(deferred.push(wr(4, 1), &[sge(40)]), "a new chain starts");
    }

    #[test]
    fn forgotten_requests_are_never_posted() {
        let deferred = DeferredSends::default();
        deferred.push(wr(7, 1), &[sge(70)]);
        deferred.push(wr(8, 0), &[]);
        assert_eq!(deferred.forget(), vec![7, 8]);
        assert!(!deferred.is_waiting());
        assert_eq!(doorbells(&deferred), 0);
    }

    #[test]
    fn a_failed_post_is_reported_and_the_chain_is_emptied() {
        let deferred = DeferredSends::default();
        deferred.push(wr(1, 1), &[sge(10)]);
        let err = deferred
            .post_all(|_| Err(io::Error::from_raw_os_error(libc::ENOMEM)))
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOMEM));
        assert!(!deferred.is_waiting());
        assert!(deferred.push(wr(2, 0), &[]));
    }
}
