//! [`Gather`]: the bytes of one write call, taken front to back across its buffers.
//!
//! A vectored write (hyper's response headers and body, a `Buf` chain) is one stream of bytes,
//! cut into chunks without regard to where one buffer ends and the next begins. So two small
//! buffers go out as one message, as a `writev` on a TCP socket goes out as one segment: on
//! Soft-RoCE a message per buffer cost a packet and an ACK each way, and on any device a work
//! request, a peer's receive and one of its credits.

use std::io::IoSlice;

/// What is left of a write call's buffers.
#[derive(Debug)]
pub(super) struct Gather<'a> {
    /// The buffers not yet used up; `bufs[0]` is partly taken when `taken > 0`.
    bufs: &'a [IoSlice<'a>],
    /// Bytes of `bufs[0]` already taken.
    taken: usize,
    /// Bytes left in all of `bufs`.
    remaining: usize,
}

impl<'a> Gather<'a> {
    /// All the bytes of `bufs`, in order.
    pub(super) fn new(bufs: &'a [IoSlice<'a>]) -> Self {
        Gather {
            bufs,
            taken: 0,
            remaining: bufs.iter().map(|b| b.len()).sum(),
        }
    }

    /// Bytes not taken yet.
    pub(super) fn remaining(&self) -> usize {
        self.remaining
    }

    /// Takes the next bytes of one buffer: at most `max`, and empty only when nothing is left
    /// or `max` is 0.
    pub(super) fn next_piece(&mut self, max: usize) -> &'a [u8] {
        while let Some((first, rest)) = self.bufs.split_first() {
            let first: &'a [u8] = first;
            let left = &first[self.taken..];
            if !left.is_empty() {
                let piece = &left[..left.len().min(max)];
                self.taken += piece.len();
                self.remaining -= piece.len();
                return piece;
            }
            self.bufs = rest;
            self.taken = 0;
        }
        &[]
    }

    /// Takes the next `len` bytes as one slice if they lie in one buffer; otherwise takes
    /// nothing and returns `None`.
    pub(super) fn take_contiguous(&mut self, len: usize) -> Option<&'a [u8]> {
        let mut probe = Gather {
            bufs: self.bufs,
            taken: self.taken,
            remaining: self.remaining,
        };
        let piece = probe.next_piece(len);
        (piece.len() == len).then(|| {
            *self = probe;
            piece
        })
    }

    /// Takes the next `len` bytes (fewer when the buffers run out) into a new vector.
    pub(super) fn take_vec(&mut self, len: usize) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(len);
        while bytes.len() < len {
            let piece = self.next_piece(len - bytes.len());
            if piece.is_empty() {
                break;
            }
            bytes.extend_from_slice(piece);
        }
        bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slices<'a>(bufs: &[&'a [u8]]) -> Vec<IoSlice<'a>> {
        bufs.iter().map(|b| IoSlice::new(b)).collect()
    }

    #[test]
    fn pieces_follow_the_buffers_and_skip_empty_ones() {
        let bufs = slices(&[b"abc", b"", b"defg", b"h"]);
        let mut g = Gather::new(&bufs);
        assert_eq!(g.remaining(), 8);
        assert_eq!(g.next_piece(2), b"ab");
        assert_eq!(g.next_piece(10), b"c");
        assert_eq!(g.next_piece(10), b"defg");
        assert_eq!(g.remaining(), 1);
        assert_eq!(g.next_piece(10), b"h");
        assert_eq!(g.next_piece(10), b"");
        assert_eq!(g.remaining(), 0);
    }

    #[test]
    fn contiguous_takes_only_within_one_buffer() {
        let bufs = slices(&[b"abc", b"def"]);
        let mut g = Gather::new(&bufs);
        assert_eq!(g.take_contiguous(4), None, "spans two buffers");
        assert_eq!(g.remaining(), 6, "a refused take takes nothing");
        assert_eq!(g.take_contiguous(2), Some(&b"ab"[..]));
        assert_eq!(g.take_contiguous(2), None);
        assert_eq!(g.take_contiguous(1), Some(&b"c"[..]));
        assert_eq!(g.take_contiguous(3), Some(&b"def"[..]));
        assert_eq!(g.take_contiguous(0), Some(&b""[..]));
    }

    #[test]
    fn copies_across_buffers_and_stops_at_the_end() {
        let bufs = slices(&[b"ab", b"cde", b"f"]);
        let mut g = Gather::new(&bufs);
        assert_eq!(g.take_vec(4), b"abcd");
        assert_eq!(g.take_vec(5), b"ef", "only two bytes were left");
        assert_eq!(g.remaining(), 0);
    }
}
