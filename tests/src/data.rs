//! Deterministic test data, so that lost, duplicated or misplaced bytes are caught.

/// `len` position-dependent bytes (a multiplicative hash of the position and `seed`): no short
/// period, so data shifted by any amount differs. For streams and large bodies.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8)
        .collect()
}

/// `len` bytes `i * 31 + seed` (mod 256): repeats every 256 bytes. For messages and datagrams,
/// where a message is checked whole.
pub fn cyclic(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
        .collect()
}
