//! Who is who: cached routes to destinations, and the senders datagrams come from.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};

use super::address_handles::CountedHandle;
use super::lru::LruMap;

/// How to reach one destination: an address handle, the remote queue pair and its Q_Key.
#[derive(Debug)]
pub(crate) struct Route {
    pub(crate) ah: Arc<CountedHandle>,
    pub(crate) qpn: u32,
    pub(crate) qkey: u32,
    immediate: Immediate,
}

/// What the datagrams of a route carry in their immediate data.
#[derive(Debug)]
enum Immediate {
    /// The destination is an rdma-async socket that knows us: a sequence number, so it can
    /// count drops.
    Sequenced(AtomicU32),
    /// Our queue pair number, which is what librdmacm's `udaddy` and `mckey` send (and
    /// `udaddy` replies to).
    OwnQpn,
    /// A multicast group: our bound port, marked (see [`group_sender_imm`]), so that members
    /// can name us and answer.
    GroupSender(u16),
}

/// The top 16 bits of the immediate data of a datagram an rdma-async socket sends to a group;
/// the low 16 are its bound port. Queue pair numbers are 24 bits, so the immediates of C tools
/// (their queue pair number) never carry this mark.
const GROUP_SENDER_MARK: u32 = 0xa5d6_0000;

/// The immediate data naming a group datagram's sender by its bound `port`.
pub(crate) fn group_sender_imm(port: u16) -> u32 {
    GROUP_SENDER_MARK | u32::from(port)
}

/// The bound port a group datagram's immediate names, if an rdma-async socket sent it.
pub(crate) fn group_sender_port(imm: u32) -> Option<u16> {
    (imm & 0xffff_0000 == GROUP_SENDER_MARK).then_some(imm as u16)
}

impl Route {
    /// A route to a peer; `sequenced` when it is an rdma-async socket that knows us.
    pub(crate) fn new(ah: CountedHandle, qpn: u32, qkey: u32, sequenced: bool) -> Self {
        Route {
            ah: Arc::new(ah),
            qpn,
            qkey,
            immediate: if sequenced {
                Immediate::Sequenced(AtomicU32::new(0))
            } else {
                Immediate::OwnQpn
            },
        }
    }

    /// A route to a multicast group, from a socket bound to `own_port`.
    pub(crate) fn to_group(ah: CountedHandle, qpn: u32, qkey: u32, own_port: u16) -> Self {
        Route {
            ah: Arc::new(ah),
            qpn,
            qkey,
            immediate: Immediate::GroupSender(own_port),
        }
    }

    /// The immediate data of the next datagram on this route (see [`Immediate`]). Called with
    /// the socket's send lock held, so sequence numbers go out in order.
    pub(crate) fn next_imm(&self, own_qpn: u32) -> u32 {
        match &self.immediate {
            Immediate::Sequenced(next) => next.fetch_add(1, Ordering::Relaxed),
            Immediate::OwnQpn => own_qpn,
            Immediate::GroupSender(port) => group_sender_imm(*port),
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
}

/// The senders a socket knows, by source IP and queue pair number. Both tables keep at most
/// the socket's `max_peers` entries, forgetting the least recently heard from first: peers
/// (or one peer claiming to be many) cannot make them grow without bound.
#[derive(Debug)]
pub(crate) struct Sources {
    known: LruMap<(IpAddr, u32), Source>,
    /// The rdma_cm port of the latest SIDR request from an IP that did not introduce itself.
    anonymous_ports: LruMap<IpAddr, u16>,
}

/// Who sent a datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Attribution {
    pub(crate) from: SocketAddr,
    /// The sender numbers its datagrams to us.
    pub(crate) sequenced: bool,
    /// Numbered datagrams of this sender that never arrived before this one.
    pub(crate) missed: u32,
}

impl Sources {
    /// Tables of at most `max_peers` senders each.
    pub(crate) fn new(max_peers: usize) -> Self {
        Sources {
            known: LruMap::new(max_peers),
            anonymous_ports: LruMap::new(max_peers),
        }
    }

    /// How many senders are remembered: introduced or heard from, and anonymous SIDR ports.
    #[cfg(any(test, rdma_async_hooks, rdma_async_fuzzing))]
    pub(crate) fn len(&self) -> usize {
        self.known.len() + self.anonymous_ports.len()
    }

    /// An rdma-async socket at `addr` with queue pair `qpn` introduced itself (in a SIDR
    /// request or reply); its numbering starts at 0.
    pub(crate) fn learn_peer(&mut self, addr: SocketAddr, qpn: u32) {
        let key = (canonical(addr.ip()), qpn);
        match self.known.get(&key) {
            // Both sides may resolve each other; the numbering already under way stays.
            Some(s) if s.sequenced && s.addr == addr => {}
            _ => self.known.insert(
                key,
                Source {
                    addr,
                    sequenced: true,
                    next_seq: 0,
                },
            ),
        }
    }

    /// We resolved `addr` to queue pair `qpn` of a peer that did not introduce itself (a C
    /// `udaddy` server): its datagrams come from there.
    pub(crate) fn learn_resolved(&mut self, addr: SocketAddr, qpn: u32) {
        self.known
            .get_or_insert_with((canonical(addr.ip()), qpn), || Source {
                addr,
                sequenced: false,
                next_seq: 0,
            });
    }

    /// A peer that did not introduce itself asked for our queue pair from `addr`.
    pub(crate) fn learn_anonymous(&mut self, addr: SocketAddr) {
        self.anonymous_ports
            .insert(canonical(addr.ip()), addr.port());
    }

    /// Attributes a datagram from `src` (as its header says) and queue pair `qpn`, carrying
    /// `imm`; `multicast` datagrams are never numbered, and those of rdma-async sockets name
    /// their sender's port in `imm`.
    pub(crate) fn attribute(
        &mut self,
        src: IpAddr,
        qpn: u32,
        imm: Option<u32>,
        multicast: bool,
    ) -> Attribution {
        let src = canonical(src);
        if let Some(port) = imm.filter(|_| multicast).and_then(group_sender_port) {
            // The datagram says who sent it: no table is needed (nor grown).
            return Attribution {
                from: SocketAddr::new(src, port),
                sequenced: false,
                missed: 0,
            };
        }
        let anonymous_port = self.anonymous_ports.peek(&src).copied().unwrap_or(0);
        let source = self.known.get_or_insert_with((src, qpn), || Source {
            addr: SocketAddr::new(src, anonymous_port),
            sequenced: false,
            next_seq: 0,
        });
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
        let mut s = Sources::new(16);
        s.learn_peer(addr("10.77.0.1:5000"), 17);
        let ip = addr("10.77.0.1:0").ip();
        let a = s.attribute(ip, 17, Some(0), false);
        assert_eq!((a.from, a.missed), (addr("10.77.0.1:5000"), 0));
        let a = s.attribute(ip, 17, Some(4), false);
        assert_eq!(a.missed, 3);
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
        let mut s = Sources::new(16);
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
        let mut s = Sources::new(16);
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

    #[test]
    fn group_datagrams_of_rdma_async_senders_name_their_port() {
        let mut s = Sources::new(16);
        let ip = addr("10.77.0.5:0").ip();
        let imm = group_sender_imm(7605);
        let a = s.attribute(ip, 40, Some(imm), true);
        assert_eq!((a.from, a.missed), (addr("10.77.0.5:7605"), 0));
        assert_eq!(s.len(), 0, "a named sender needs no table entry");
        // A C tool's immediate is its queue pair number: 24 bits, never the mark.
        assert_eq!(group_sender_port(0x00ff_ffff), None);
        let a = s.attribute(ip, 41, Some(41), true);
        assert_eq!(a.from, addr("10.77.0.5:0"));
        // The mark means nothing in a unicast datagram (there it is a sequence number).
        s.learn_peer(addr("10.77.0.6:9000"), 3);
        let a = s.attribute(addr("10.77.0.6:0").ip(), 3, Some(imm), false);
        assert_eq!(a.from, addr("10.77.0.6:9000"));
    }

    #[test]
    fn thousands_of_claimed_senders_stay_within_max_peers() {
        let mut s = Sources::new(64);
        for i in 0..5000u32 {
            // A peer claiming a new port and queue pair in each SIDR request.
            s.learn_peer(SocketAddr::new(addr("10.77.0.7:0").ip(), i as u16), i);
            s.learn_anonymous(SocketAddr::new(std::net::Ipv4Addr::from(i).into(), 1));
        }
        assert_eq!(s.len(), 128, "64 introduced senders and 64 anonymous ports");
        // The newest are still attributed; the oldest were forgotten.
        let ip = addr("10.77.0.7:0").ip();
        assert_eq!(s.attribute(ip, 4999, Some(0), false).from.port(), 4999);
        assert_eq!(s.attribute(ip, 0, Some(0), false).from.port(), 0);
        assert_eq!(s.len(), 128);
    }
}
