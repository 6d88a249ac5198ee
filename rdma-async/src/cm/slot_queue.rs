//! [`SlotQueue`]: one work queue whose work requests each use one slot of registered memory, as
//! `Endpoint`'s and `RDatagram`'s sends and receives do. It owns the completion queue, the
//! waiter, the free slots (or what arrived in them) and the queue's first failure; each
//! transport keeps only its posting and its parsing of completions (the `reap` closures).

use std::collections::VecDeque;
use std::io;

use tokio::sync::{Mutex, MutexGuard};

use super::link::CmLink;
use super::{ConnWaiter, Woken};
use crate::error::StickyError;
use crate::reactor::{AsyncCq, SendOrder};
use crate::verbs::{CompletionBatch, WorkCompletion};

/// Completions polled at once.
const REAP_BATCH: usize = 16;
/// Completions one [`SlotQueue::reap_queued`] call hands over at most (as many as a stream's
/// `try_read` handles).
pub(crate) const REAP_LIMIT: usize = 8 * REAP_BATCH;

/// The slots of a [`SlotQueue`], behind its lock.
#[derive(Debug)]
pub(crate) struct Slots<R, H> {
    /// Slots whose work request completed: free for the next post.
    pub(crate) free: Vec<usize>,
    /// What each posted slot keeps alive until its completion (an address handle, say).
    pub(crate) held: Vec<Option<H>>,
    /// What completed and waits to be taken, oldest first.
    pub(crate) ready: VecDeque<R>,
    /// The order the slots were posted in, for a send queue that signals only some sends
    /// (`Endpoint`'s); unused by queues that signal every work request.
    pub(crate) order: SendOrder,
}

impl<R, H> Slots<R, H> {
    /// How many slots there are.
    pub(crate) fn depth(&self) -> usize {
        self.held.len()
    }

    /// Gives `slot` back after its completion, dropping what it held; ignores a number that is
    /// no slot.
    pub(crate) fn release(&mut self, slot: usize) {
        if let Some(held) = self.held.get_mut(slot) {
            *held = None;
            self.free.push(slot);
        }
    }
}

/// How a transport handles one completion of its queue.
pub(crate) trait Reap<R, H>: FnMut(&mut Slots<R, H>, &WorkCompletion) {}
impl<R, H, F: FnMut(&mut Slots<R, H>, &WorkCompletion)> Reap<R, H> for F {}

/// A work queue of slots: see the module documentation. `R` is what a completion delivers to
/// be taken later (receives), `H` what a posted slot holds (sends).
#[derive(Debug)]
pub(crate) struct SlotQueue<R = (), H = ()> {
    cq: AsyncCq,
    waiter: ConnWaiter,
    slots: Mutex<Slots<R, H>>,
    error: StickyError,
}

impl<R, H> SlotQueue<R, H> {
    /// A queue of `depth` slots, all free. With `link`, waits also end when the connection
    /// closes (the transport must then pass the same link).
    pub(crate) fn new(cq: AsyncCq, depth: usize, link: Option<&CmLink>) -> io::Result<Self> {
        Ok(SlotQueue {
            waiter: ConnWaiter::new(&cq, link)?,
            cq,
            slots: Mutex::new(Slots {
                free: (0..depth).rev().collect(),
                held: (0..depth).map(|_| None).collect(),
                ready: VecDeque::new(),
                order: SendOrder::default(),
            }),
            error: StickyError::default(),
        })
    }

    /// The slots, once no other task uses them; held across the waits below, so completions
    /// are handled in order.
    pub(crate) async fn lock(&self) -> MutexGuard<'_, Slots<R, H>> {
        // `lock` was a cooperative yield point: keep one. An uncontended lock is taken without
        // building `lock`'s future (a semaphore acquire): about 90 instructions less per use.
        tokio::task::coop::consume_budget().await;
        match self.slots.try_lock() {
            Ok(guard) => guard,
            Err(_) => self.slots.lock().await,
        }
    }

    /// The slots, or `WouldBlock` while another task uses them.
    pub(crate) fn try_lock(&self) -> io::Result<MutexGuard<'_, Slots<R, H>>> {
        self.slots
            .try_lock()
            .map_err(|_| io::ErrorKind::WouldBlock.into())
    }

    /// The queue's first failure, reported to every later use.
    pub(crate) fn error(&self) -> &StickyError {
        &self.error
    }

    /// Hands completions already queued to `reap`, at most [`REAP_LIMIT`]; returns how many
    /// there were. The bound matters for receives: each reaped receive is posted again, so a
    /// peer that sends without pause would keep the queue full, and an unbounded loop would
    /// hold the task (and, on a `current_thread` runtime, every other task) and grow `ready`
    /// without end. What is left stays queued for the next call.
    pub(crate) fn reap_queued(
        &self,
        slots: &mut Slots<R, H>,
        reap: &mut impl Reap<R, H>,
    ) -> io::Result<usize> {
        let mut batch = CompletionBatch::<REAP_BATCH>::new();
        let mut total = 0;
        while total < REAP_LIMIT {
            let wcs = self.cq.try_poll_batch(&mut batch)?;
            if wcs.is_empty() {
                break;
            }
            total += wcs.len();
            wcs.iter()
                .for_each(|wc| reap(slots, &wc.to_work_completion()));
        }
        Ok(total)
    }

    /// Waits for completions, which go to `reap`, or for `link` to close (`Ok` too: callers
    /// look again).
    ///
    /// Cancel safety: completions are taken only when they are reaped.
    pub(crate) async fn reap_next(
        &self,
        slots: &mut Slots<R, H>,
        link: Option<&CmLink>,
        reap: &mut impl Reap<R, H>,
    ) -> io::Result<()> {
        let mut batch = CompletionBatch::<REAP_BATCH>::new();
        match self.waiter.wait(&self.cq, link, &mut batch).await {
            Woken::Completions(n) => {
                n?;
                batch
                    .as_slice()
                    .iter()
                    .for_each(|wc| reap(slots, &wc.to_work_completion()));
                Ok(())
            }
            Woken::Closed(closed) => closed,
        }
    }

    /// Fails with `link`'s closed error (for a sender when `sending`) once it is closed or
    /// closing; its channel is read only when it is readable.
    fn check_open(&self, link: Option<&CmLink>, sending: bool) -> io::Result<()> {
        if let (Some(link), Some(cm)) = (link, self.waiter.cm())
            && cm.try_closed(link)?
        {
            return Err(link.closed_error(sending));
        }
        Ok(())
    }

    /// Takes a free slot, reaping what completed and waiting while every slot is in flight.
    ///
    /// # Errors
    ///
    /// The queue's recorded failure; with `link`, its closed error once it closes.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a slot is taken only when returned.
    pub(crate) async fn take_free(
        &self,
        slots: &mut Slots<R, H>,
        link: Option<&CmLink>,
        reap: &mut impl Reap<R, H>,
    ) -> io::Result<usize> {
        loop {
            // Everything completed is reaped first, so a failure that completed before a
            // disconnect is what gets reported, and shows before the next post.
            self.reap_queued(slots, reap)?;
            if let Some(e) = self.error.report() {
                return Err(e);
            }
            self.check_open(link, true)?;
            if let Some(slot) = slots.free.pop() {
                return Ok(slot);
            }
            self.reap_next(slots, link, reap).await?;
        }
    }

    /// Waits until a ready entry matches `wanted` and takes it (a sender waiting for its own
    /// completion).
    ///
    /// # Errors
    ///
    /// With `link`, its closed error once it closes before the entry arrived.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the entry stays ready if it arrives after the future was dropped.
    pub(crate) async fn take_ready(
        &self,
        slots: &mut Slots<R, H>,
        link: Option<&CmLink>,
        reap: &mut impl Reap<R, H>,
        wanted: impl Fn(&R) -> bool,
    ) -> io::Result<R> {
        loop {
            self.reap_queued(slots, reap)?;
            if let Some(pos) = slots.ready.iter().position(&wanted)
                && let Some(entry) = slots.ready.remove(pos)
            {
                return Ok(entry);
            }
            self.check_open(link, true)?;
            self.reap_next(slots, link, reap).await?;
        }
    }

    /// Whether something is ready to take, reaping what completed, without waiting.
    ///
    /// # Errors
    ///
    /// The queue's recorded failure, once everything that arrived before it was taken.
    pub(crate) fn try_fill(
        &self,
        slots: &mut Slots<R, H>,
        reap: &mut impl Reap<R, H>,
    ) -> io::Result<bool> {
        loop {
            if !slots.ready.is_empty() {
                return Ok(true);
            }
            if let Some(e) = self.error.report() {
                return Err(e);
            }
            if self.reap_queued(slots, reap)? == 0 {
                return Ok(false);
            }
        }
    }

    /// Waits until something is ready to take.
    ///
    /// # Errors
    ///
    /// As [`Self::try_fill`]; with `link`, its closed error once it closes and everything that
    /// completed before was taken.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: what arrives while waiting stays ready for the next call.
    pub(crate) async fn fill(
        &self,
        slots: &mut Slots<R, H>,
        link: Option<&CmLink>,
        reap: &mut impl Reap<R, H>,
    ) -> io::Result<()> {
        loop {
            if self.try_fill(slots, reap)? {
                return Ok(());
            }
            self.check_open(link, false)?;
            self.reap_next(slots, link, reap).await?;
        }
    }
}
