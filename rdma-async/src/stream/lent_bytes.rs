//! [`LentBytes`]: received bytes handed to a reader by
//! [`RStream::read_lent`](super::RStream::read_lent), in the receive ring itself when they can
//! be lent, copied out otherwise.

use std::fmt;
use std::ops::Deref;

use super::driver::StreamCore;
use crate::verbs::BufferView;

/// Bytes read from an [`RStream`](super::RStream) by [`read_lent`](super::RStream::read_lent):
/// derefs to `[u8]`. Empty at end of stream.
///
/// When [`Self::is_lent`], the bytes are still in the stream's receive ring, which no peer can
/// write while they are lent; dropping this gives the ring space back, and with it the peer's
/// credits. Until then the stream reads nothing more (it is borrowed).
pub struct LentBytes<'a> {
    bytes: Bytes<'a>,
}

enum Bytes<'a> {
    /// In the ring; consumed on drop.
    Lent {
        view: Option<BufferView<'a>>,
        core: &'a StreamCore,
    },
    Copied(Vec<u8>),
}

impl<'a> LentBytes<'a> {
    pub(super) fn lent(view: BufferView<'a>, core: &'a StreamCore) -> Self {
        LentBytes {
            bytes: Bytes::Lent {
                view: Some(view),
                core,
            },
        }
    }

    pub(super) fn copied(bytes: Vec<u8>) -> Self {
        LentBytes {
            bytes: Bytes::Copied(bytes),
        }
    }

    /// Whether the bytes are lent from the receive ring (no copy was made).
    pub fn is_lent(&self) -> bool {
        matches!(self.bytes, Bytes::Lent { .. })
    }
}

impl Deref for LentBytes<'_> {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.bytes {
            Bytes::Lent { view: Some(v), .. } => v,
            Bytes::Lent { view: None, .. } => &[],
            Bytes::Copied(v) => v,
        }
    }
}

impl fmt::Debug for LentBytes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LentBytes")
            .field("len", &self.len())
            .field("lent", &self.is_lent())
            .finish()
    }
}

impl Drop for LentBytes<'_> {
    fn drop(&mut self) {
        if let Bytes::Lent { view, core } = &mut self.bytes
            && let Some(view) = view.take()
        {
            let len = view.len();
            // The view goes first: giving the bytes back may grant their half to the peer
            // again, which binds a window over them.
            drop(view);
            core.consume_lent(len);
        }
    }
}
