//! Property test: random application writes and reads on both sides, with random interleaving
//! of fabric delivery and completion polling, against a `VecDeque` oracle per direction.
//!
//! Checked: bytes in = bytes out, in order; no remote write outside a grant and no send-ring
//! reuse before completion (the simulator panics); no lost wake-up (whenever a write is blocked
//! some pending event exists that can unblock it); no deadlock (with everything delivered and
//! the applications reading, every write completes); a clean close afterwards.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::{Pair, ReadOutcome};
use crate::proto::{Config, WriteError};

#[derive(Debug, Clone)]
enum Action {
    /// The application of `side` writes: a new buffer of `len` bytes if it has none pending,
    /// else the rest of the pending one (a new `poll_write` call).
    Write { side: usize, len: usize },
    /// `count` small write calls of `len` bytes each in a row: many messages, few bytes, to
    /// run out of message credits rather than ring space.
    Burst {
        side: usize,
        count: usize,
        len: usize,
    },
    /// The application of `side` reads at most `max` bytes.
    Read { side: usize, max: usize },
    /// The fabric delivers up to `n` writes posted by `from`.
    Deliver { from: usize, n: usize },
    /// The driver of `side` polls up to `n` completions.
    Poll { side: usize, n: usize },
}

fn action() -> impl Strategy<Value = Action> {
    let side = 0..2usize;
    prop_oneof![
        2 => (side.clone(), 0..200_000usize).prop_map(|(side, len)| Action::Write { side, len }),
        2 => (side.clone(), 0..3000usize).prop_map(|(side, len)| Action::Write { side, len }),
        2 => (side.clone(), 1..40usize, 1..200usize)
            .prop_map(|(side, count, len)| Action::Burst { side, count, len }),
        3 => (side.clone(), 1..100_000usize).prop_map(|(side, max)| Action::Read { side, max }),
        4 => (side.clone(), 1..8usize).prop_map(|(from, n)| Action::Deliver { from, n }),
        4 => (side, 1..8usize).prop_map(|(side, n)| Action::Poll { side, n }),
    ]
}

fn config() -> impl Strategy<Value = Config> {
    prop_oneof![
        // C's defaults.
        Just(Config::new()),
        // rstream -B 4096.
        Just(
            Config::new()
                .with_sbuf_size(8192)
                .with_rbuf_size(8192)
                .with_sq_size(16)
                .with_rq_size(16)
        ),
        // Big rings, few credits: message credits run out first.
        Just(
            Config::new()
                .with_rq_size(16)
                .with_sq_size(24)
                .with_inline_size(16)
        ),
        // Anything in between, including tiny receive rings and no inline data.
        (
            4096..70_000u32,
            64..70_000u32,
            16..64u32,
            16..64u32,
            0..128u32
        )
            .prop_map(|(sbuf, rbuf, sq, rq, inline)| Config::new()
                .with_sbuf_size(sbuf)
                .with_rbuf_size(rbuf)
                .with_sq_size(sq)
                .with_rq_size(rq)
                .with_inline_size(inline)),
    ]
}

/// The applications and the oracle.
struct Model {
    pair: Pair,
    /// What each application still has to write from its current buffer.
    pending: [Vec<u8>; 2],
    /// Bytes generated so far per side (the next buffer continues the pattern).
    generated: [u64; 2],
    /// Per direction: bytes side `i` wrote that side `1 - i` has not read yet.
    oracle: [VecDeque<u8>; 2],
}

impl Model {
    fn new(a: Config, b: Config) -> Self {
        Self {
            pair: Pair::new(a, b),
            pending: [Vec::new(), Vec::new()],
            generated: [0, 0],
            oracle: [VecDeque::new(), VecDeque::new()],
        }
    }

    fn write(&mut self, side: usize, len: usize) {
        if self.pending[side].is_empty() {
            self.pending[side] = super::stream_bytes(side, self.generated[side], len);
            self.generated[side] += len as u64;
        }
        if self.pending[side].is_empty() {
            return;
        }
        let out = self.pair.app_write(side, &self.pending[side]);
        self.oracle[side].extend(self.pending[side].drain(..out.written));
        match out.stopped {
            None => assert!(self.pending[side].is_empty()),
            Some(WriteError::Blocked(reason)) => {
                if out.written == 0 {
                    assert!(
                        self.pair.write_wakeup_pending(side),
                        "lost wake-up: side {side} blocked on {reason:?} with nothing pending"
                    );
                }
            }
            Some(other) => panic!("write on an open connection stopped: {other:?}"),
        }
    }

    fn read(&mut self, side: usize, max: usize) -> usize {
        match self.pair.app_read(side, max) {
            ReadOutcome::Data(d) => {
                assert!(d.len() <= max && !d.is_empty());
                for (i, b) in d.iter().enumerate() {
                    assert_eq!(
                        Some(*b),
                        self.oracle[1 - side].pop_front(),
                        "side {side} read a wrong byte at {i} of {}",
                        d.len()
                    );
                }
                d.len()
            }
            ReadOutcome::Blocked => 0,
            other => panic!("read on an open connection: {other:?}"),
        }
    }

    fn apply(&mut self, action: &Action) {
        match *action {
            Action::Write { side, len } => self.write(side, len),
            Action::Burst { side, count, len } => {
                for _ in 0..count {
                    self.write(side, len);
                }
            }
            Action::Read { side, max } => {
                self.read(side, max);
            }
            Action::Deliver { from, n } => {
                for _ in 0..n {
                    self.pair.deliver(from);
                }
            }
            Action::Poll { side, n } => {
                self.pair.poll_cq(side, n).expect("no protocol error");
            }
        }
        // The reader is only ever told about bytes the simulator saw land (delivered data
        // whose completion is not handled yet is filled but not readable).
        for side in 0..2 {
            assert!(
                self.pair.filled_bytes(side)
                    >= self.pair.sides[side].conn.readable_segments().total()
            );
        }
    }

    /// Everything delivered, both applications reading and finishing their writes: all data
    /// must arrive (no deadlock).
    fn drain(&mut self) {
        for _ in 0..200_000 {
            for side in 0..2 {
                if !self.pending[side].is_empty() {
                    self.write(side, 0);
                }
                self.read(side, usize::MAX);
            }
            self.pair.settle().expect("no protocol error");
            let done = (0..2).all(|s| self.pending[s].is_empty() && self.oracle[s].is_empty());
            if done && !self.pair.busy() {
                return;
            }
        }
        panic!(
            "deadlock: pending {:?}, unread {:?}",
            [self.pending[0].len(), self.pending[1].len()],
            [self.oracle[0].len(), self.oracle[1].len()]
        );
    }

    /// Both sides shut down writing, then everything settles: both see EOF, both end
    /// disconnected with every send completed.
    fn close(&mut self) {
        self.pair.sides[0].conn.shutdown_write();
        self.pair.pump_control(0);
        self.pair.sides[1].conn.shutdown_write();
        self.pair.pump_control(1);
        self.pair.settle().expect("no protocol error");
        for side in 0..2 {
            assert_eq!(self.pair.app_read(side, 1), ReadOutcome::Eof);
            let conn = &self.pair.sides[side].conn;
            assert!(conn.is_disconnected(), "side {side} not disconnected");
            assert!(conn.all_sends_done() && conn.sends_in_flight() == 0);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 40, ..ProptestConfig::default() })]

    #[test]
    fn bytes_in_equal_bytes_out(
        a in config(),
        b in config(),
        actions in proptest::collection::vec(action(), 1..80),
    ) {
        let mut model = Model::new(a, b);
        for action in &actions {
            model.apply(action);
        }
        model.drain();
        model.close();
    }
}

/// A case proptest found: the writer's own data, still on the wire, is what will bring the
/// peer's next buffer grant (once the peer reads it), while none of its sends is signaled.
#[test]
fn a_writer_waiting_behind_its_own_data_on_the_wire_is_woken() {
    let tiny = Config::new()
        .with_sbuf_size(4096)
        .with_rbuf_size(64)
        .with_sq_size(16)
        .with_rq_size(16)
        .with_inline_size(0);
    let mut model = Model::new(Config::new(), tiny);
    for action in [
        Action::Write { side: 1, len: 1 },
        Action::Deliver { from: 1, n: 2 },
        Action::Poll { side: 0, n: 2 },
        Action::Write { side: 0, len: 289 },
        Action::Poll { side: 1, n: 7 },
    ] {
        model.apply(&action);
    }
    model.drain();
    model.close();
}
