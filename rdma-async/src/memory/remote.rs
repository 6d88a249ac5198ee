//! Descriptors of a peer's registered memory: what an RDMA read, write or atomic targets.

use std::io;

use crate::error;

/// A peer's registered memory: its address, length and remote key, as the peer advertised it.
///
/// The peer creates it with [`super::SharedRegion::remote`] and sends it over (in a message, or in
/// the private data of the connection handshake) as the 16 bytes of [`Self::to_bytes`]. Offsets
/// and lengths are checked against it before anything is posted; the peer's device checks the key
/// and bounds again, so a forged or stale descriptor fails with `PermissionDenied` on the
/// operation that uses it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RemoteRegion {
    addr: u64,
    len: u32,
    rkey: u32,
}

impl RemoteRegion {
    /// The length of [`Self::to_bytes`].
    pub const ENCODED_LEN: usize = 16;

    /// A descriptor from its parts (as another program advertised them).
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `addr + len` overflows.
    pub fn new(addr: u64, len: u32, rkey: u32) -> io::Result<Self> {
        addr.checked_add(u64::from(len))
            .ok_or_else(|| error::invalid_input("remote region wraps around the address space"))?;
        Ok(RemoteRegion { addr, len, rkey })
    }

    /// The descriptor of local registered memory (a live allocation never wraps around).
    pub(crate) fn registered(addr: u64, len: u32, rkey: u32) -> Self {
        RemoteRegion { addr, len, rkey }
    }

    /// The peer's virtual address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// The length in bytes.
    pub fn len(&self) -> u32 {
        self.len
    }

    /// Whether the region is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The key that lets our device access the peer's memory.
    pub fn rkey(&self) -> u32 {
        self.rkey
    }

    /// The encoding librdmacm's `rping` uses for `struct rping_rdma_info`: address (8 bytes),
    /// rkey (4), length (4), each big-endian.
    pub fn to_bytes(&self) -> [u8; Self::ENCODED_LEN] {
        let mut out = [0; Self::ENCODED_LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        out[12..].copy_from_slice(&self.len.to_be_bytes());
        out
    }

    /// Decodes [`Self::to_bytes`] from the first 16 bytes of `bytes` (private data arrives
    /// zero-padded, so longer input is fine).
    ///
    /// # Errors
    ///
    /// `InvalidData` when fewer than 16 bytes are given or the region wraps around the address
    /// space.
    pub fn from_bytes(bytes: &[u8]) -> io::Result<Self> {
        let invalid = |what: String| io::Error::new(io::ErrorKind::InvalidData, what);
        let field = |range: std::ops::Range<usize>| {
            bytes.get(range).ok_or_else(|| {
                invalid(format!(
                    "a remote region descriptor is {} bytes, got {}",
                    Self::ENCODED_LEN,
                    bytes.len()
                ))
            })
        };
        let addr = u64::from_be_bytes(
            field(0..8)?
                .try_into()
                .map_err(|_| invalid("addr".into()))?,
        );
        let rkey = u32::from_be_bytes(
            field(8..12)?
                .try_into()
                .map_err(|_| invalid("rkey".into()))?,
        );
        let len = u32::from_be_bytes(
            field(12..16)?
                .try_into()
                .map_err(|_| invalid("len".into()))?,
        );
        Self::new(addr, len, rkey).map_err(|e| invalid(e.to_string()))
    }

    /// The bytes `offset..offset + len` of the region.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is not inside the region.
    pub fn slice(&self, offset: u32, len: u32) -> io::Result<RemoteSlice> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => Ok(RemoteRegion {
                addr: self.addr + u64::from(offset),
                len,
                rkey: self.rkey,
            }),
            _ => Err(error::invalid_input(format!(
                "range {offset}..{} is outside the {}-byte remote region",
                u64::from(offset) + u64::from(len),
                self.len
            ))),
        }
    }

    /// The whole region as a slice (the region itself).
    pub fn whole(&self) -> RemoteSlice {
        *self
    }
}

/// The target of one RDMA read, write or atomic: a [`RemoteRegion`] or a checked part of one
/// ([`RemoteRegion::slice`]). Operations check their length against it before posting.
pub type RemoteSlice = RemoteRegion;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_like_rping() {
        let r = RemoteRegion::new(0x0102_0304_0506_0708, 0x1112_1314, 0x2122_2324).unwrap();
        let bytes = r.to_bytes();
        assert_eq!(
            bytes,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0x21, 0x22, 0x23, 0x24, 0x11, 0x12, 0x13, 0x14
            ]
        );
        let mut padded = bytes.to_vec();
        padded.extend([0; 40]);
        assert_eq!(RemoteRegion::from_bytes(&padded).unwrap(), r);
        let e = RemoteRegion::from_bytes(&bytes[..15]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let wrap = RemoteRegion {
            addr: u64::MAX,
            len: 2,
            rkey: 0,
        };
        let e = RemoteRegion::from_bytes(&wrap.to_bytes()).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn slices_are_checked() {
        let r = RemoteRegion::new(4096, 100, 7).unwrap();
        let s = r.slice(90, 10).unwrap();
        assert_eq!((s.addr(), s.len(), s.rkey()), (4186, 10, 7));
        assert_eq!(
            r.slice(91, 10).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            r.slice(u32::MAX, 2).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(r.whole(), r);
    }
}
