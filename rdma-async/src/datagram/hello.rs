//! The private data rdma-async puts in its SIDR requests and replies.
//!
//! A SIDR request names the destination's rdma_cm port but not the sender's queue pair, and the
//! sender resolves from an rdma_cm id of its own (its own ephemeral port). So that `recv_from`
//! can report the address a sender is bound to, rdma-async says it in the private data: a magic
//! word, a version, the sender's bound port and its queue pair number. Peers that send anything
//! else (C `udaddy`) are still answered; their datagrams are attributed by source IP.

/// `"RDGM"`.
const MAGIC: [u8; 4] = *b"RDGM";
const VERSION: u8 = 1;
/// Encoded length.
pub(crate) const LEN: usize = 12;

/// A datagram socket introducing itself in a SIDR request or reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hello {
    /// The rdma_cm port the socket is bound to.
    pub(crate) port: u16,
    /// The socket's queue pair number.
    pub(crate) qpn: u32,
}

impl Hello {
    pub(crate) fn encode(&self) -> [u8; LEN] {
        let mut out = [0u8; LEN];
        out[..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[6..8].copy_from_slice(&self.port.to_be_bytes());
        out[8..12].copy_from_slice(&self.qpn.to_be_bytes());
        out
    }

    /// Reads a hello from private data (which the transport pads with zeros); `None` for
    /// anything else.
    pub(crate) fn decode(data: &[u8]) -> Option<Hello> {
        let data = data.get(..LEN)?;
        if data[..4] != MAGIC || data[4] != VERSION {
            return None;
        }
        Some(Hello {
            port: u16::from_be_bytes([data[6], data[7]]),
            qpn: u32::from_be_bytes([data[8], data[9], data[10], data[11]]) & 0x00ff_ffff,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_with_padding() {
        let h = Hello {
            port: 7174,
            qpn: 0x11,
        };
        let mut padded = h.encode().to_vec();
        padded.resize(180, 0);
        assert_eq!(Hello::decode(&padded), Some(h));
    }

    #[test]
    fn other_private_data_is_not_a_hello() {
        assert_eq!(Hello::decode(&[]), None);
        assert_eq!(Hello::decode(&[0; 56]), None);
        let mut wrong_version = Hello { port: 1, qpn: 2 }.encode();
        wrong_version[4] = 9;
        assert_eq!(Hello::decode(&wrong_version), None);
        assert_eq!(Hello::decode(&wrong_version[..5]), None);
    }
}
