//! Ring-buffer arithmetic: a byte range of a ring as at most two contiguous segments.

/// A contiguous byte range inside one of the driver's buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RingSegment {
    /// Offset from the start of the buffer.
    pub(crate) offset: usize,
    /// Length in bytes (never 0 inside a [`Segments`]).
    pub(crate) len: usize,
}

/// Up to two segments: a range that wraps the end of a ring is split in two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Segments {
    segs: [RingSegment; 2],
    count: u8,
}

impl Segments {
    /// No bytes.
    pub(crate) const EMPTY: Segments = Segments {
        segs: [RingSegment { offset: 0, len: 0 }; 2],
        count: 0,
    };

    /// `len` bytes from `start` in a ring of `size` bytes (`start < size`, `len <= size`).
    pub(crate) fn in_ring(start: u32, len: u32, size: u32) -> Segments {
        let mut out = Segments::EMPTY;
        if len == 0 || size == 0 {
            return out;
        }
        let start = start % size;
        let len = len.min(size);
        let first = len.min(size - start);
        out.push(start, first);
        out.push(0, len - first);
        out
    }

    fn push(&mut self, offset: u32, len: u32) {
        if len == 0 {
            return;
        }
        if let Some(slot) = self.segs.get_mut(usize::from(self.count)) {
            *slot = RingSegment {
                offset: offset as usize,
                len: len as usize,
            };
            self.count += 1;
        }
    }

    /// The segments, in order.
    pub(crate) fn as_slice(&self) -> &[RingSegment] {
        &self.segs[..usize::from(self.count)]
    }

    /// Total bytes.
    #[cfg(test)]
    pub(crate) fn total(&self) -> usize {
        self.as_slice().iter().map(|s| s.len).sum()
    }

    /// Whether there are no bytes.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.count == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(s: Segments) -> Vec<(usize, usize)> {
        s.as_slice().iter().map(|s| (s.offset, s.len)).collect()
    }

    #[test]
    fn split_at_the_end() {
        assert_eq!(pairs(Segments::in_ring(0, 10, 100)), [(0, 10)]);
        assert_eq!(pairs(Segments::in_ring(90, 10, 100)), [(90, 10)]);
        assert_eq!(pairs(Segments::in_ring(95, 10, 100)), [(95, 5), (0, 5)]);
        assert_eq!(pairs(Segments::in_ring(50, 100, 100)), [(50, 50), (0, 50)]);
        assert!(Segments::in_ring(5, 0, 100).is_empty());
        assert_eq!(Segments::in_ring(95, 10, 100).total(), 10);
        assert_eq!(Segments::EMPTY.total(), 0);
    }
}
