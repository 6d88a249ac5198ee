//! [`Input`]: a fuzz input read a byte at a time, as the harnesses that decode a run of steps
//! from it do.

/// The input, a byte at a time (zeros once it is used up).
pub(super) struct Input<'a>(pub(super) &'a [u8]);

impl Input<'_> {
    pub(super) fn byte(&mut self) -> u8 {
        match self.0.split_first() {
            Some((&b, rest)) => {
                self.0 = rest;
                b
            }
            None => 0,
        }
    }

    /// Up to `n` bytes (fewer where the input ends).
    pub(super) fn take(&mut self, n: usize) -> &[u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}
