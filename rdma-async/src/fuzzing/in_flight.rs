//! Target `in_flight`: the table of outstanding work requests on caller memory
//! (`InFlightTable`, its real code), under a random sequence of posts (some whose post fails),
//! completions with any status and in any order, including second completions, stale ids (of a
//! slot since reused) and made-up ids a buggy or hostile provider could return, waiters polling
//! and dropping their futures (abandon), and `flush_all`; and completions of batch members
//! (the unsignaled requests before a batch's last), which only record the first error.
//!
//! The buffers are [`Probe`]s, which record when they are dropped, and the harness keeps a model
//! of every slot, which makes the invariants checkable after every step:
//! - a buffer comes back only to its own waiter (a ready poll, an abandon of a completed
//!   request), to whoever polls the completion of an abandoned request, to `flush_all` for an
//!   abandoned one, or to the poster whose post failed; never for another slot's id, a stale id
//!   or a made-up one;
//! - the table never drops a buffer itself, and a completion names the request its id named,
//!   with the status it came with (or a flush), or the first error of a member of its batch;
//! - a member's completion never frees a slot;
//! - a waiter that polled `Pending` is woken by its completion or the flush;
//! - the count of outstanding requests is the model's; a post fails only when every slot is
//!   taken, and gives its buffer back;
//! - at the end (flush, every waiter polled) every buffer came back exactly once and the table
//!   is empty, so dropping it drops nothing.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

use crate::verbs::{
    Held, InFlightTable, Probe, Ticket, WcStatus, WorkCompletion, WorkQueue, batch_member_id,
};

/// At most this many steps of an input are run (a bigger input is the same run).
const MAX_STEPS: usize = 512;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Counts its wake-ups.
#[derive(Default)]
struct WakeCount(AtomicUsize);

impl Wake for WakeCount {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::SeqCst);
    }
}

/// What the model says a tracked request is in.
#[derive(Debug, Clone, Copy)]
enum State {
    Posted,
    Done(WorkCompletion),
    /// Its waiter went away before the completion.
    Abandoned,
}

/// A request the table still holds.
struct Entry {
    ticket: Ticket,
    wr_id: u64,
    id: u32,
    queue: WorkQueue,
    state: State,
    wakes: Arc<WakeCount>,
    /// The wake count when its waiter last polled `Pending` (it waits for a wake-up).
    waiting_since: Option<usize>,
    /// The first error a member of its batch completed with: the request completes with it.
    member_error: Option<WorkCompletion>,
}

impl Entry {
    fn wakes(&self) -> usize {
        self.wakes.0.load(Ordering::SeqCst)
    }
}

/// The input, a byte at a time (zeros once it runs out).
struct Input<'a>(std::slice::Iter<'a, u8>);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        self.0.next().copied().unwrap_or(0)
    }

    fn u64(&mut self) -> u64 {
        (0..8).fold(0, |acc, _| acc << 8 | u64::from(self.byte()))
    }
}

struct Run {
    table: InFlightTable,
    capacity: usize,
    dropped: Arc<Mutex<Vec<u32>>>,
    entries: Vec<Entry>,
    /// Ids of requests whose slot was freed: a completion with one of them is stale.
    stale: Vec<u64>,
    next_id: u32,
    /// Buffers the table gave back (and the harness dropped).
    returned: usize,
}

/// Runs the ops `bytes` encodes against a fresh table (its size and kind from the first two
/// bytes) and checks the model after every step.
pub fn in_flight(bytes: &[u8]) {
    let mut input = Input(bytes.iter());
    let capacity = 1 + usize::from(input.byte() % 8);
    let shared = input.byte() & 1 == 1;
    let mut run = Run {
        table: InFlightTable::new(capacity, shared),
        capacity,
        dropped: Arc::new(Mutex::new(Vec::new())),
        entries: Vec::new(),
        stale: Vec::new(),
        next_id: 0,
        returned: 0,
    };
    for _ in 0..MAX_STEPS {
        if input.0.len() == 0 {
            break;
        }
        let op = input.byte();
        let arg = input.byte();
        run.step(op, arg, &mut input);
        run.check();
    }
    run.finish();
}

impl Run {
    fn step(&mut self, op: u8, arg: u8, input: &mut Input<'_>) {
        match op % 10 {
            0 => self.post(arg, false),
            1 => self.post(arg, true),
            2 => {
                if let Some(i) = self.pick(arg, |_| true) {
                    let wr_id = self.entries[i].wr_id;
                    self.complete(wr_id, input.byte());
                }
            }
            3 => {
                if !self.stale.is_empty() {
                    let wr_id = self.stale[usize::from(arg) % self.stale.len()];
                    self.complete(wr_id, input.byte());
                }
            }
            4 => {
                let wr_id = input.u64();
                // The completion task hands a table only the ids it owns.
                if self.table.owns(wr_id) {
                    self.complete(wr_id, arg);
                }
            }
            5 => self.poll(arg),
            6 => self.abandon(arg),
            7 => self.flush(),
            8 => {
                if let Some(i) = self.pick(arg, |_| true) {
                    let wr_id = batch_member_id(self.entries[i].wr_id);
                    self.complete(wr_id, input.byte());
                }
            }
            _ => {
                if let Some(i) = self.pick(arg, |e| !matches!(e.state, State::Abandoned)) {
                    let e = &self.entries[i];
                    assert_eq!(
                        self.table.is_done(&e.ticket),
                        matches!(e.state, State::Done(_)),
                        "is_done disagrees with the model for {}",
                        e.id
                    );
                }
            }
        }
    }

    /// The entry `arg` chooses among those `filter` accepts.
    fn pick(&self, arg: u8, filter: impl Fn(&Entry) -> bool) -> Option<usize> {
        let candidates: Vec<usize> = (0..self.entries.len())
            .filter(|&i| filter(&self.entries[i]))
            .collect();
        (!candidates.is_empty()).then(|| candidates[usize::from(arg) % candidates.len()])
    }

    fn probe(&mut self) -> (u32, Held) {
        let id = self.next_id;
        self.next_id += 1;
        let dropped = self.dropped.clone();
        (id, Held::Probe(Probe { id, dropped }))
    }

    /// Takes back `held`, which must be buffer `id`, and drops it.
    fn back(&mut self, held: Held, id: u32) {
        match held {
            Held::Probe(p) => assert_eq!(p.id, id, "buffer {} came back for {id}", p.id),
            other => panic!("buffer {id} came back as {other:?}"),
        }
        self.returned += 1;
    }

    fn post(&mut self, arg: u8, fails: bool) {
        let queue = if arg & 1 == 0 {
            WorkQueue::Send
        } else {
            WorkQueue::Recv
        };
        let (id, held) = self.probe();
        match self.table.insert(held, queue) {
            Ok((ticket, wr_id)) => {
                assert!(self.entries.len() < self.capacity, "a slot beyond capacity");
                assert!(self.table.owns(wr_id), "an id the table does not own");
                assert!(
                    self.entries.iter().all(|e| e.wr_id != wr_id),
                    "two outstanding requests share id {wr_id:#x}"
                );
                if fails {
                    // The post failed: the poster takes its buffer back at once.
                    let held = self.table.take_back(ticket);
                    self.back(held, id);
                    self.stale.push(wr_id);
                } else {
                    self.entries.push(Entry {
                        ticket,
                        wr_id,
                        id,
                        queue,
                        state: State::Posted,
                        wakes: Arc::default(),
                        waiting_since: None,
                        member_error: None,
                    });
                }
            }
            Err((e, held)) => {
                assert_eq!(
                    self.entries.len(),
                    self.capacity,
                    "refused with a free slot"
                );
                assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
                self.back(held, id);
            }
        }
    }

    fn complete(&mut self, wr_id: u64, status: u8) {
        let status = match status % 3 {
            0 => WcStatus::SUCCESS,
            1 => WcStatus::FLUSH,
            _ => WcStatus::REMOTE_ACCESS,
        };
        let wc = WorkCompletion {
            wr_id,
            status,
            byte_len: status.0,
            ..WorkCompletion::EMPTY
        };
        let freed = self.table.complete(&wc);
        let member_bit = batch_member_id(0);
        if wr_id & member_bit != 0 {
            assert!(freed.is_none(), "a batch member's completion freed a slot");
            let request = wr_id & !member_bit;
            if let Some(e) = self.entries.iter_mut().find(|e| e.wr_id == request)
                && matches!(e.state, State::Posted | State::Abandoned)
                && e.member_error.is_none()
                && !status.is_success()
            {
                e.member_error = Some(WorkCompletion {
                    wr_id: request,
                    ..wc
                });
            }
            return;
        }
        let Some(i) = self.entries.iter().position(|e| e.wr_id == wr_id) else {
            assert!(
                freed.is_none(),
                "a completion with id {wr_id:#x}, which names no request, freed a slot"
            );
            return;
        };
        match self.entries[i].state {
            State::Posted => {
                assert!(freed.is_none(), "a waited-for request's slot was freed");
                let e = &mut self.entries[i];
                e.state = State::Done(e.member_error.unwrap_or(wc));
                if let Some(before) = e.waiting_since {
                    assert!(e.wakes() > before, "the waiter of {} was not woken", e.id);
                }
            }
            // A second completion for one request: ignored.
            State::Done(_) => assert!(freed.is_none(), "a second completion freed a slot"),
            State::Abandoned => {
                let e = self.entries.remove(i);
                let (queue, held) = freed.expect("an abandoned request's completion kept it");
                assert_eq!(queue, e.queue);
                self.back(held, e.id);
                self.stale.push(e.wr_id);
            }
        }
    }

    fn poll(&mut self, arg: u8) {
        let Some(i) = self.pick(arg, |e| !matches!(e.state, State::Abandoned)) else {
            return;
        };
        let e = &mut self.entries[i];
        let waker = Waker::from(e.wakes.clone());
        let polled = self.table.poll(&e.ticket, &mut Context::from_waker(&waker));
        match (e.state, polled) {
            (State::Posted, Poll::Pending) => e.waiting_since = Some(e.wakes()),
            (State::Done(expected), Poll::Ready((wc, held, queue))) => {
                assert_eq!((wc.wr_id, wc.status), (expected.wr_id, expected.status));
                assert_eq!(wc.byte_len, expected.byte_len);
                assert_eq!(queue, e.queue);
                let e = self.entries.remove(i);
                self.back(held, e.id);
                self.stale.push(e.wr_id);
            }
            (state, polled) => panic!("polling {} in {state:?} gave {polled:?}", e.id),
        }
    }

    fn abandon(&mut self, arg: u8) {
        let Some(i) = self.pick(arg, |e| !matches!(e.state, State::Abandoned)) else {
            return;
        };
        let freed = self.table.abandon(&self.entries[i].ticket);
        match self.entries[i].state {
            State::Posted => {
                assert!(
                    freed.is_none(),
                    "an outstanding request's buffers left early"
                );
                self.entries[i].state = State::Abandoned;
            }
            State::Done(_) => {
                let e = self.entries.remove(i);
                let (queue, held) = freed.expect("a completed, abandoned request kept its slot");
                assert_eq!(queue, e.queue);
                self.back(held, e.id);
                self.stale.push(e.wr_id);
            }
            State::Abandoned => unreachable!("picked only waiters"),
        }
    }

    fn flush(&mut self) {
        let freed = self.table.flush_all();
        let abandoned = self
            .entries
            .iter()
            .filter(|e| matches!(e.state, State::Abandoned))
            .count();
        assert_eq!(
            freed.len(),
            abandoned,
            "flush_all freed other than the abandoned"
        );
        for (queue, held) in freed {
            let Held::Probe(p) = &held else {
                panic!("flush_all gave back {held:?}");
            };
            let i = self
                .entries
                .iter()
                .position(|e| e.id == p.id && matches!(e.state, State::Abandoned))
                .unwrap_or_else(|| panic!("flush_all freed {}, not abandoned", p.id));
            let e = self.entries.remove(i);
            assert_eq!(queue, e.queue);
            self.back(held, e.id);
            self.stale.push(e.wr_id);
        }
        for e in &mut self.entries {
            if let State::Posted = e.state {
                e.state = State::Done(e.member_error.unwrap_or(WorkCompletion {
                    wr_id: e.wr_id,
                    status: WcStatus::FLUSH,
                    ..WorkCompletion::EMPTY
                }));
                if let Some(before) = e.waiting_since {
                    assert!(e.wakes() > before, "the flush did not wake {}", e.id);
                }
            }
        }
    }

    /// The table agrees with the model, and dropped only what it gave back.
    fn check(&self) {
        assert_eq!(self.table.outstanding(), self.entries.len());
        assert_eq!(
            lock(&self.dropped).len(),
            self.returned,
            "a buffer was dropped without coming back"
        );
    }

    /// Ends every request (flush, then every waiter polls) and checks that every buffer came
    /// back exactly once.
    fn finish(mut self) {
        self.flush();
        while !self.entries.is_empty() {
            self.poll(0);
        }
        self.check();
        let Run {
            table,
            dropped,
            next_id,
            ..
        } = self;
        drop(table);
        let mut log = lock(&dropped).clone();
        log.sort_unstable();
        assert!(
            log.iter().copied().eq(0..next_id),
            "buffers not dropped exactly once: {log:?} of {next_id}"
        );
    }
}
