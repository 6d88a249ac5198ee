//! Target `grh`: the 40 bytes the device writes in front of every received datagram (a GRH, an
//! IPv6 header, or an IPv4 header in the last 20 bytes).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::datagram::grh;
use crate::verbs::GRH_LEN;

/// Parses the first 40 bytes of `bytes` (zero-padded) and compares with what the header kind
/// says, decided here independently: an IPv4 header (version 4 at byte 20; when byte 0 also says
/// IPv6, only a 20-byte IPv4 header with a correct checksum) gives the IPv4 addresses at bytes
/// 32 and 36; otherwise an IPv6/GRH header gives the GIDs at bytes 8 and 24; anything else is
/// refused.
pub fn grh(bytes: &[u8]) {
    let mut header = [0u8; GRH_LEN];
    let n = bytes.len().min(GRH_LEN);
    header[..n].copy_from_slice(&bytes[..n]);
    let v4_at = |at: usize| {
        IpAddr::from(Ipv4Addr::new(
            header[at],
            header[at + 1],
            header[at + 2],
            header[at + 3],
        ))
    };
    let gid_at = |at: usize| {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&header[at..at + 16]);
        raw
    };
    let ipv6 = header[0] >> 4 == 6;
    let ipv4 = if ipv6 {
        header[20] == 0x45 && checksum(&header[20..]) == 0xffff
    } else {
        header[20] >> 4 == 4
    };
    let parsed = grh::parse(&header);
    if ipv4 {
        let a = parsed.expect("an IPv4 header was refused");
        assert_eq!((a.src, a.dst), (v4_at(32), v4_at(36)));
    } else if ipv6 {
        let a = parsed.expect("an IPv6/GRH header was refused");
        assert_eq!(a.src, grh::gid_to_ip(gid_at(8)));
        assert_eq!(a.dst, grh::gid_to_ip(gid_at(24)));
    } else {
        assert_eq!(parsed, None, "neither header, yet parsed");
    }
    // A GID is an IPv6 address; an IPv4-mapped one is the IPv4 address it maps.
    let raw = gid_at(8);
    match grh::gid_to_ip(raw) {
        IpAddr::V4(v4) => assert_eq!(v4.to_ipv6_mapped().octets(), raw),
        IpAddr::V6(v6) => {
            assert_eq!(v6.octets(), raw);
            assert!(Ipv6Addr::from(raw).to_ipv4_mapped().is_none());
        }
    }
}

/// The one's-complement sum of the 16-bit words (0xffff for a header with a correct checksum).
fn checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for w in header.chunks_exact(2) {
        sum += u32::from(w[0]) << 8 | u32::from(w[1]);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    sum as u16
}
