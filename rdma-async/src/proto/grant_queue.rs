//! The buffers a receiver granted its peer, oldest first, as the simulator and the hostile-peer
//! model both track them: the peer fills them strictly in order, each from its first byte to
//! its last, and a target SGL slot holds one unfilled grant at a time. Test and fuzzing code:
//! every broken rule is a panic that names it.

use std::collections::VecDeque;

/// One granted buffer: `len` bytes of the receive ring from `start`, `filled` of them written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Grant {
    /// The peer's target SGL slot the grant was written to.
    pub(crate) slot: usize,
    pub(crate) start: usize,
    pub(crate) len: usize,
    pub(crate) filled: usize,
}

/// The granted and not yet filled buffers, oldest first.
#[derive(Debug, Default)]
pub(crate) struct GrantQueue {
    grants: VecDeque<Grant>,
}

impl GrantQueue {
    /// The grants not yet filled, oldest first.
    pub(crate) fn iter(&self) -> impl Iterator<Item = &Grant> {
        self.grants.iter()
    }

    /// The oldest grant not yet filled: where the next data must land.
    pub(crate) fn front(&self) -> Option<&Grant> {
        self.grants.front()
    }

    /// `[start, start + len)` was granted into the peer's `slot`, which must hold no unfilled
    /// grant (an SGL update must not overwrite a buffer the peer still fills).
    pub(crate) fn push(&mut self, slot: usize, start: usize, len: usize) {
        if let Some(g) = self.grants.iter().find(|g| g.slot == slot) {
            panic!(
                "SGL update overwrote the peer's slot {slot} while the buffer granted there \
                 (offset {}, {} of {} bytes filled) was not completely filled",
                g.start, g.filled, g.len
            );
        }
        self.grants.push_back(Grant {
            slot,
            start,
            len,
            filled: 0,
        });
    }

    /// `len` (> 0) bytes of data landed at ring offset `offset`: they must be the next unfilled
    /// bytes of the oldest grant and fit in it. A grant filled to its end is done.
    pub(crate) fn fill(&mut self, offset: usize, len: usize) {
        let Some(g) = self.grants.front_mut() else {
            panic!("{len} bytes of data at ring offset {offset} but nothing is granted");
        };
        assert_eq!(
            offset,
            g.start + g.filled,
            "data at ring offset {offset}, not at the next unfilled byte of the oldest grant"
        );
        assert!(
            g.filled + len <= g.len,
            "{len} bytes of data past their grant (offset {}, {} of {} filled)",
            g.start,
            g.filled,
            g.len
        );
        g.filled += len;
        if g.filled == g.len {
            self.grants.pop_front();
        }
    }
}
