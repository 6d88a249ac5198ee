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
    /// Built without indexing by the count, as is [`Self::parts`], so that a `Segments` passed
    /// by value along a data write can stay in registers.
    pub(crate) fn in_ring(start: u32, len: u32, size: u32) -> Segments {
        if len == 0 || size == 0 {
            return Segments::EMPTY;
        }
        let start = start % size;
        let len = len.min(size);
        let first = len.min(size - start);
        let rest = len - first;
        Segments {
            segs: [
                RingSegment {
                    offset: start as usize,
                    len: first as usize,
                },
                RingSegment {
                    offset: 0,
                    len: rest as usize,
                },
            ],
            count: 1 + u8::from(rest > 0),
        }
    }

    /// The first and the second segment, each if there is one.
    #[inline]
    pub(crate) fn parts(&self) -> [Option<RingSegment>; 2] {
        [
            (self.count > 0).then_some(self.segs[0]),
            (self.count > 1).then_some(self.segs[1]),
        ]
    }

    /// The segments, in order.
    #[cfg(any(test, rdma_async_fuzzing))]
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

    #[test]
    fn parts_are_the_segments_in_order() {
        for s in [
            Segments::in_ring(0, 10, 100),
            Segments::in_ring(95, 10, 100),
            Segments::in_ring(50, 100, 100),
            Segments::in_ring(5, 0, 100),
        ] {
            let parts: Vec<RingSegment> = s.parts().into_iter().flatten().collect();
            assert_eq!(parts, s.as_slice(), "{s:?}");
        }
        assert_eq!(Segments::in_ring(90, 10, 100).parts()[1], None);
    }
}
