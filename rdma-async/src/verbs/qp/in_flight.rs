//! Work requests on caller-owned memory: the buffers move into a slot of a table before the work
//! request is posted and leave it only when its completion has been polled.
//!
//! This is what makes posting from caller memory safe without trusting the caller: a posted
//! buffer is reachable only through the table, which gives it back (or frees it) when the
//! completion with the slot's `wr_id` arrives. A future that waits for the completion only
//! borrows its slot; if it is dropped, the slot is marked abandoned and freed by whoever polls
//! the completion. Queue pairs (and shared receive queues) that post from a table hold an `Arc`
//! to it, so the table, and every buffer still in it, outlives the queue that could touch them.

use std::io;
use std::task::{Context, Poll, Waker};

use crate::error;
use crate::sync::{Lock, LockGuard};
use crate::verbs::cq::{PolledCompletion, WcStatus, WorkCompletion};
use crate::verbs::mr::{UserBuffer, WindowBinding};

/// The buffers a work request uses, held by its slot while it is outstanding.
#[derive(Debug, Default)]
pub(crate) enum Held {
    /// No memory (a zero-length receive for an RDMA write with immediate, for example).
    #[default]
    Nothing,
    One(UserBuffer),
    Many(Vec<UserBuffer>),
    /// The buffers of a batch: one work request each, all posted as one list, with one slot
    /// ([`batch_member_id`]).
    Batch(Vec<UserBuffer>),
    /// A memory window and the region it is bound over (a bind or an invalidation).
    Window(Box<WindowBinding>),
    /// A device-free stand-in for registered memory (the `in_flight` fuzz harness): it records
    /// when it is dropped, so the harness sees every buffer come back exactly once.
    #[cfg(any(test, rdma_async_fuzzing))]
    Probe(Probe),
}

/// A device-free buffer for the `in_flight` fuzz harness: dropping it adds its id to a shared
/// log, so the harness sees which buffers came back and how often.
#[cfg(any(test, rdma_async_fuzzing))]
#[derive(Debug)]
pub(crate) struct Probe {
    pub(crate) id: u32,
    pub(crate) dropped: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
}

#[cfg(any(test, rdma_async_fuzzing))]
impl Drop for Probe {
    fn drop(&mut self) {
        self.dropped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(self.id);
    }
}

impl Held {
    pub(crate) fn get(&self, index: usize) -> Option<&UserBuffer> {
        match self {
            Held::Nothing => None,
            Held::One(b) => (index == 0).then_some(b),
            Held::Many(v) | Held::Batch(v) => v.get(index),
            Held::Window(binding) => (index == 0).then(|| binding.region()),
            #[cfg(any(test, rdma_async_fuzzing))]
            Held::Probe(_) => None,
        }
    }

    /// The work requests these buffers went out in: the places of the work queue they hold.
    pub(crate) fn places(&self) -> usize {
        match self {
            Held::Batch(v) => v.len(),
            _ => 1,
        }
    }
}

/// Which work queue a slot's request went to (each has its own depth).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WorkQueue {
    Send,
    Recv,
}

/// A claim on one slot: index and generation, as encoded in the work request id.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Ticket {
    index: u32,
    generation: u32,
    /// The waiter's waker went into the slot with the buffers
    /// ([`InFlightTable::insert_waiting`]).
    waker_set: bool,
}

/// The bit that marks the work request ids of a shared receive queue's table.
pub(crate) const SHARED_TABLE_BIT: u64 = 1 << 63;

/// The bit that marks the members of a batch before its last request ([`batch_member_id`]).
const BATCH_MEMBER_BIT: u64 = 1 << 62;

/// Slot generations stay below the two marking bits of a work request id.
const GENERATION_MASK: u32 = 0x3fff_ffff;

/// The id of a batch's requests before its last (whose id is the slot's own `wr_id`). They are
/// posted unsignaled: on success they never complete, and the last one's completion frees the
/// slot. A member that fails completes with an error all the same, and so may the flushes
/// behind it; such a completion records its error in the slot ([`Completing`]) but frees
/// nothing, since the requests after it may still be in the device's hands until the last one's
/// completion, which always comes (signaled, or flushed).
pub(crate) fn batch_member_id(wr_id: u64) -> u64 {
    wr_id | BATCH_MEMBER_BIT
}

impl Ticket {
    fn wr_id(&self, tag: u64) -> u64 {
        tag | (u64::from(self.generation) << 32) | u64::from(self.index)
    }

    fn from_wr_id(wr_id: u64) -> Self {
        Ticket {
            index: wr_id as u32,
            generation: ((wr_id & !(SHARED_TABLE_BIT | BATCH_MEMBER_BIT)) >> 32) as u32,
            waker_set: false,
        }
    }

    /// Whether the slot was given its waiter's waker when it was filled: until the waiter's
    /// task polls again elsewhere, its completion wakes it without a first
    /// [`InFlightTable::poll`].
    pub(crate) fn waker_set(&self) -> bool {
        self.waker_set
    }
}

/// [`InFlightTable::insert`]'s error when no slot is free. Cold and out of line: posts find a
/// slot free (a connection's take a queue slot first), and every post inlines the insert.
#[cold]
#[inline(never)]
fn table_full() -> io::Error {
    error::invalid_input("more work requests outstanding than the queues hold")
}

/// Where a slot's request is. The buffers, the waker and the completion are fields of the slot
/// beside it, so that a step moves only what it changes (whole states moved in and out of the
/// slot cost a 64 B `RdmaConnection` write at depth 64 about 25 instructions).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotState {
    /// No request: `held` is `Nothing`, `waker` is `None`.
    Free,
    /// Outstanding; `waker` (if any) is its waiter's.
    Posted,
    /// Completed with `wc`, which waits for its waiter with the buffers.
    Done,
    /// Outstanding, and its waiter went away.
    Abandoned,
}

#[derive(Debug)]
struct Slot {
    generation: u32,
    queue: WorkQueue,
    state: SlotState,
    held: Held,
    waker: Option<Waker>,
    /// The completion, while `Done`; before, the error of a batch's failed member, if
    /// `member_failed`.
    wc: WorkCompletion,
    /// A member of the slot's batch completed with an error, kept in `wc`.
    member_failed: bool,
}

#[derive(Debug)]
struct SlotTable {
    slots: Vec<Slot>,
    free: Vec<u32>,
    outstanding: usize,
}

/// The table of outstanding work requests of one queue pair (or shared receive queue).
#[derive(Debug)]
pub(crate) struct InFlightTable {
    /// `Lock`, not `std`'s mutex: no poisoning to check on each of the three locks a 64 B
    /// `RdmaConnection` write takes here (its insert, its hand-over and its pick-up).
    inner: Lock<SlotTable>,
    tag: u64,
}

impl InFlightTable {
    /// A table of `capacity` slots; `shared` marks its ids with [`SHARED_TABLE_BIT`].
    pub(crate) fn new(capacity: usize, shared: bool) -> Self {
        let slots = (0..capacity)
            .map(|_| Slot {
                generation: 0,
                queue: WorkQueue::Send,
                state: SlotState::Free,
                held: Held::Nothing,
                waker: None,
                wc: WorkCompletion::EMPTY,
                member_failed: false,
            })
            .collect();
        InFlightTable {
            inner: Lock::new(SlotTable {
                slots,
                free: (0..capacity as u32).rev().collect(),
                outstanding: 0,
            }),
            tag: if shared { SHARED_TABLE_BIT } else { 0 },
        }
    }

    #[inline]
    fn lock(&self) -> LockGuard<'_, SlotTable> {
        self.inner.lock()
    }

    /// Whether `wr_id` names a slot of this table.
    pub(crate) fn owns(&self, wr_id: u64) -> bool {
        wr_id & SHARED_TABLE_BIT == self.tag
    }

    /// Work requests whose completion has not been polled yet.
    pub(crate) fn outstanding(&self) -> usize {
        self.lock().outstanding
    }

    /// Moves `held` into a free slot; the returned id goes into the work request.
    pub(crate) fn insert(
        &self,
        held: Held,
        queue: WorkQueue,
    ) -> Result<(Ticket, u64), (io::Error, Held)> {
        self.insert_with(held, queue, None)
    }

    /// As [`Self::insert`], with the waker its completion wakes: the waiter posting from its
    /// task's poll needs no [`Self::poll`] to register it. Inlined, as `insert_with`: every
    /// `RdmaConnection` operation posts through it.
    #[inline(always)]
    pub(crate) fn insert_waiting(
        &self,
        held: Held,
        queue: WorkQueue,
        waker: &Waker,
    ) -> Result<(Ticket, u64), (io::Error, Held)> {
        self.insert_with(held, queue, Some(waker.clone()))
    }

    /// Always inlined: every post fills a slot here, and its callers are one-line wrappers.
    #[inline(always)]
    fn insert_with(
        &self,
        held: Held,
        queue: WorkQueue,
        waker: Option<Waker>,
    ) -> Result<(Ticket, u64), (io::Error, Held)> {
        let waker_set = waker.is_some();
        let mut t = self.lock();
        let Some(index) = t.free.pop() else {
            return Err((table_full(), held));
        };
        t.outstanding += 1;
        let slot = &mut t.slots[index as usize];
        slot.queue = queue;
        slot.state = SlotState::Posted;
        // A free slot holds `Nothing` (`release` took its buffers out): there is nothing to
        // drop, and forgetting it spares the call to `Held`'s drop glue.
        let free = std::mem::replace(&mut slot.held, held);
        debug_assert!(matches!(free, Held::Nothing), "a free slot held buffers");
        std::mem::forget(free);
        slot.waker = waker;
        let ticket = Ticket {
            index,
            generation: slot.generation,
            waker_set,
        };
        let wr_id = ticket.wr_id(self.tag);
        Ok((ticket, wr_id))
    }

    /// Gives the buffers back after posting failed (the work request never reached the device).
    pub(crate) fn take_back(&self, ticket: Ticket) -> Held {
        let mut t = self.lock();
        if t.slots[ticket.index as usize].state != SlotState::Posted {
            return Held::Nothing;
        }
        Self::release(&mut t, ticket.index)
    }

    /// Frees slot `index`; returns its buffers.
    #[inline]
    fn release(t: &mut SlotTable, index: u32) -> Held {
        let slot = &mut t.slots[index as usize];
        slot.state = SlotState::Free;
        slot.generation = slot.generation.wrapping_add(1) & GENERATION_MASK;
        slot.waker = None;
        slot.member_failed = false;
        let held = std::mem::take(&mut slot.held);
        t.free.push(index);
        t.outstanding -= 1;
        held
    }

    /// Records a polled completion and wakes its waiter. When the waiter is gone the slot is freed
    /// here: its queue and buffers are returned, and the caller drops the buffers after this
    /// returns (deregistering takes a system call, not to be made under the lock).
    pub(crate) fn complete(&self, wc: &WorkCompletion) -> Option<(WorkQueue, Held)> {
        self.completing().complete(wc)
    }

    /// The table locked for a batch of polled completions: dispatching a batch then takes the
    /// lock once rather than once per completion.
    pub(crate) fn completing(&self) -> Completing<'_> {
        Completing { t: self.lock() }
    }

    /// Ends every outstanding work request as flushed, for a queue pair that was destroyed
    /// before their completions could be polled: each waiter is woken with a
    /// `IBV_WC_WR_FLUSH_ERR` completion (and gets its buffers back); the slots whose waiter went
    /// away are freed and returned with their buffers, to be dropped after this returns.
    ///
    /// Call this only once no queue that posted from this table can still touch the buffers
    /// (it was destroyed): the table cannot tell.
    pub(crate) fn flush_all(&self) -> Vec<(WorkQueue, Held)> {
        let mut t = self.lock();
        let mut freed = Vec::new();
        for index in 0..t.slots.len() {
            let slot = &mut t.slots[index];
            let wr_id = Ticket {
                index: index as u32,
                generation: slot.generation,
                waker_set: false,
            }
            .wr_id(self.tag);
            let queue = slot.queue;
            match slot.state {
                SlotState::Posted => {
                    // A batch member's error says more than the flush.
                    if !slot.member_failed {
                        slot.wc = WorkCompletion {
                            wr_id,
                            status: WcStatus::FLUSH,
                            ..WorkCompletion::EMPTY
                        };
                    }
                    slot.state = SlotState::Done;
                    if let Some(w) = slot.waker.take() {
                        w.wake();
                    }
                }
                SlotState::Abandoned => {
                    let held = Self::release(&mut t, index as u32);
                    freed.push((queue, held));
                }
                SlotState::Free | SlotState::Done => {}
            }
        }
        freed
    }

    /// Whether `ticket`'s request has completed (its completion waits to be picked up).
    pub(crate) fn is_done(&self, ticket: &Ticket) -> bool {
        let t = self.lock();
        let slot = &t.slots[ticket.index as usize];
        slot.generation == ticket.generation && slot.state == SlotState::Done
    }

    /// Waits for the completion of `ticket`'s request; returns it with the buffers and frees the
    /// slot (of the returned queue). A ticket whose request was handed out already (its slot
    /// may hold another request now) stays pending.
    ///
    /// Inlined into the waiter's poll: through a call, the completion and the buffers were
    /// copied out once more for every operation. Always: since batches, LLVM kept it out of
    /// line otherwise.
    #[inline(always)]
    pub(crate) fn poll(
        &self,
        ticket: &Ticket,
        cx: &mut Context<'_>,
    ) -> Poll<(WorkCompletion, Held, WorkQueue)> {
        let mut t = self.lock();
        let slot = &mut t.slots[ticket.index as usize];
        if slot.generation != ticket.generation {
            // Neither the other request's completion nor its waker is this ticket's.
            return Poll::Pending;
        }
        match slot.state {
            SlotState::Posted => {
                match &slot.waker {
                    Some(w) if w.will_wake(cx.waker()) => {}
                    _ => slot.waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Done => {
                let (wc, queue) = (slot.wc, slot.queue);
                let held = Self::release(&mut t, ticket.index);
                Poll::Ready((wc, held, queue))
            }
            SlotState::Free | SlotState::Abandoned => Poll::Pending,
        }
    }

    /// The waiter of `ticket` went away. A completed request's slot is freed: its queue and
    /// buffers are returned, to be dropped. An outstanding one's buffers stay in the slot until
    /// its completion is polled.
    pub(crate) fn abandon(&self, ticket: &Ticket) -> Option<(WorkQueue, Held)> {
        let mut t = self.lock();
        let slot = &mut t.slots[ticket.index as usize];
        if slot.generation != ticket.generation {
            return None;
        }
        let queue = slot.queue;
        match slot.state {
            SlotState::Posted => {
                slot.state = SlotState::Abandoned;
                slot.waker = None;
                None
            }
            SlotState::Done => Some((queue, Self::release(&mut t, ticket.index))),
            SlotState::Free | SlotState::Abandoned => None,
        }
    }
}

/// An [`InFlightTable`] locked for a batch of completions ([`InFlightTable::completing`]).
/// Buffers freed through it are dropped by the caller once it is dropped (the lock released).
pub(crate) struct Completing<'a> {
    t: LockGuard<'a, SlotTable>,
}

impl Completing<'_> {
    /// As [`InFlightTable::complete`], under the lock already held.
    pub(crate) fn complete(&mut self, wc: &WorkCompletion) -> Option<(WorkQueue, Held)> {
        self.complete_with(wc.wr_id, || *wc)
    }

    /// As [`Self::complete`], for a completion as it was polled: it is decoded straight into
    /// its slot, and only when a waiter takes it.
    pub(crate) fn complete_polled(&mut self, wc: &PolledCompletion) -> Option<(WorkQueue, Held)> {
        self.complete_with(wc.wr_id(), || wc.to_work_completion())
    }

    #[inline]
    fn complete_with(
        &mut self,
        wr_id: u64,
        wc: impl FnOnce() -> WorkCompletion,
    ) -> Option<(WorkQueue, Held)> {
        let ticket = Ticket::from_wr_id(wr_id);
        let t = &mut *self.t;
        let slot = t.slots.get_mut(ticket.index as usize)?;
        if slot.generation != ticket.generation {
            return None;
        }
        if wr_id & BATCH_MEMBER_BIT != 0 {
            Self::member_completed(slot, wc);
            return None;
        }
        match slot.state {
            SlotState::Posted => {
                slot.state = SlotState::Done;
                if !slot.member_failed {
                    slot.wc = wc();
                }
                if let Some(w) = slot.waker.take() {
                    w.wake();
                }
                None
            }
            SlotState::Abandoned => {
                let queue = slot.queue;
                Some((queue, InFlightTable::release(t, ticket.index)))
            }
            // A second completion for one request cannot happen; keep what is there.
            SlotState::Free | SlotState::Done => None,
        }
    }

    /// A batch member before the last completed: it can only have failed (or been flushed), as
    /// the successful ones are unsignaled. The first error is kept for the batch's waiter; the
    /// slot stays outstanding until the last request's completion. Out of line: batches that
    /// succeed never come here.
    #[cold]
    #[inline(never)]
    fn member_completed(slot: &mut Slot, wc: impl FnOnce() -> WorkCompletion) {
        if slot.member_failed || !matches!(slot.state, SlotState::Posted | SlotState::Abandoned) {
            return;
        }
        let wc = wc();
        if !wc.status.is_success() {
            slot.wc = WorkCompletion {
                wr_id: wc.wr_id & !BATCH_MEMBER_BIT,
                ..wc
            };
            slot.member_failed = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(wr_id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            ..WorkCompletion::EMPTY
        }
    }

    /// Buffers move through every operation's future and slot: kept small, those moves are a
    /// few register copies rather than `memcpy` calls (a boxed registration took a 64 B
    /// `RdmaConnection` write at depth 64 from 3337 to 2717 instructions).
    #[test]
    fn held_buffers_stay_small_enough_to_move_cheaply() {
        assert!(
            size_of::<Held>() <= 48,
            "Held is {} bytes",
            size_of::<Held>()
        );
        assert!(
            size_of::<Slot>() <= 128,
            "Slot is {} bytes",
            size_of::<Slot>()
        );
    }

    #[test]
    fn slots_are_reused_with_a_new_generation() {
        let table = InFlightTable::new(1, false);
        let (ticket, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(table.insert(Held::Nothing, WorkQueue::Send).is_err());
        let waker = std::task::Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(table.poll(&ticket, &mut cx).is_pending());
        assert!(
            table.complete(&wc(id)).is_none(),
            "the waiter frees the slot"
        );
        assert!(matches!(
            table.poll(&ticket, &mut cx),
            Poll::Ready((_, _, WorkQueue::Send))
        ));
        let (_, id2) = table.insert(Held::Nothing, WorkQueue::Recv).unwrap();
        assert_ne!(id, id2);
        // A stale id (the old generation) is ignored.
        assert!(table.complete(&wc(id)).is_none());
        assert_eq!(table.outstanding(), 1);
    }

    /// A ticket polled again after its request was handed out does not take the completion
    /// (and buffers) of the next request in its slot, nor replace that request's waker.
    #[test]
    fn a_stale_ticket_observes_nothing_of_the_next_request_in_its_slot() {
        let table = InFlightTable::new(1, false);
        let (stale, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(table.complete(&wc(id)).is_none());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(table.poll(&stale, &mut cx).is_ready());
        let (next, next_id) = table.insert(Held::Nothing, WorkQueue::Recv).unwrap();
        let (woken, waker) = crate::wake_count::counting_waker();
        assert!(
            table
                .poll(&next, &mut Context::from_waker(&waker))
                .is_pending()
        );
        assert!(
            table.poll(&stale, &mut cx).is_pending(),
            "a stale ticket replaced the next request's waker"
        );
        assert!(table.complete(&wc(next_id)).is_none());
        assert_eq!(woken.get(), 1);
        assert!(
            table.poll(&stale, &mut cx).is_pending(),
            "a stale ticket took the next request's completion"
        );
        match table.poll(&next, &mut cx) {
            Poll::Ready((wc, _, WorkQueue::Recv)) => assert_eq!(wc.wr_id, next_id),
            other => panic!("the next request lost its completion: {other:?}"),
        }
        assert_eq!(table.outstanding(), 0);
    }

    #[test]
    fn flushing_all_wakes_waiters_with_their_buffers_and_frees_abandoned_slots() {
        let table = InFlightTable::new(4, false);
        let (waited, _) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        let (abandoned, _) = table.insert(Held::Nothing, WorkQueue::Recv).unwrap();
        let (done, done_id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        let (woken, waker) = crate::wake_count::counting_waker();
        let mut cx = Context::from_waker(&waker);
        assert!(table.poll(&waited, &mut cx).is_pending());
        assert!(table.abandon(&abandoned).is_none());
        assert!(table.complete(&wc(done_id)).is_none());
        let freed = table.flush_all();
        assert!(matches!(
            freed.as_slice(),
            [(WorkQueue::Recv, Held::Nothing)]
        ));
        assert_eq!(woken.get(), 1);
        match table.poll(&waited, &mut cx) {
            Poll::Ready((wc, _, WorkQueue::Send)) => assert_eq!(wc.status, WcStatus::FLUSH),
            other => panic!("the waiter was not ended: {other:?}"),
        }
        // A completion polled before the flush keeps its own status.
        match table.poll(&done, &mut cx) {
            Poll::Ready((wc, _, _)) => assert_eq!(wc.wr_id, done_id),
            other => panic!("the completed request was lost: {other:?}"),
        }
        assert_eq!(table.outstanding(), 0);
        assert!(table.flush_all().is_empty());
    }

    /// A waker given with the buffers is woken by the completion, with no poll before it.
    #[test]
    fn a_waker_given_at_insert_is_woken_by_the_completion() {
        let table = InFlightTable::new(2, false);
        let (woken, waker) = crate::wake_count::counting_waker();
        let (ticket, id) = table
            .insert_waiting(Held::Nothing, WorkQueue::Send, &waker)
            .unwrap();
        assert!(ticket.waker_set());
        let (plain, _) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(!plain.waker_set());
        assert!(table.complete(&wc(id)).is_none());
        assert_eq!(woken.get(), 1);
        assert!(table.is_done(&ticket));
    }

    /// One lock for a batch: each completion reaches its own slot, a waiter's is kept for it and
    /// an abandoned slot is freed, as `complete` does one at a time.
    #[test]
    fn a_batch_completed_under_one_lock_reaches_every_slot() {
        let table = InFlightTable::new(3, false);
        let (waited, waited_id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        let (abandoned, abandoned_id) = table.insert(Held::Nothing, WorkQueue::Recv).unwrap();
        let (stale, stale_id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(table.complete(&wc(stale_id)).is_none());
        assert!(table.poll(&stale, &mut cx).is_ready());
        assert!(table.abandon(&abandoned).is_none());
        let freed: Vec<_> = {
            let mut completing = table.completing();
            [waited_id, stale_id, abandoned_id]
                .iter()
                .filter_map(|&id| completing.complete(&wc(id)))
                .collect()
        };
        assert!(matches!(
            freed.as_slice(),
            [(WorkQueue::Recv, Held::Nothing)]
        ));
        assert!(table.is_done(&waited));
        assert_eq!(table.outstanding(), 1, "only the waited slot is still held");
        assert!(table.poll(&waited, &mut cx).is_ready());
        assert_eq!(table.outstanding(), 0);
    }

    #[test]
    fn abandoned_slots_are_freed_by_their_completion() {
        let table = InFlightTable::new(2, true);
        let (ticket, id) = table.insert(Held::Nothing, WorkQueue::Recv).unwrap();
        assert!(table.owns(id));
        assert!(!InFlightTable::new(1, false).owns(id));
        assert!(table.abandon(&ticket).is_none());
        assert_eq!(table.outstanding(), 1);
        assert!(matches!(
            table.complete(&wc(id)),
            Some((WorkQueue::Recv, _))
        ));
        assert_eq!(table.outstanding(), 0);
    }

    fn failed(wr_id: u64, status: WcStatus) -> WorkCompletion {
        WorkCompletion {
            wr_id,
            status,
            ..WorkCompletion::EMPTY
        }
    }

    /// A batch's members complete only when they fail (or are flushed): their errors are kept
    /// for the waiter, but only the last request's completion frees the slot, since the
    /// device may still read the buffers of the requests behind a failed one until then.
    #[test]
    fn a_batch_slot_keeps_its_first_member_error_and_waits_for_its_last_request() {
        let table = InFlightTable::new(2, false);
        let (ticket, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        let member = batch_member_id(id);
        assert_ne!(member, id);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        assert!(table.poll(&ticket, &mut cx).is_pending());
        // A member reported as successful (a queue pair that signals every request) is
        // nothing to the slot.
        assert!(table.complete(&wc(member)).is_none());
        assert!(
            table
                .complete(&failed(member, WcStatus::REMOTE_ACCESS))
                .is_none()
        );
        assert!(table.complete(&failed(member, WcStatus::FLUSH)).is_none());
        assert!(
            table.poll(&ticket, &mut cx).is_pending(),
            "a member's error handed the buffers out before the last request completed"
        );
        assert_eq!(table.outstanding(), 1);
        assert!(table.complete(&failed(id, WcStatus::FLUSH)).is_none());
        match table.poll(&ticket, &mut cx) {
            Poll::Ready((wc, _, WorkQueue::Send)) => {
                assert_eq!(wc.status, WcStatus::REMOTE_ACCESS, "not the first error");
                assert_eq!(wc.wr_id, id);
            }
            other => panic!("the batch did not complete: {other:?}"),
        }
        // The slot's next request starts with no member error.
        let (next, next_id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(table.complete(&wc(next_id)).is_none());
        match table.poll(&next, &mut cx) {
            Poll::Ready((wc, _, _)) => assert!(wc.status.is_success()),
            Poll::Pending => panic!("the next request did not complete"),
        }
    }

    /// A dropped batch's buffers stay until its last request completes, whatever its members
    /// report; a flush of the table keeps a member's error.
    #[test]
    fn an_abandoned_batch_is_freed_by_its_last_request_and_a_flush_keeps_member_errors() {
        let table = InFlightTable::new(2, false);
        let (dropped, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(table.abandon(&dropped).is_none());
        assert!(
            table
                .complete(&failed(batch_member_id(id), WcStatus::REMOTE_ACCESS))
                .is_none()
        );
        assert_eq!(table.outstanding(), 1, "a member's error freed the slot");
        assert!(table.complete(&failed(id, WcStatus::FLUSH)).is_some());
        assert_eq!(table.outstanding(), 0);

        let (waiting, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
        assert!(
            table
                .complete(&failed(batch_member_id(id), WcStatus::REMOTE_ACCESS))
                .is_none()
        );
        assert!(table.flush_all().is_empty());
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match table.poll(&waiting, &mut cx) {
            Poll::Ready((wc, _, _)) => assert_eq!(wc.status, WcStatus::REMOTE_ACCESS),
            Poll::Pending => panic!("the flush did not complete the batch"),
        }
    }
}

#[cfg(all(test, rdma_async_loom))]
mod loom_tests {
    //! Under loom: a waiter whose future is dropped racing the completion (or the flush) of its
    //! request. Whoever frees the slot hands its buffers back: exactly one of the waiter's poll,
    //! its abandonment and the poller, in every interleaving, and the slot is free afterwards.

    use std::sync::Arc;

    use loom::thread;

    use super::*;

    /// Runs the waiter (one poll, then dropped) against `poller` (true when it freed the slot).
    fn race(poller: fn(&InFlightTable, u64) -> bool) {
        loom::model(move || {
            let table = Arc::new(InFlightTable::new(1, false));
            let (ticket, id) = table.insert(Held::Nothing, WorkQueue::Send).unwrap();
            let poller = {
                let table = table.clone();
                thread::spawn(move || poller(&table, id))
            };
            let mut cx = Context::from_waker(Waker::noop());
            let by_poll = table.poll(&ticket, &mut cx).is_ready();
            let by_abandon = !by_poll && table.abandon(&ticket).is_some();
            let by_poller = poller.join().unwrap();
            let handed_back = [by_poll, by_abandon, by_poller];
            assert_eq!(
                handed_back.iter().filter(|&&b| b).count(),
                1,
                "the buffers went back {handed_back:?} (poll, abandon, poller)"
            );
            assert_eq!(table.outstanding(), 0);
            assert!(table.insert(Held::Nothing, WorkQueue::Recv).is_ok());
        });
    }

    #[test]
    fn loom_a_dropped_waiter_racing_its_completion_frees_the_slot_once() {
        race(|table, id| {
            let wc = WorkCompletion {
                wr_id: id,
                ..WorkCompletion::EMPTY
            };
            table.complete(&wc).is_some()
        });
    }

    #[test]
    fn loom_a_dropped_waiter_racing_a_flush_frees_the_slot_once() {
        race(|table, _| !table.flush_all().is_empty());
    }
}
