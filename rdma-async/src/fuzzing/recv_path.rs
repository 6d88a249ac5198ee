//! Target `recv_path`: the immediates, data writes, SGL updates and connection data of a hostile
//! peer through the receiver's `handle_recv_completion`, against the invariants of
//! `proto::hostile`; and the first four bytes as one immediate word on its own.

use crate::proto::{Op, ProtoErrorKind};

/// One hostile peer's run, decoded from `bytes` (see `proto::hostile`); panics when the
/// connection breaks an invariant.
pub fn recv_path(bytes: &[u8]) {
    immediate(bytes);
    crate::proto::hostile::run(bytes);
}

/// An immediate word decodes to an op whose encoding is canonical (it decodes to the same op),
/// equal to the word where the word is canonical itself; only an unknown CTRL code is refused.
fn immediate(bytes: &[u8]) {
    let mut raw = [0u8; 4];
    let n = bytes.len().min(4);
    raw[..n].copy_from_slice(&bytes[..n]);
    let word = u32::from_be_bytes(raw);
    let (op_bits, data) = (word >> 29, word & 0x1fff_ffff);
    match Op::decode(word) {
        Ok(op) => {
            let encoded = op.encode();
            assert_eq!(Op::decode(encoded), Ok(op), "{word:#010x}");
            let canonical = match op_bits {
                // Reserved ops decode as DATA; SGL and IOMAP_SGL keep 16 bits.
                1 | 3 | 5 => false,
                4 | 6 => data <= 0xffff,
                _ => true,
            };
            if canonical {
                assert_eq!(encoded, word, "{op:?}");
            }
        }
        Err(e) => {
            assert_eq!(e.kind(), ProtoErrorKind::PeerViolation);
            assert!(op_bits == 7 && data > 2, "{word:#010x} refused: {e}");
        }
    }
}
