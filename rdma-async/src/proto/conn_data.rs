//! `struct rs_conn_data`: the 40 bytes of connection private data (rsocket-protocol.md §1.2).
//!
//! | off | size | field |
//! |---|---|---|
//! | 0 | 1 | version (= 1) |
//! | 1 | 1 | flags: bit 0 NET (sender is big-endian), bit 1 IOMAP |
//! | 2 | 2 | credits, BE u16 (= sender's `rq_size`) |
//! | 4 | 3 | reserved, zero |
//! | 7 | 1 | target_iomap_size, scaled 8-bit code |
//! | 8 | 16 | target_sgl {addr BE u64, key BE u32, length BE u32 = entry count} |
//! | 24 | 16 | data_buf {addr, key, length = rbuf_size / 2}, all BE |

use super::config::RS_SGL_SIZE;
use super::error::ProtoError;
use super::sge::{ByteOrder, RsSge};

/// Encoded size of the connection data.
pub(crate) const CONN_DATA_LEN: usize = 40;
/// The only protocol version.
pub(crate) const RS_CONN_VERSION: u8 = 1;
/// Flag bit 0: the sender's host is big-endian (SGL payloads to it must be big-endian).
pub(crate) const RS_CONN_FLAG_NET: u8 = 1 << 0;
/// Flag bit 1: the sender has an iomap table after its target SGL.
pub(crate) const RS_CONN_FLAG_IOMAP: u8 = 1 << 1;
/// The largest target SGL we accept from a peer. C always advertises 2; a bound keeps a hostile
/// count from making us write SGL updates far past the peer's real array.
pub(crate) const MAX_PEER_TARGET_SGL_ENTRIES: u32 = 64;

/// Decoded connection data. `target_iomap_size` holds the decoded entry count, not the code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ConnData {
    /// Protocol version; valid data has 1.
    pub(crate) version: u8,
    /// `RS_CONN_FLAG_*` bits; unknown bits are ignored.
    pub(crate) flags: u8,
    /// Receive credits = the sender's receive queue depth.
    pub(crate) credits: u16,
    /// Entries in the sender's iomap table (decoded from the scale code).
    pub(crate) target_iomap_size: u16,
    /// The sender's target SGL: address, rkey, **entry count**.
    pub(crate) target_sgl: RsSge,
    /// The sender's first receive buffer (the first half of its receive ring).
    pub(crate) data_buf: RsSge,
}

impl ConnData {
    /// Whether the sender is big-endian (NET flag).
    pub(crate) fn net(&self) -> bool {
        self.flags & RS_CONN_FLAG_NET != 0
    }

    /// Whether the sender has an iomap table (IOMAP flag).
    #[cfg(test)]
    pub(crate) fn iomap(&self) -> bool {
        self.flags & RS_CONN_FLAG_IOMAP != 0
    }

    /// The byte order SGL payloads written to the sender of this data must use.
    pub(crate) fn sgl_byte_order(&self) -> ByteOrder {
        ByteOrder::from_net_flag(self.net())
    }

    /// The 40 wire bytes. Sizes that the iomap code cannot represent are rounded down.
    pub(crate) fn encode(&self) -> [u8; CONN_DATA_LEN] {
        let mut out = [0u8; CONN_DATA_LEN];
        out[0] = self.version;
        out[1] = self.flags;
        out[2..4].copy_from_slice(&self.credits.to_be_bytes());
        // out[4..7] reserved, zero.
        out[7] = iomap_size_to_code(self.target_iomap_size);
        out[8..24].copy_from_slice(&self.target_sgl.to_bytes(ByteOrder::Big));
        out[24..40].copy_from_slice(&self.data_buf.to_bytes(ByteOrder::Big));
        out
    }

    /// Decode and validate. `bytes` may be longer than 40 (IB pads private data to 56 or 196
    /// bytes); the rest is ignored. An AF_IB request's 36-byte header must be skipped by the
    /// caller.
    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, ProtoError> {
        let Some(raw) = bytes.get(..CONN_DATA_LEN) else {
            return Err(ProtoError::conn_data(format!(
                "private data is {} bytes, shorter than the {CONN_DATA_LEN}-byte rs_conn_data",
                bytes.len()
            )));
        };
        let sge_at = |off: usize| -> RsSge {
            let mut b = [0u8; 16];
            b.copy_from_slice(&raw[off..off + 16]);
            RsSge::from_bytes(b, ByteOrder::Big)
        };
        let data = ConnData {
            version: raw[0],
            flags: raw[1],
            credits: u16::from_be_bytes([raw[2], raw[3]]),
            target_iomap_size: iomap_code_to_size(raw[7]),
            target_sgl: sge_at(8),
            data_buf: sge_at(24),
        };
        data.validate()?;
        Ok(data)
    }

    /// Check every field a peer controls. Used by [`decode`](Self::decode) and again when a
    /// connection takes peer data, so a hand-built `ConnData` gets the same checks.
    pub(crate) fn validate(&self) -> Result<(), ProtoError> {
        if self.version != RS_CONN_VERSION {
            return Err(ProtoError::conn_data(format!(
                "version is {}, only version {RS_CONN_VERSION} is supported",
                self.version
            )));
        }
        if self.credits == 0 {
            return Err(ProtoError::conn_data(
                "credits is 0: the peer would accept no data messages",
            ));
        }
        let count = self.target_sgl.length;
        if count == 0 || count > MAX_PEER_TARGET_SGL_ENTRIES {
            return Err(ProtoError::conn_data(format!(
                "target_sgl.length is {count} entries, must be 1..={MAX_PEER_TARGET_SGL_ENTRIES}"
            )));
        }
        let sgl_bytes = u64::from(count) * RsSge::LEN as u64;
        if self.target_sgl.addr.checked_add(sgl_bytes).is_none() {
            return Err(ProtoError::conn_data(format!(
                "target_sgl.addr {:#x} + {count} entries overflows the address space",
                self.target_sgl.addr
            )));
        }
        if self.data_buf.length == 0 {
            return Err(ProtoError::conn_data(
                "data_buf.length is 0: the peer advertised no receive buffer",
            ));
        }
        if self.data_buf.end().is_none() {
            return Err(ProtoError::conn_data(format!(
                "data_buf.addr {:#x} + length {} overflows the address space",
                self.data_buf.addr, self.data_buf.length
            )));
        }
        Ok(())
    }

    /// The connection data this side sends: version 1, IOMAP set with 0 entries (what C sends
    /// by default), NET = whether this host is big-endian, `RS_SGL_SIZE` target SGL entries.
    pub(crate) fn local(
        credits: u16,
        target_sgl_addr: u64,
        target_sgl_rkey: u32,
        rbuf_addr: u64,
        rbuf_rkey: u32,
        half: u32,
    ) -> Self {
        let net = if ByteOrder::native() == ByteOrder::Big {
            RS_CONN_FLAG_NET
        } else {
            0
        };
        ConnData {
            version: RS_CONN_VERSION,
            flags: RS_CONN_FLAG_IOMAP | net,
            credits,
            target_iomap_size: 0,
            target_sgl: RsSge {
                addr: target_sgl_addr,
                key: target_sgl_rkey,
                length: RS_SGL_SIZE as u32,
            },
            data_buf: RsSge {
                addr: rbuf_addr,
                key: rbuf_rkey,
                length: half,
            },
        }
    }
}

/// The largest iomap size the 8-bit code can carry: `0x7F << 8`.
pub(crate) const MAX_IOMAP_SIZE: u16 = 0x7F << 8;

/// C's `rs_value_to_scale(value, 8)`: sizes up to 128 are exact, larger ones become
/// `0x80 | (size >> 8)` (multiples of 256, rounded down; capped at [`MAX_IOMAP_SIZE`]).
pub(crate) fn iomap_size_to_code(size: u16) -> u8 {
    if size <= 128 {
        size as u8
    } else {
        let scaled = (size.min(MAX_IOMAP_SIZE) >> 8) as u8;
        0x80 | scaled
    }
}

/// C's `rs_scale_to_value(code, 8)`: a byte up to 128 is the value, otherwise
/// `(code & 0x7F) << 8`.
pub(crate) fn iomap_code_to_size(code: u8) -> u16 {
    if code <= 128 {
        u16::from(code)
    } else {
        u16::from(code & 0x7F) << 8
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::error::ProtoErrorKind;

    fn sample() -> ConnData {
        ConnData {
            version: 1,
            flags: RS_CONN_FLAG_IOMAP,
            credits: 384,
            target_iomap_size: 0,
            target_sgl: RsSge {
                addr: 0x0000_7f12_3456_7000,
                key: 0x0000_1234,
                length: 2,
            },
            data_buf: RsSge {
                addr: 0x0000_7f12_3450_0000,
                key: 0x00ab_cdef,
                length: 65536,
            },
        }
    }

    const SAMPLE_BYTES: [u8; 40] = [
        0x01, // version
        0x02, // flags: IOMAP
        0x01, 0x80, // credits 384 BE
        0x00, 0x00, 0x00, // reserved
        0x00, // iomap size code
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x56, 0x70, 0x00, // target_sgl.addr
        0x00, 0x00, 0x12, 0x34, // target_sgl.key
        0x00, 0x00, 0x00, 0x02, // target_sgl.length (entries)
        0x00, 0x00, 0x7f, 0x12, 0x34, 0x50, 0x00, 0x00, // data_buf.addr
        0x00, 0xab, 0xcd, 0xef, // data_buf.key
        0x00, 0x01, 0x00, 0x00, // data_buf.length 65536
    ];

    #[test]
    fn encode_is_byte_exact() {
        assert_eq!(sample().encode(), SAMPLE_BYTES);
    }

    #[test]
    fn decode_round_trips_and_ignores_padding() {
        assert_eq!(ConnData::decode(&SAMPLE_BYTES).unwrap(), sample());
        let mut padded = [0xeeu8; 56];
        padded[..40].copy_from_slice(&SAMPLE_BYTES);
        assert_eq!(ConnData::decode(&padded).unwrap(), sample());
        let mut rep = [0u8; 196];
        rep[..40].copy_from_slice(&SAMPLE_BYTES);
        assert_eq!(ConnData::decode(&rep).unwrap(), sample());
    }

    fn decode_err(bytes: &[u8]) -> String {
        let err = ConnData::decode(bytes).unwrap_err();
        assert_eq!(err.kind(), ProtoErrorKind::InvalidConnData);
        err.to_string()
    }

    #[test]
    fn decode_rejects_bad_fields_by_name() {
        assert!(decode_err(&SAMPLE_BYTES[..39]).contains("39 bytes"));
        assert!(decode_err(&[]).contains("0 bytes"));

        let mut b = SAMPLE_BYTES;
        b[0] = 2;
        assert!(decode_err(&b).contains("version is 2"));

        let mut b = SAMPLE_BYTES;
        b[20..24].copy_from_slice(&0u32.to_be_bytes());
        assert!(decode_err(&b).contains("target_sgl.length is 0"));

        let mut b = SAMPLE_BYTES;
        b[20..24].copy_from_slice(&65u32.to_be_bytes());
        assert!(decode_err(&b).contains("target_sgl.length is 65"));

        let mut b = SAMPLE_BYTES;
        b[36..40].copy_from_slice(&0u32.to_be_bytes());
        assert!(decode_err(&b).contains("data_buf.length is 0"));

        let mut b = SAMPLE_BYTES;
        b[2..4].copy_from_slice(&0u16.to_be_bytes());
        assert!(decode_err(&b).contains("credits is 0"));

        let mut b = SAMPLE_BYTES;
        b[24..32].copy_from_slice(&u64::MAX.to_be_bytes());
        assert!(decode_err(&b).contains("data_buf.addr"));

        let mut b = SAMPLE_BYTES;
        b[8..16].copy_from_slice(&(u64::MAX - 8).to_be_bytes());
        assert!(decode_err(&b).contains("target_sgl.addr"));
    }

    #[test]
    fn flags() {
        let mut d = sample();
        assert!(d.iomap() && !d.net());
        assert_eq!(d.sgl_byte_order(), ByteOrder::Little);
        d.flags = RS_CONN_FLAG_NET;
        assert!(d.net() && !d.iomap());
        assert_eq!(d.sgl_byte_order(), ByteOrder::Big);
    }

    #[test]
    fn local_conn_data() {
        let d = ConnData::local(384, 0x1000, 7, 0x2000, 9, 65536);
        assert_eq!(d.version, 1);
        assert!(d.iomap());
        assert_eq!(d.net(), cfg!(target_endian = "big"));
        assert_eq!(d.target_sgl.length, 2);
        assert_eq!(d.data_buf.length, 65536);
        d.validate().unwrap();
    }

    #[test]
    fn iomap_scale_code_table() {
        for v in 0..=128u16 {
            assert_eq!(iomap_size_to_code(v), v as u8, "size {v}");
            assert_eq!(iomap_code_to_size(v as u8), v, "code {v}");
        }
        let table: [(u16, u8); 6] = [
            (256, 0x81),
            (512, 0x82),
            (1024, 0x84),
            (16384, 0xC0),
            (MAX_IOMAP_SIZE, 0xFF),
            (u16::MAX, 0xFF),
        ];
        for (size, code) in table {
            assert_eq!(iomap_size_to_code(size), code, "size {size}");
        }
        assert_eq!(iomap_code_to_size(0x81), 256);
        assert_eq!(iomap_code_to_size(0x84), 1024);
        assert_eq!(iomap_code_to_size(0xC0), 16384);
        assert_eq!(iomap_code_to_size(0xFF), MAX_IOMAP_SIZE);
        // 129..=255 round down to 128's code region: 0x80 decodes as 128.
        assert_eq!(iomap_size_to_code(200), 0x80);
        assert_eq!(iomap_code_to_size(0x80), 128);
        // Encode of a conn data carries the code at offset 7.
        let mut d = sample();
        d.target_iomap_size = 1024;
        assert_eq!(d.encode()[7], 0x84);
        assert_eq!(
            ConnData::decode(&d.encode()).unwrap().target_iomap_size,
            1024
        );
    }
}
