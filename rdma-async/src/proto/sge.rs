//! `struct rs_sge` (addr u64, key u32, length u32 = 16 bytes) and the byte orders it travels in.
//!
//! In the connection data the fields are big-endian. In SGL updates written into a peer's target
//! SGL they are in the **receiving peer's native order** (C byte-swaps when the peers' NET flags
//! differ), so the same struct has two encodings.

use super::config::RS_MAX_CTRL_MSG;

/// Byte order of an SGL payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ByteOrder {
    /// Little-endian (x86, arm64 Linux, ...): NET flag 0.
    Little,
    /// Big-endian (network order): NET flag 1.
    Big,
}

impl ByteOrder {
    /// This host's order, which is the order our target SGL is written in by the peer.
    pub(crate) const fn native() -> Self {
        if cfg!(target_endian = "big") {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        }
    }

    /// The order a peer with this NET flag expects.
    pub(crate) const fn from_net_flag(net: bool) -> Self {
        if net {
            ByteOrder::Big
        } else {
            ByteOrder::Little
        }
    }
}

/// One remote buffer: start address, rkey and length in bytes (or, for a conn data `target_sgl`,
/// a count of entries).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct RsSge {
    /// Remote virtual address.
    pub(crate) addr: u64,
    /// Remote key of the memory region.
    pub(crate) key: u32,
    /// Bytes (entries for `target_sgl`).
    pub(crate) length: u32,
}

impl RsSge {
    /// Encoded size: 16 bytes.
    pub(crate) const LEN: usize = RS_MAX_CTRL_MSG;

    /// Encode in `order` (addr, key, length at offsets 0, 8, 12).
    pub(crate) fn to_bytes(self, order: ByteOrder) -> [u8; 16] {
        let mut out = [0u8; 16];
        match order {
            ByteOrder::Little => {
                out[0..8].copy_from_slice(&self.addr.to_le_bytes());
                out[8..12].copy_from_slice(&self.key.to_le_bytes());
                out[12..16].copy_from_slice(&self.length.to_le_bytes());
            }
            ByteOrder::Big => {
                out[0..8].copy_from_slice(&self.addr.to_be_bytes());
                out[8..12].copy_from_slice(&self.key.to_be_bytes());
                out[12..16].copy_from_slice(&self.length.to_be_bytes());
            }
        }
        out
    }

    /// Decode from `order`.
    pub(crate) fn from_bytes(bytes: [u8; 16], order: ByteOrder) -> Self {
        let [
            a0,
            a1,
            a2,
            a3,
            a4,
            a5,
            a6,
            a7,
            k0,
            k1,
            k2,
            k3,
            l0,
            l1,
            l2,
            l3,
        ] = bytes;
        let (addr, key, length) = (
            [a0, a1, a2, a3, a4, a5, a6, a7],
            [k0, k1, k2, k3],
            [l0, l1, l2, l3],
        );
        match order {
            ByteOrder::Little => Self {
                addr: u64::from_le_bytes(addr),
                key: u32::from_le_bytes(key),
                length: u32::from_le_bytes(length),
            },
            ByteOrder::Big => Self {
                addr: u64::from_be_bytes(addr),
                key: u32::from_be_bytes(key),
                length: u32::from_be_bytes(length),
            },
        }
    }

    /// One past the last byte, or `None` if `addr + length` overflows (a malformed entry).
    pub(crate) fn end(self) -> Option<u64> {
        self.addr.checked_add(u64::from(self.length))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_orders_round_trip_and_are_byte_exact() {
        let sge = RsSge {
            addr: 0x0102_0304_0506_0708,
            key: 0x1112_1314,
            length: 0x2122_2324,
        };
        let le = sge.to_bytes(ByteOrder::Little);
        assert_eq!(
            le,
            [
                8, 7, 6, 5, 4, 3, 2, 1, 0x14, 0x13, 0x12, 0x11, 0x24, 0x23, 0x22, 0x21
            ]
        );
        let be = sge.to_bytes(ByteOrder::Big);
        assert_eq!(
            be,
            [
                1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14, 0x21, 0x22, 0x23, 0x24
            ]
        );
        assert_eq!(RsSge::from_bytes(le, ByteOrder::Little), sge);
        assert_eq!(RsSge::from_bytes(be, ByteOrder::Big), sge);
        assert_eq!(ByteOrder::from_net_flag(true), ByteOrder::Big);
        assert_eq!(ByteOrder::from_net_flag(false), ByteOrder::Little);
        assert_eq!(
            RsSge {
                addr: u64::MAX,
                key: 0,
                length: 1
            }
            .end(),
            None
        );
    }
}
