//! [`QueueSlots`]: the free places of one work queue (its depth), taken by each operation before
//! it posts and given back when its table slot is freed.
//!
//! A counter, not a semaphore: every operation takes a place and gives one back, and a
//! semaphore's release takes the lock of its waiter list each time, waiter or not (about 80
//! instructions of a 64 B write). Here taking is one compare-and-swap, giving back one atomic
//! add and one load; only an operation that finds the queue full registers as a waiter.
//!
//! A batch (an operation of several places) that waits has its turn: while one waits, no
//! operation of one place takes a place, so the places that come back add up to the batch's.
//! Otherwise single operations taking each place as it comes back could hold a batch off for as
//! long as they keep coming (a semaphore's waiters are served in order for the same reason).

use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// The free places of one work queue.
#[derive(Debug)]
pub(in crate::rdma) struct QueueSlots {
    free: AtomicUsize,
    /// Operations waiting in [`Self::take`] for places.
    waiting: AtomicUsize,
    /// Those of them that wait for more than one place (a batch). While there are any, a
    /// place given back wakes every waiter, since a wake-up for one place that went to a
    /// batch it does not suffice for would be lost to the others; and single operations take
    /// no place (the batch's turn).
    waiting_many: AtomicUsize,
    /// Told when a place comes back while someone waits, and when a batch's turn ends.
    freed: Notify,
}

/// Counts a waiter off however its wait ends (a dropped future too).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counts a batch's wait off however it ends, and wakes the single operations that waited
/// for its turn to end if there are places for them.
struct WaitingMany<'a>(&'a QueueSlots);

impl Drop for WaitingMany<'_> {
    fn drop(&mut self) {
        let slots = self.0;
        // SeqCst, as `give_back`: either this sees the places a give-back added, or that
        // give-back sees this batch still waiting and wakes everyone.
        slots.waiting_many.fetch_sub(1, Ordering::SeqCst);
        if slots.free.load(Ordering::SeqCst) > 0 && slots.waiting.load(Ordering::SeqCst) > 0 {
            slots.freed.notify_waiters();
        }
    }
}

impl QueueSlots {
    /// A queue with `depth` free places.
    pub(in crate::rdma) fn new(depth: usize) -> Self {
        QueueSlots {
            free: AtomicUsize::new(depth),
            waiting: AtomicUsize::new(0),
            waiting_many: AtomicUsize::new(0),
            freed: Notify::new(),
        }
    }

    /// Takes `n` places if that many are free and no batch waits for its turn.
    #[inline]
    pub(in crate::rdma) fn try_take(&self, n: usize) -> bool {
        self.waiting_many.load(Ordering::SeqCst) == 0 && self.take_free(n)
    }

    /// Takes `n` places if that many are free, whoever waits.
    fn take_free(&self, n: usize) -> bool {
        // SeqCst: a waiter's count and this read must not pass each other (see `give_back`).
        let mut free = self.free.load(Ordering::SeqCst);
        loop {
            if free < n {
                return false;
            }
            match self.free.compare_exchange_weak(
                free,
                free - n,
                Ordering::SeqCst,
                Ordering::SeqCst,
            ) {
                Ok(_) => return true,
                Err(now) => free = now,
            }
        }
    }

    /// Takes `n` places (at most the depth), waiting until that many are free. A batch
    /// (`n` > 1) that waits has its turn: operations of one place wait until it has taken its
    /// places or given up.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a dropped wait took no place, and a wake-up it was given goes on to another
    /// waiter (Tokio's `Notified` passes it on when dropped); a dropped batch ends its turn.
    pub(in crate::rdma) async fn take(&self, n: usize) {
        if self.try_take(n) {
            return;
        }
        self.waiting.fetch_add(1, Ordering::SeqCst);
        let _waiting = Waiting(&self.waiting);
        // Counted for the whole wait, wake-ups included: a batch woken by the places it waited
        // for must not find them taken by single operations before it looks.
        let _waiting_many = (n > 1).then(|| {
            self.waiting_many.fetch_add(1, Ordering::SeqCst);
            WaitingMany(self)
        });
        loop {
            let notified = self.freed.notified();
            tokio::pin!(notified);
            // Registered before the look: a place given back after it wakes this wait.
            notified.as_mut().enable();
            let took = if n > 1 {
                self.take_free(n)
            } else {
                self.try_take(n)
            };
            if took {
                return;
            }
            notified.await;
        }
    }

    /// Gives `n` places back.
    pub(in crate::rdma) fn give_back(&self, n: usize) {
        // SeqCst on both sides: either the waiter's look sees these places, or this sees its
        // count and wakes it.
        self.free.fetch_add(n, Ordering::SeqCst);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            if self.waiting_many.load(Ordering::SeqCst) > 0 {
                self.freed.notify_waiters();
            } else {
                for _ in 0..n {
                    self.freed.notify_one();
                }
            }
        }
    }

    /// The places free now.
    pub(in crate::rdma) fn available(&self) -> usize {
        self.free.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::AtomicUsize;
    use std::task::{Context, Poll};

    use super::*;

    #[test]
    fn places_are_taken_until_none_is_free_and_come_back() {
        let slots = QueueSlots::new(2);
        assert!(slots.try_take(1));
        assert!(slots.try_take(1));
        assert!(!slots.try_take(1), "a third place out of two");
        assert_eq!(slots.available(), 0);
        slots.give_back(1);
        assert_eq!(slots.available(), 1);
        assert!(slots.try_take(1));
    }

    /// A batch waits until all of its places are free, and a waiter for one place still gets
    /// the place that comes back while the batch waits (its wake-up is not spent on the batch).
    #[tokio::test(flavor = "current_thread")]
    async fn a_batch_takes_all_its_places_at_once_and_single_waiters_are_not_starved() {
        let slots = QueueSlots::new(4);
        assert!(slots.try_take(3));
        assert!(!slots.try_take(2), "two places out of one");
        let mut batch = std::pin::pin!(slots.take(4));
        let mut single = std::pin::pin!(slots.take(2));
        let (batch_woken, batch_waker) = crate::wake_count::counting_waker();
        let (single_woken, single_waker) = crate::wake_count::counting_waker();
        let mut batch_cx = Context::from_waker(&batch_waker);
        let mut single_cx = Context::from_waker(&single_waker);
        assert!(batch.as_mut().poll(&mut batch_cx).is_pending());
        assert!(single.as_mut().poll(&mut single_cx).is_pending());
        slots.give_back(1);
        assert_eq!(
            single_woken.get(),
            1,
            "the places came back without waking their waiter"
        );
        assert!(
            batch.as_mut().poll(&mut batch_cx).is_pending(),
            "4 places out of 2"
        );
        assert!(single.as_mut().poll(&mut single_cx).is_ready());
        assert_eq!(slots.available(), 0);
        let woken = batch_woken.get();
        slots.give_back(4);
        assert!(
            batch_woken.get() > woken,
            "the batch's places came back without waking it"
        );
        assert!(batch.as_mut().poll(&mut batch_cx).is_ready());
        assert_eq!(slots.available(), 0);
    }

    /// While a batch waits, a single operation takes no place, even one that is free: the
    /// places add up to the batch's, and the single operation is woken for the first place
    /// given back after the batch took its own.
    #[tokio::test(flavor = "current_thread")]
    async fn a_waiting_batch_has_its_turn_before_single_operations() {
        let slots = QueueSlots::new(4);
        assert!(slots.try_take(4));
        let mut batch = std::pin::pin!(slots.take(3));
        let (_, batch_waker) = crate::wake_count::counting_waker();
        let mut batch_cx = Context::from_waker(&batch_waker);
        assert!(batch.as_mut().poll(&mut batch_cx).is_pending());
        slots.give_back(1);
        assert!(
            !slots.try_take(1),
            "a single operation took a place while a batch waited for it"
        );
        let mut single = std::pin::pin!(slots.take(1));
        let (single_woken, single_waker) = crate::wake_count::counting_waker();
        let mut single_cx = Context::from_waker(&single_waker);
        assert!(
            single.as_mut().poll(&mut single_cx).is_pending(),
            "a single operation waiting took a place while a batch waited for it"
        );
        slots.give_back(2);
        assert!(
            batch.as_mut().poll(&mut batch_cx).is_ready(),
            "the batch's places came back and it did not get them"
        );
        assert_eq!(slots.available(), 0);
        assert!(single.as_mut().poll(&mut single_cx).is_pending());
        let woken = single_woken.get();
        slots.give_back(1);
        assert!(
            single_woken.get() > woken,
            "a place came back after the batch's turn without waking the single operation"
        );
        assert!(single.as_mut().poll(&mut single_cx).is_ready());
    }

    /// A batch that gives up its wait ends its turn: the single operation that waited behind
    /// it is woken and takes the place that was free all along.
    #[tokio::test(flavor = "current_thread")]
    async fn a_dropped_batch_ends_its_turn_and_wakes_single_operations() {
        let slots = QueueSlots::new(2);
        assert!(slots.try_take(2));
        let mut batch = Box::pin(slots.take(2));
        let (_, batch_waker) = crate::wake_count::counting_waker();
        assert!(
            batch
                .as_mut()
                .poll(&mut Context::from_waker(&batch_waker))
                .is_pending()
        );
        slots.give_back(1);
        let mut single = std::pin::pin!(slots.take(1));
        let (single_woken, single_waker) = crate::wake_count::counting_waker();
        let mut single_cx = Context::from_waker(&single_waker);
        assert!(single.as_mut().poll(&mut single_cx).is_pending());
        let woken = single_woken.get();
        drop(batch);
        assert!(
            single_woken.get() > woken,
            "the batch gave up its turn without waking the single operation"
        );
        assert!(single.as_mut().poll(&mut single_cx).is_ready());
        assert_eq!(slots.available(), 0);
    }

    /// Tasks on several threads keep taking and giving back single places while a batch of the
    /// whole depth waits: the batch gets its turn, and the single operations go on after it (no
    /// wake-up is lost between the end of its turn and them).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn a_batch_and_single_operations_contending_all_finish() {
        use std::sync::atomic::AtomicBool;
        const DEPTH: usize = 4;
        let slots = Arc::new(QueueSlots::new(DEPTH));
        let stop = Arc::new(AtomicBool::new(false));
        let taken = Arc::new(AtomicUsize::new(0));
        let singles: Vec<_> = (0..6)
            .map(|_| {
                let (slots, stop, taken) = (slots.clone(), stop.clone(), taken.clone());
                tokio::spawn(async move {
                    while !stop.load(Ordering::SeqCst) {
                        slots.take(1).await;
                        taken.fetch_add(1, Ordering::SeqCst);
                        tokio::task::yield_now().await;
                        slots.give_back(1);
                    }
                })
            })
            .collect();
        // The batch starts once the single operations are under way.
        while taken.load(Ordering::SeqCst) < 100 {
            tokio::task::yield_now().await;
        }
        tokio::time::timeout(std::time::Duration::from_secs(60), slots.take(DEPTH))
            .await
            .expect("single operations kept a batch from its places");
        assert_eq!(slots.available(), 0);
        slots.give_back(DEPTH);
        stop.store(true, Ordering::SeqCst);
        for task in singles {
            tokio::time::timeout(std::time::Duration::from_secs(60), task)
                .await
                .expect("a single operation waited forever after the batch")
                .expect("a single operation failed");
        }
        assert_eq!(slots.available(), DEPTH);
    }

    /// Many tasks on several threads contend for few places: never more are held than exist,
    /// and every task gets its turns (no wake-up is lost, also when waits are dropped).
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn contending_tasks_never_exceed_the_depth_and_all_finish() {
        const DEPTH: usize = 3;
        let slots = Arc::new(QueueSlots::new(DEPTH));
        let held = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..16)
            .map(|i| {
                let (slots, held) = (slots.clone(), held.clone());
                tokio::spawn(async move {
                    for round in 0..200 {
                        if (i + round) % 5 == 0 {
                            // A wait given up after one poll: it must not swallow a wake-up.
                            let mut dropped = std::pin::pin!(slots.take(1));
                            let took = std::future::poll_fn(|cx| {
                                Poll::Ready(dropped.as_mut().poll(cx).is_ready())
                            })
                            .await;
                            if took {
                                slots.give_back(1);
                            }
                        }
                        slots.take(1).await;
                        let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                        assert!(now <= DEPTH, "{now} places held of {DEPTH}");
                        tokio::task::yield_now().await;
                        held.fetch_sub(1, Ordering::SeqCst);
                        slots.give_back(1);
                    }
                })
            })
            .collect();
        for task in tasks {
            tokio::time::timeout(std::time::Duration::from_secs(60), task)
                .await
                .expect("a task waited forever for a place")
                .expect("a task failed");
        }
        assert_eq!(slots.available(), DEPTH);
    }
}
