//! FNV-1a (64 bit): the checksum the examples that move bulk data print on both sides, so a
//! user can compare them at a glance.

/// The starting value.
pub const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// `hash` continued over `bytes`.
pub fn fnv1a(hash: u64, bytes: &[u8]) -> u64 {
    bytes.iter().fold(hash, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}
