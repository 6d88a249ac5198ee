//! The 32-bit message word carried as immediate data (rsocket-protocol.md §2.2).
//!
//! Bits 31:29 are the op, bits 28:0 the data. The functions here work on the host-order word;
//! the driver converts to and from the wire (`imm_data` is big-endian, as in every verbs
//! program: `htobe32` on send, `be32toh` on receive).

use super::error::ProtoError;

const OP_SHIFT: u32 = 29;
/// Mask of the 29 data bits.
pub(crate) const IMM_DATA_MASK: u32 = (1 << OP_SHIFT) - 1;

const RS_OP_DATA: u32 = 0;
const RS_OP_RSVD_DATA_MORE: u32 = 1;
const RS_OP_WRITE: u32 = 2;
const RS_OP_RSVD_DRA_MORE: u32 = 3;
const RS_OP_SGL: u32 = 4;
const RS_OP_RSVD: u32 = 5;
const RS_OP_IOMAP_SGL: u32 = 6;
const RS_OP_CTRL: u32 = 7;

/// The code of a CTRL message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CtrlCode {
    /// 0: the sender is closing both directions.
    Disconnect,
    /// 1: defined by C but sent as a plain RDMA WRITE without immediate, so never received.
    Keepalive,
    /// 2: the sender has closed its writing direction (half-close).
    Shutdown,
}

impl CtrlCode {
    /// The wire code.
    pub(crate) const fn code(self) -> u32 {
        match self {
            CtrlCode::Disconnect => 0,
            CtrlCode::Keepalive => 1,
            CtrlCode::Shutdown => 2,
        }
    }
}

/// A decoded message word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    /// Op 0: this write carried `len` bytes of stream data. Reserved ops 1, 3 and 5 also decode
    /// as `Data`: C's receiver handles them in its default branch, as data, so we do the same
    /// for compatibility (and never send them).
    Data(u32),
    /// Op 4: the new absolute 16-bit send-sequence limit (not a delta); the 29-bit field is
    /// truncated to 16 bits as C does.
    Sgl(u16),
    /// Op 6: the peer wrote iomap entry `index` (bits 15:0).
    IomapSgl(u16),
    /// Op 7: a control message.
    Ctrl(CtrlCode),
    /// Op 2 (`RS_OP_WRITE`): only a local work-request tag in C, never sent as immediate data.
    /// C ignores it on receive; so do we.
    DirectWrite(u32),
}

impl Op {
    /// The host-order word. `Data` lengths must fit 29 bits (ours never exceed 65536); extra
    /// bits are masked off rather than allowed to corrupt the op.
    pub(crate) fn encode(self) -> u32 {
        let (op, data) = match self {
            Op::Data(len) => (RS_OP_DATA, len & IMM_DATA_MASK),
            Op::Sgl(limit) => (RS_OP_SGL, u32::from(limit)),
            Op::IomapSgl(index) => (RS_OP_IOMAP_SGL, u32::from(index)),
            Op::Ctrl(code) => (RS_OP_CTRL, code.code()),
            Op::DirectWrite(len) => (RS_OP_WRITE, len & IMM_DATA_MASK),
        };
        (op << OP_SHIFT) | data
    }

    /// Whether `word` is op 0 (DATA): its data bits are then the whole word. The data path
    /// checks this before a full [`Self::decode`]; the reserved ops that also decode as `Data`
    /// take the full decode.
    #[inline]
    pub(crate) const fn is_plain_data(word: u32) -> bool {
        word >> OP_SHIFT == RS_OP_DATA
    }

    /// Decode a host-order word. Only an unknown CTRL code is an error.
    pub(crate) fn decode(word: u32) -> Result<Op, ProtoError> {
        let data = word & IMM_DATA_MASK;
        Ok(match word >> OP_SHIFT {
            RS_OP_DATA | RS_OP_RSVD_DATA_MORE | RS_OP_RSVD_DRA_MORE | RS_OP_RSVD => Op::Data(data),
            RS_OP_WRITE => Op::DirectWrite(data),
            RS_OP_SGL => Op::Sgl(data as u16),
            RS_OP_IOMAP_SGL => Op::IomapSgl(data as u16),
            // Only 3 bits remain after the shift, so the last arm is op 7.
            _ => Op::Ctrl(match data {
                0 => CtrlCode::Disconnect,
                1 => CtrlCode::Keepalive,
                2 => CtrlCode::Shutdown,
                other => {
                    return Err(ProtoError::peer(format!(
                        "unknown CTRL code {other} in immediate word {word:#010x} (known: 0 \
                         DISCONNECT, 1 KEEPALIVE, 2 SHUTDOWN)"
                    )));
                }
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_decode_table() {
        let table: &[(Op, u32)] = &[
            (Op::Data(0), 0x0000_0000),
            (Op::Data(2048), 0x0000_0800),
            (Op::Data(65536), 0x0001_0000),
            (Op::Data(IMM_DATA_MASK), 0x1FFF_FFFF),
            (Op::DirectWrite(5), 0x4000_0005),
            (Op::Sgl(0), 0x8000_0000),
            (Op::Sgl(768), 0x8000_0300),
            (Op::Sgl(0xFFFF), 0x8000_FFFF),
            (Op::IomapSgl(3), 0xC000_0003),
            (Op::Ctrl(CtrlCode::Disconnect), 0xE000_0000),
            (Op::Ctrl(CtrlCode::Keepalive), 0xE000_0001),
            (Op::Ctrl(CtrlCode::Shutdown), 0xE000_0002),
        ];
        for &(op, word) in table {
            assert_eq!(op.encode(), word, "{op:?}");
            assert_eq!(Op::decode(word).unwrap(), op, "{word:#x}");
        }
    }

    #[test]
    fn reserved_ops_decode_as_data_like_c() {
        assert_eq!(Op::decode(0x2000_0010).unwrap(), Op::Data(0x10)); // op 1
        assert_eq!(Op::decode(0x6000_0020).unwrap(), Op::Data(0x20)); // op 3
        assert_eq!(Op::decode(0xA000_0030).unwrap(), Op::Data(0x30)); // op 5
    }

    #[test]
    fn sgl_limit_truncates_to_16_bits_like_c() {
        // C sends rseq_no + rq_size, which can exceed 0xFFFF.
        assert_eq!(Op::decode(0x8001_0005).unwrap(), Op::Sgl(5));
        assert_eq!(Op::decode(0xC123_0004).unwrap(), Op::IomapSgl(0x0004));
    }

    #[test]
    fn unknown_ctrl_code_is_an_error() {
        let err = Op::decode(0xE000_0003).unwrap_err();
        assert!(err.to_string().contains("unknown CTRL code 3"), "{err}");
        assert!(Op::decode(0xFFFF_FFFF).is_err());
    }

    #[test]
    fn oversized_data_is_masked_not_corrupting_the_op() {
        assert_eq!(Op::Data(0x2000_0001).encode(), 0x0000_0001);
    }
}
