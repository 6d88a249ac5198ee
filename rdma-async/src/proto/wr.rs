//! Work-request ids for the sends the core plans, and the books that match completions.
//!
//! C encodes the message word in the wr_id. We keep what each outstanding send was instead and
//! put a tag and a serial number in the wr_id. Not every send is signaled (see
//! `Sender::take_signal`): an RC send queue completes in post order, so a completion means
//! every send posted before it is done too, and it releases the sends up to and including it. A
//! completion for a send that is not outstanding (a driver bug) is caught instead of silently
//! corrupting the ring accounting.
//!
//! Most sends are unsignaled data writes, and all their completion gives back is a send-queue
//! entry and their bytes: they are only counted, in the run of data writes before the next send
//! kept one by one (a signaled data write, or any other kind of send), so a streamed message
//! costs no entry of its own.

use std::collections::VecDeque;
use std::collections::vec_deque::Drain;

use super::error::ProtoError;
use super::plan::ControlKind;

/// Bit 63 marks receive work requests (as in C); the core never produces it for sends, so a
/// driver can post its receives with any id that has this bit set.
pub(crate) const WR_ID_RECV_FLAG: u64 = 1 << 63;

const TAG_SHIFT: u32 = 56;
const TAG_DATA: u64 = 0x01 << TAG_SHIFT;
const TAG_CONTROL: u64 = 0x02 << TAG_SHIFT;
const TAG_WINDOW: u64 = 0x03 << TAG_SHIFT;
/// The serial's bits of a send's wr_id.
const SERIAL_MASK: u64 = 0xffff_ffff;

/// What an outstanding send was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SendKind {
    /// A data chunk of `len` bytes (charged to the send ring and one data SQ entry).
    Data { len: u32 },
    /// A control message (charged to one control slot).
    Control(ControlKind),
    /// A bind of the window over receive-ring half `half` (zero-copy reads).
    Bind { half: usize },
    /// A local invalidation of the window key `key` over half `half` (zero-copy reads).
    Invalidate { half: usize, key: u32 },
}

impl SendKind {
    fn tag(self) -> u64 {
        match self {
            SendKind::Data { .. } => TAG_DATA,
            SendKind::Control(_) => TAG_CONTROL,
            SendKind::Bind { .. } | SendKind::Invalidate { .. } => TAG_WINDOW,
        }
    }
}

/// Data writes released together: their send-queue entries and send-ring bytes come back.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct DataRun {
    /// Data writes.
    pub(crate) writes: u32,
    /// Their bytes.
    pub(crate) bytes: u32,
}

impl DataRun {
    fn add(&mut self, len: u32) {
        self.writes += 1;
        self.bytes = self.bytes.saturating_add(len);
    }

    /// Takes `other`'s writes and bytes in with these.
    pub(crate) fn merge(&mut self, other: DataRun) {
        self.writes += other.writes;
        self.bytes = self.bytes.saturating_add(other.bytes);
    }
}

/// A send kept one by one: a signaled data write, or any send that is not a data write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Marked {
    pub(crate) wr_id: u64,
    pub(crate) kind: SendKind,
    /// The data writes its completion releases besides anything before it: the unsignaled
    /// ones posted since the previous marked send, and itself if it is one.
    pub(crate) data: DataRun,
}

/// What a send completion released: `marked`, the oldest marked sends (to take with
/// [`SendQueue::take_marked`]), each with its data writes, and after them `data`, data writes
/// that no marked send covers (unsignaled ones, flushed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) marked: usize,
    pub(crate) data: DataRun,
}

/// Outstanding sends in post order: sends `oldest .. next_serial` by serial.
#[derive(Debug, Clone, Default)]
pub(crate) struct SendQueue {
    next_serial: u32,
    /// The serial of the oldest outstanding send (`next_serial` when none is).
    oldest: u32,
    /// The marked sends outstanding, in post order.
    marked: VecDeque<Marked>,
    /// Unsignaled data writes posted after the last marked send.
    tail: DataRun,
}

impl SendQueue {
    /// Records a new send, kept one by one, and returns its wr_id.
    pub(crate) fn push(&mut self, kind: SendKind) -> u64 {
        let wr_id = self.next_id(kind);
        let mut data = std::mem::take(&mut self.tail);
        if let SendKind::Data { len } = kind {
            data.add(len);
        }
        self.marked.push_back(Marked { wr_id, kind, data });
        wr_id
    }

    /// Records a new data write of `len` bytes, posted `signaled` or not, and returns its wr_id.
    /// An unsignaled one is only counted: it completes with the next signaled send.
    #[inline]
    pub(crate) fn push_data(&mut self, len: u32, signaled: bool) -> u64 {
        if signaled {
            return self.push(SendKind::Data { len });
        }
        self.tail.add(len);
        self.next_id(SendKind::Data { len })
    }

    fn next_id(&mut self, kind: SendKind) -> u64 {
        let wr_id = kind.tag() | u64::from(self.next_serial);
        self.next_serial = self.next_serial.wrapping_add(1);
        wr_id
    }

    /// How far `wr_id` is from the oldest outstanding send, if it is outstanding, and how many
    /// marked sends a completion for it releases.
    fn locate(&self, wr_id: u64) -> Option<(u32, usize)> {
        // Serials are consecutive, so the send's place follows from its serial.
        let pos = (wr_id as u32).wrapping_sub(self.oldest);
        if pos >= self.next_serial.wrapping_sub(self.oldest) {
            return None;
        }
        let mut marked = 0;
        let mut last_at = None;
        for m in &self.marked {
            let at = (m.wr_id as u32).wrapping_sub(self.oldest);
            if at > pos {
                break;
            }
            marked += 1;
            last_at = Some((at, m.wr_id));
        }
        let found = match last_at {
            Some((at, id)) if at == pos => id == wr_id,
            // Not a marked send: then an unsignaled data write.
            _ => wr_id & !SERIAL_MASK == TAG_DATA,
        };
        found.then_some((pos, marked))
    }

    /// Matches a completion with an outstanding send and releases it and every send posted
    /// before it (completed in order, unsignaled); the marked ones among them stay to be taken
    /// with [`Self::take_marked`].
    pub(crate) fn complete_through(&mut self, wr_id: u64) -> Result<Released, ProtoError> {
        let Some((pos, marked)) = self.locate(wr_id) else {
            return Err(self.not_outstanding(wr_id));
        };
        // Unsignaled data writes completed past the last marked send released (only a flush
        // completes one alone): they come back from the run they were counted in, their count
        // now and their bytes with the run's last write (which write had how many is not
        // kept), so ring space is never given back early.
        let first_unmarked = match marked.checked_sub(1) {
            Some(i) => (self.marked[i].wr_id as u32).wrapping_add(1),
            None => self.oldest,
        };
        self.oldest = self.oldest.wrapping_add(pos).wrapping_add(1);
        let unmarked = self.oldest.wrapping_sub(first_unmarked);
        let mut data = DataRun::default();
        if unmarked > 0 {
            let run = match self.marked.get_mut(marked) {
                Some(next) => &mut next.data,
                None => &mut self.tail,
            };
            run.writes -= unmarked;
            data.writes = unmarked;
            if run.writes == 0 {
                data.bytes = std::mem::take(&mut run.bytes);
            }
        }
        Ok(Released { marked, data })
    }

    /// The error of a completion for `wr_id`, which matches no outstanding send.
    #[cold]
    fn not_outstanding(&self, wr_id: u64) -> ProtoError {
        if self.is_empty() {
            return ProtoError::usage(format!(
                "send completion for wr_id {wr_id:#x}, but no send is outstanding"
            ));
        }
        ProtoError::usage(format!(
            "send completion for wr_id {wr_id:#x}, which is not outstanding (the oldest \
             outstanding send has serial {:#x}; sends must be posted in the order planned)",
            self.oldest
        ))
    }

    /// Takes the `n` oldest marked sends, released by a completion ([`Released::marked`]).
    pub(crate) fn take_marked(&mut self, n: usize) -> Drain<'_, Marked> {
        self.marked.drain(..n)
    }

    /// Whether `wr_id` is still outstanding.
    pub(crate) fn is_outstanding(&self, wr_id: u64) -> bool {
        self.locate(wr_id).is_some()
    }

    /// Sends posted and not yet completed.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.next_serial.wrapping_sub(self.oldest) as usize
    }

    /// Whether every send has completed.
    pub(crate) fn is_empty(&self) -> bool {
        self.next_serial == self.oldest
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds of the marked sends a completion for `id` releases, and the data writes and
    /// bytes it releases in all.
    fn complete(q: &mut SendQueue, id: u64) -> Result<(Vec<SendKind>, DataRun), ProtoError> {
        let released = q.complete_through(id)?;
        let mut data = released.data;
        let kinds = q
            .take_marked(released.marked)
            .map(|m| {
                data.merge(m.data);
                m.kind
            })
            .collect();
        Ok((kinds, data))
    }

    #[test]
    fn completions_match_in_order() {
        let mut q = SendQueue::default();
        let a = q.push(SendKind::Data { len: 5 });
        let b = q.push(SendKind::Control(ControlKind::Credits { limit: 3 }));
        assert_eq!(a & WR_ID_RECV_FLAG, 0);
        assert_ne!(a, b);
        assert_eq!(q.len(), 2);
        assert_eq!(complete(&mut q, a).unwrap().0, [SendKind::Data { len: 5 }]);
        assert_eq!(
            complete(&mut q, b).unwrap().0,
            [SendKind::Control(ControlKind::Credits { limit: 3 })]
        );
        assert!(q.is_empty());
        assert!(complete(&mut q, b).is_err());
    }

    #[test]
    fn a_completion_releases_every_earlier_send() {
        let mut q = SendQueue::default();
        let a = q.push(SendKind::Data { len: 1 });
        let b = q.push(SendKind::Data { len: 2 });
        let c = q.push(SendKind::Data { len: 3 });
        let (kinds, data) = complete(&mut q, b).unwrap();
        assert_eq!(
            kinds,
            [SendKind::Data { len: 1 }, SendKind::Data { len: 2 }]
        );
        assert_eq!(
            data,
            DataRun {
                writes: 2,
                bytes: 3
            }
        );
        // Already released, or never posted: a driver bug, reported.
        assert!(complete(&mut q, a).is_err());
        assert!(complete(&mut q, c + 1).is_err());
        assert_eq!(q.len(), 1);
        assert_eq!(complete(&mut q, c).unwrap().0.len(), 1);
    }

    /// Unsignaled data writes are counted, not kept: the signaled send after them releases
    /// their entries and bytes with its own.
    #[test]
    fn a_signaled_send_releases_the_unsignaled_data_writes_before_it() {
        let mut q = SendQueue::default();
        let a = q.push_data(10, false);
        let b = q.push_data(20, false);
        let c = q.push(SendKind::Control(ControlKind::Credits { limit: 1 }));
        let d = q.push_data(30, false);
        let e = q.push_data(40, true);
        assert_eq!(q.len(), 5);
        assert!(q.is_outstanding(a) && q.is_outstanding(d) && q.is_outstanding(e));
        let (kinds, data) = complete(&mut q, c).unwrap();
        assert_eq!(
            kinds,
            [SendKind::Control(ControlKind::Credits { limit: 1 })]
        );
        assert_eq!(
            data,
            DataRun {
                writes: 2,
                bytes: 30
            }
        );
        assert!(!q.is_outstanding(b));
        assert!(q.is_outstanding(d));
        let (kinds, data) = complete(&mut q, e).unwrap();
        assert_eq!(kinds, [SendKind::Data { len: 40 }]);
        assert_eq!(
            data,
            DataRun {
                writes: 2,
                bytes: 70
            }
        );
        assert!(q.is_empty());
        assert!(!q.is_outstanding(e));
    }

    /// A flush completes unsignaled writes one by one: each gives its send-queue entry back at
    /// once, and the bytes of its run come back with the run's last write, never earlier.
    #[test]
    fn flushed_unsignaled_data_writes_complete_one_by_one() {
        let mut q = SendQueue::default();
        let a = q.push_data(10, false);
        let b = q.push_data(20, false);
        let c = q.push_data(30, true);
        let d = q.push_data(40, false);
        let e = q.push_data(50, false);
        assert_eq!(
            complete(&mut q, a).unwrap(),
            (
                vec![],
                DataRun {
                    writes: 1,
                    bytes: 0
                }
            )
        );
        assert_eq!(
            complete(&mut q, b).unwrap(),
            (
                vec![],
                DataRun {
                    writes: 1,
                    bytes: 0
                }
            )
        );
        assert_eq!(
            complete(&mut q, c).unwrap(),
            (
                vec![SendKind::Data { len: 30 }],
                DataRun {
                    writes: 1,
                    bytes: 60
                }
            )
        );
        assert_eq!(
            complete(&mut q, d).unwrap(),
            (
                vec![],
                DataRun {
                    writes: 1,
                    bytes: 0
                }
            )
        );
        assert_eq!(
            complete(&mut q, e).unwrap(),
            (
                vec![],
                DataRun {
                    writes: 1,
                    bytes: 90
                }
            )
        );
        assert!(q.is_empty());
    }

    /// A completion whose id names a send that is outstanding but with another tag (a marked
    /// send's serial under the data tag, or an unsignaled write's under another) is a driver
    /// bug, reported, and releases nothing.
    #[test]
    fn a_completion_with_the_wrong_tag_is_reported() {
        let mut q = SendQueue::default();
        let a = q.push_data(10, false);
        let b = q.push(SendKind::Control(ControlKind::Credits { limit: 1 }));
        let serial = |id: u64| id & SERIAL_MASK;
        assert!(complete(&mut q, TAG_CONTROL | serial(a)).is_err());
        assert!(complete(&mut q, TAG_DATA | serial(b)).is_err());
        assert!(complete(&mut q, a | (1 << 40)).is_err());
        assert_eq!(q.len(), 2);
        assert_eq!(
            complete(&mut q, b).unwrap().1,
            DataRun {
                writes: 1,
                bytes: 10
            }
        );
    }

    /// Serials wrap at 2^32 without losing track of what is outstanding.
    #[test]
    fn serials_wrap() {
        let mut q = SendQueue {
            next_serial: u32::MAX - 1,
            oldest: u32::MAX - 1,
            ..SendQueue::default()
        };
        let a = q.push_data(1, false);
        let b = q.push_data(2, false);
        let c = q.push_data(3, true);
        assert_eq!(c & SERIAL_MASK, 0);
        assert!(q.is_outstanding(a) && q.is_outstanding(b));
        assert_eq!(
            complete(&mut q, c).unwrap().1,
            DataRun {
                writes: 3,
                bytes: 6
            }
        );
        assert!(q.is_empty());
    }
}
