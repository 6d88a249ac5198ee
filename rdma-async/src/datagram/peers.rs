//! Who is who: cached routes to destinations, and the senders datagrams come from.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::verbs::AddressHandle;

/// How to reach one destination: an address handle, the remote queue pair and its Q_Key.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) ah: Arc<AddressHandle>,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
    /// The destination is an rdma-async socket that knows us: number our datagrams for it.
    sequenced: bool,
    next_seq: AtomicU32,
}

impl Route {
    pub(crate) fn new(ah: AddressHandle, qpn: u32, qkey: u32, sequenced: bool) -> Self {
        Route {
            ah: Arc::new(ah),
            qpn,
            qkey,
            sequenced,
            next_seq: AtomicU32::new(0),
        }
    }

    /// The immediate data of the next datagram on this route: a sequence number for
    /// rdma-async peers (so they can count drops), otherwise our queue pair number, which is
    /// what librdmacm's `udaddy` and `mckey` send (and `udaddy` replies to). Called with the
    /// socket's send lock held, so numbers go out in order.
    pub(crate) fn next_imm(&self, own_qpn: u32) -> u32 {
        if self.sequenced {
            self.next_seq.fetch_add(1, Ordering::Relaxed)
        } else {
            own_qpn
        }
    }
}

/// The IP form that received headers use: IPv4-mapped IPv6 addresses as IPv4.
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(ip, IpAddr::V4),
        v4 => v4,
    }
}

#[derive(Debug)]
struct Source {
    addr: SocketAddr,
    sequenced: bool,
    next_seq: u32,
    seen: bool,
}

/// The senders a socket knows, by source IP and queue pair number.
#[derive(Debug, Default)]
pub(crate) struct Sources {
    known: HashMap<(IpAddr, u32), Source>,
    /// The rdma_cm port of the latest SIDR request from an IP that did not introduce itself.
    anonymous_ports: HashMap<IpAddr, u16>,
}

/// Who sent a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attribution {
    pub(crate) from: SocketAddr,
    /// The first datagram from this sender.
    pub(crate) first: bool,
    /// The sender numbers its datagrams to us.
    pub(crate) sequenced: bool,
    /// Numbered datagrams of this sender that never arrived before this one.
    pub(crate) missed: u32,
}

impl Sources {
    /// An rdma-async socket at `addr` with queue pair `qpn` introduced itself (in a SIDR
    /// request or reply); its numbering starts at 0.
    pub(crate) fn learn_peer(&mut self, addr: SocketAddr, qpn: u32) {
        let key = (canonical(addr.ip()), qpn);
        match self.known.get(&key) {
            // Both sides may resolve each other; the numbering already under way stays.
            Some(s) if s.sequenced && s.addr == addr => {}
            _ => {
                self.known.insert(
                    key,
                    Source {
                        addr,
                        sequenced: true,
                        next_seq: 0,
                        seen: false,
                    },
                );
            }
        }
    }

    /// We resolved `addr` to queue pair `qpn` of a peer that did not introduce itself (a C
    /// `udaddy` server): its datagrams come from there.
    pub(crate) fn learn_resolved(&mut self, addr: SocketAddr, qpn: u32) {
        self.known
            .entry((canonical(addr.ip()), qpn))
            .or_insert(Source {
                addr,
                sequenced: false,
                next_seq: 0,
                seen: false,
            });
    }

    /// A peer that did not introduce itself asked for our queue pair from `addr`.
    pub(crate) fn learn_anonymous(&mut self, addr: SocketAddr) {
        self.anonymous_ports
            .insert(canonical(addr.ip()), addr.port());
    }

    /// Attributes a datagram from `src` (as its header says) and queue pair `qpn`, carrying
    /// `imm`; `multicast` datagrams are never numbered.
    pub(crate) fn attribute(
        &mut self,
        src: IpAddr,
        qpn: u32,
        imm: Option<u32>,
        multicast: bool,
    ) -> Attribution {
        let src = canonical(src);
        let anonymous_port = self.anonymous_ports.get(&src).copied().unwrap_or(0);
        let source = self.known.entry((src, qpn)).or_insert_with(|| Source {
            addr: SocketAddr::new(src, anonymous_port),
            sequenced: false,
            next_seq: 0,
            seen: false,
        });
        let first = !source.seen;
        source.seen = true;
        let mut missed = 0;
        if let (Some(seq), true, false) = (imm, source.sequenced, multicast) {
            let ahead = seq.wrapping_sub(source.next_seq);
            // A number behind the expected one is a duplicate or reordered: not a gap.
            if ahead < 1 << 31 {
                missed = ahead;
                source.next_seq = seq.wrapping_add(1);
            }
        }
        Attribution {
            from: source.addr,
            first,
            sequenced: source.sequenced,
            missed,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn introduced_peers_are_attributed_and_gaps_counted() {
        let mut s = Sources::default();
        s.learn_peer(addr("10.77.0.1:5000"), 17);
        let ip = addr("10.77.0.1:0").ip();
        let a = s.attribute(ip, 17, Some(0), false);
        assert_eq!(
            (a.from, a.first, a.missed),
            (addr("10.77.0.1:5000"), true, 0)
        );
        let a = s.attribute(ip, 17, Some(4), false);
        assert_eq!((a.first, a.missed), (false, 3));
        // A duplicate or late datagram is not a gap, and multicast is not numbered.
        assert_eq!(s.attribute(ip, 17, Some(2), false).missed, 0);
        assert_eq!(s.attribute(ip, 17, Some(900), true).missed, 0);
        assert_eq!(s.attribute(ip, 17, Some(5), false).missed, 0);
        // Learning the same peer again (it resolved us too) keeps the numbering.
        s.learn_peer(addr("10.77.0.1:5000"), 17);
        assert_eq!(s.attribute(ip, 17, Some(6), false).missed, 0);
    }

    #[test]
    fn numbering_wraps() {
        let mut s = Sources::default();
        s.learn_peer(addr("10.77.0.1:5000"), 1);
        let ip = addr("10.77.0.1:0").ip();
        assert_eq!(
            s.attribute(ip, 1, Some(0x7000_0000), false).missed,
            0x7000_0000
        );
        assert_eq!(
            s.attribute(ip, 1, Some(0xe000_0000), false).missed,
            0x6fff_ffff
        );
        assert_eq!(
            s.attribute(ip, 1, Some(u32::MAX), false).missed,
            0x1fff_fffe
        );
        // After u32::MAX comes 0: 1 means one datagram went missing.
        assert_eq!(s.attribute(ip, 1, Some(1), false).missed, 1);
    }

    #[test]
    fn unknown_senders_get_their_ip_and_latest_sidr_port() {
        let mut s = Sources::default();
        let ip = addr("[::ffff:10.77.0.2]:0").ip();
        let a = s.attribute(ip, 9, Some(9), false);
        assert_eq!(
            (a.from, a.sequenced, a.missed),
            (addr("10.77.0.2:0"), false, 0)
        );
        s.learn_anonymous(addr("10.77.0.3:41000"));
        let a = s.attribute(addr("10.77.0.3:0").ip(), 12, Some(12), false);
        assert_eq!(a.from, addr("10.77.0.3:41000"));
        s.learn_resolved(addr("10.77.0.4:7174"), 33);
        let a = s.attribute(addr("10.77.0.4:0").ip(), 33, Some(1), false);
        assert_eq!((a.from, a.sequenced), (addr("10.77.0.4:7174"), false));
    }
}
