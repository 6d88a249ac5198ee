//! The 40 bytes in front of every received datagram: who sent it, and to which address.
//!
//! InfiniBand and RoCE v1 put a Global Route Header there (source and destination GID at
//! bytes 8 and 24). RoCE v2 over IPv6 puts the IPv6 header there, which has the same layout;
//! RoCE v2 over IPv4 leaves 20 bytes unused and puts the IPv4 header in the last 20. As
//! libibverbs' `ibv_init_ah_from_wc` does, the IPv4 case is recognised by its version nibble and
//! its header checksum.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::verbs::GRH_LEN;

/// The source and destination address of a received datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct GrhAddrs {
    pub(crate) src: IpAddr,
    pub(crate) dst: IpAddr,
}

/// Where the IPv4 header starts in the GRH area (RoCE v2 over IPv4).
const IPV4_AT: usize = 20;

/// Reads the addresses; `None` when the bytes are neither a GRH/IPv6 header nor an IPv4 header.
pub(crate) fn parse(grh: &[u8; GRH_LEN]) -> Option<GrhAddrs> {
    let ip6_version = grh[0] >> 4;
    let ip4 = &grh[IPV4_AT..];
    let ip4_version = ip4[0] >> 4;
    let ip4_ihl = ip4[0] & 0xf;
    let is_ipv4 = if ip6_version == 6 {
        // Both are possible: an IPv4 header must also be 20 bytes long and checksum correctly.
        ip4_version == 4 && ip4_ihl == 5 && ipv4_checksum_ok(ip4)
    } else {
        ip4_version == 4
    };
    if is_ipv4 {
        let src = Ipv4Addr::new(ip4[12], ip4[13], ip4[14], ip4[15]);
        let dst = Ipv4Addr::new(ip4[16], ip4[17], ip4[18], ip4[19]);
        return Some(GrhAddrs {
            src: src.into(),
            dst: dst.into(),
        });
    }
    if ip6_version != 6 {
        return None;
    }
    let gid = |at: usize| {
        let mut raw = [0u8; 16];
        raw.copy_from_slice(&grh[at..at + 16]);
        gid_to_ip(raw)
    };
    Some(GrhAddrs {
        src: gid(8),
        dst: gid(24),
    })
}

/// The IP address of a RoCE GID: IPv4-mapped GIDs are IPv4 addresses.
pub(crate) fn gid_to_ip(raw: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(raw);
    match v6.to_ipv4_mapped() {
        Some(v4) => v4.into(),
        None => v6.into(),
    }
}

fn ipv4_checksum_ok(header: &[u8]) -> bool {
    let sum: u32 = header
        .chunks_exact(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    let folded = (sum & 0xffff) + (sum >> 16);
    let folded = (folded & 0xffff) + (folded >> 16);
    folded == 0xffff
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4_header(src: [u8; 4], dst: [u8; 4]) -> [u8; 20] {
        let mut h = [0u8; 20];
        h[0] = 0x45;
        h[3] = 60;
        h[8] = 64;
        h[9] = 17;
        h[12..16].copy_from_slice(&src);
        h[16..20].copy_from_slice(&dst);
        let sum: u32 = h
            .chunks_exact(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        let sum = (sum & 0xffff) + (sum >> 16);
        let check = !(((sum & 0xffff) + (sum >> 16)) as u16);
        h[10..12].copy_from_slice(&check.to_be_bytes());
        h
    }

    #[test]
    fn roce_v2_ipv4() {
        let mut grh = [0u8; GRH_LEN];
        grh[20..].copy_from_slice(&ipv4_header([10, 77, 0, 1], [239, 1, 2, 3]));
        let a = parse(&grh).unwrap();
        assert_eq!(a.src, "10.77.0.1".parse::<IpAddr>().unwrap());
        assert_eq!(a.dst, "239.1.2.3".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn ipv6_and_mapped_gids() {
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        grh[8..24].copy_from_slice(&"fd77::1".parse::<Ipv6Addr>().unwrap().octets());
        grh[24..40].copy_from_slice(&"::ffff:10.77.0.2".parse::<Ipv6Addr>().unwrap().octets());
        let a = parse(&grh).unwrap();
        assert_eq!(a.src, "fd77::1".parse::<IpAddr>().unwrap());
        assert_eq!(a.dst, "10.77.0.2".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn ipv6_whose_tail_looks_like_ipv4_without_a_valid_checksum() {
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        grh[20] = 0x45; // inside the source GID; the checksum does not match
        grh[22] = 0x12;
        let a = parse(&grh).unwrap();
        assert!(a.src.is_ipv6());
    }

    #[test]
    fn garbage_is_rejected_without_panicking() {
        assert_eq!(parse(&[0u8; GRH_LEN]), None);
        for b in 0..=255u8 {
            let _ = parse(&[b; GRH_LEN]);
        }
    }
}
