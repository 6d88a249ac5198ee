//! Target `datagram_peers`: who a datagram socket says its datagrams come from. The sender
//! tables (`datagram::peers::Sources`, two `LruMap`s) at a small capacity, under random
//! datagrams from many (spoofed) sources, given as the header the device writes in front of
//! them (an IPv4 header, or a GRH with an IPv6 or IPv4-mapped GID, parsed by `grh::parse`), with
//! random immediates (sequence numbers, group-sender marks, anything), unicast or multicast,
//! and peers learned as a SIDR exchange learns them (introduced, resolved, anonymous).
//!
//! The harness keeps a model of both tables (a plain least-recently-used list each) and checks
//! after every step:
//! - the tables never hold more than their capacity each;
//! - a datagram is attributed to the IP its header names (a mapped GID and an IPv4 header name
//!   the same sender), and to a port that sender's own learning gave (its introduction or
//!   resolution, for its queue pair, or its IP's latest anonymous SIDR port), the port a
//!   group datagram's immediate names, or none (0): never another peer's;
//! - only an introduced sender's unicast datagrams are numbered, and the gap they report is the
//!   model's (duplicates and late ones are no gap, numbers wrap);
//! - the attribution, including which senders were forgotten to make room, is the model's.

use std::collections::{HashMap, HashSet};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use crate::datagram::grh;
use crate::datagram::peers::{
    Attribution, Sources, canonical, group_sender_imm, group_sender_port,
};
use crate::verbs::GRH_LEN;

/// At most this many steps of an input are run (a bigger input is the same run).
const MAX_STEPS: usize = 512;

/// The IPs senders claim: a few IPv4 ones (also written as IPv4-mapped IPv6 below) and IPv6.
const IPS: [IpAddr; 6] = [
    IpAddr::V4(Ipv4Addr::new(10, 77, 0, 1)),
    IpAddr::V4(Ipv4Addr::new(10, 77, 0, 2)),
    IpAddr::V4(Ipv4Addr::new(192, 168, 7, 9)),
    IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 2)),
    IpAddr::V6(Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 3)),
];

/// The input, a byte at a time (zeros once it runs out).
struct Input<'a>(std::slice::Iter<'a, u8>);

impl Input<'_> {
    fn byte(&mut self) -> u8 {
        self.0.next().copied().unwrap_or(0)
    }

    fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.byte(), self.byte()])
    }

    fn u32(&mut self) -> u32 {
        u32::from_be_bytes([self.byte(), self.byte(), self.byte(), self.byte()])
    }

    /// One of [`IPS`], an IPv4 one sometimes written IPv4-mapped.
    fn ip(&mut self) -> IpAddr {
        let b = self.byte();
        match IPS[usize::from(b) % IPS.len()] {
            IpAddr::V4(v4) if b & 0x80 != 0 => IpAddr::V6(v4.to_ipv6_mapped()),
            ip => ip,
        }
    }

    /// A queue pair number: mostly a few small ones, so senders collide; sometimes any.
    fn qpn(&mut self) -> u32 {
        let b = self.byte();
        if b & 0x80 == 0 {
            u32::from(b % 4)
        } else {
            self.u32() & 0x00ff_ffff
        }
    }
}

/// The model of one `LruMap`: entries from the least to the most recently used.
struct Lru<K, V> {
    entries: Vec<(K, V)>,
    capacity: usize,
}

impl<K: PartialEq, V> Lru<K, V> {
    fn peek(&self, key: &K) -> Option<&V> {
        self.entries.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    /// Makes `key` the most recently used; its value.
    fn touch(&mut self, key: &K) -> Option<&mut V> {
        let i = self.entries.iter().position(|(k, _)| k == key)?;
        let entry = self.entries.remove(i);
        self.entries.push(entry);
        self.entries.last_mut().map(|(_, v)| v)
    }

    fn get_or_insert_with(&mut self, key: K, make: impl FnOnce() -> V) -> &mut V {
        if self.touch(&key).is_none() {
            if self.entries.len() >= self.capacity {
                self.entries.remove(0);
            }
            self.entries.push((key, make()));
        }
        &mut self.entries.last_mut().expect("just pushed").1
    }

    fn insert(&mut self, key: K, value: V) {
        match self.touch(&key) {
            Some(v) => *v = value,
            None => {
                if self.entries.len() >= self.capacity {
                    self.entries.remove(0);
                }
                self.entries.push((key, value));
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Source {
    addr: SocketAddr,
    sequenced: bool,
    next_seq: u32,
}

struct Model {
    known: Lru<(IpAddr, u32), Source>,
    anonymous: Lru<IpAddr, u16>,
    /// Every port each (IP, queue pair) introduced itself or was resolved with.
    learned: HashMap<(IpAddr, u32), HashSet<u16>>,
    /// Every anonymous SIDR port each IP used.
    anonymous_ever: HashMap<IpAddr, HashSet<u16>>,
}

impl Model {
    fn learn_peer(&mut self, addr: SocketAddr, qpn: u32) {
        let key = (canonical(addr.ip()), qpn);
        self.learned.entry(key).or_default().insert(addr.port());
        let fresh = Source {
            addr,
            sequenced: true,
            next_seq: 0,
        };
        match self.known.touch(&key) {
            Some(s) if s.sequenced && s.addr == addr => {}
            Some(s) => *s = fresh,
            None => self.known.insert(key, fresh),
        }
    }

    fn learn_resolved(&mut self, addr: SocketAddr, qpn: u32) {
        let key = (canonical(addr.ip()), qpn);
        self.learned.entry(key).or_default().insert(addr.port());
        self.known.get_or_insert_with(key, || Source {
            addr,
            sequenced: false,
            next_seq: 0,
        });
    }

    fn learn_anonymous(&mut self, addr: SocketAddr) {
        let ip = canonical(addr.ip());
        self.anonymous_ever
            .entry(ip)
            .or_default()
            .insert(addr.port());
        match self.anonymous.touch(&ip) {
            Some(port) => *port = addr.port(),
            None => self.anonymous.insert(ip, addr.port()),
        }
    }

    /// The attribution the socket should make of a datagram from queue pair `qpn` at `src`.
    fn expect(
        &mut self,
        (src, qpn): (IpAddr, u32),
        imm: Option<u32>,
        multicast: bool,
    ) -> Attribution {
        let (from, sequenced, missed) = match imm.filter(|_| multicast).and_then(group_sender_port)
        {
            Some(port) => (SocketAddr::new(src, port), false, 0),
            None => {
                let anonymous = self.anonymous.peek(&src).map_or(0, |p| *p);
                let s = self.known.get_or_insert_with((src, qpn), || Source {
                    addr: SocketAddr::new(src, anonymous),
                    sequenced: false,
                    next_seq: 0,
                });
                let gap = match imm {
                    Some(seq) if s.sequenced && !multicast => {
                        let ahead = seq.wrapping_sub(s.next_seq);
                        (ahead < 1 << 31).then(|| {
                            s.next_seq = seq.wrapping_add(1);
                            ahead
                        })
                    }
                    _ => None,
                };
                (s.addr, s.sequenced, gap.unwrap_or(0))
            }
        };
        Attribution {
            from,
            sequenced,
            missed,
        }
    }

    fn len(&self) -> usize {
        self.known.entries.len() + self.anonymous.entries.len()
    }
}

/// The header the device writes in front of a datagram from `src` to a unicast or multicast
/// destination: an IPv4 header for an IPv4 sender when `v4_header`, else a GRH whose GIDs are
/// the IPv6 (or IPv4-mapped) addresses.
fn header(src: IpAddr, multicast: bool, v4_header: bool) -> [u8; GRH_LEN] {
    let mut h = [0u8; GRH_LEN];
    match (canonical(src), v4_header) {
        (IpAddr::V4(v4), true) => {
            h[20] = 0x45;
            h[32..36].copy_from_slice(&v4.octets());
            let dst = if multicast {
                [239, 1, 2, 3]
            } else {
                [10, 77, 0, 99]
            };
            h[36..40].copy_from_slice(&dst);
        }
        (ip, _) => {
            h[0] = 0x60;
            let gid = match ip {
                IpAddr::V4(v4) => v4.to_ipv6_mapped(),
                IpAddr::V6(v6) => v6,
            };
            h[8..24].copy_from_slice(&gid.octets());
            let dst = if multicast {
                Ipv6Addr::new(0xff0e, 0, 0, 0, 0, 0, 0, 7)
            } else {
                Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 99)
            };
            h[24..40].copy_from_slice(&dst.octets());
        }
    }
    h
}

/// Runs the datagrams and learning `bytes` encodes against fresh tables (their capacity from
/// the first byte) and checks them against the model after every step.
pub fn datagram_peers(bytes: &[u8]) {
    let mut input = Input(bytes.iter());
    let capacity = 1 + usize::from(input.byte() % 6);
    let mut sources = Sources::new(capacity);
    let mut model = Model {
        known: Lru {
            entries: Vec::new(),
            capacity,
        },
        anonymous: Lru {
            entries: Vec::new(),
            capacity,
        },
        learned: HashMap::new(),
        anonymous_ever: HashMap::new(),
    };
    for _ in 0..MAX_STEPS {
        if input.0.len() == 0 {
            break;
        }
        let op = input.byte();
        match op % 4 {
            0 => {
                let addr = SocketAddr::new(input.ip(), input.u16());
                let qpn = input.qpn();
                sources.learn_peer(addr, qpn);
                model.learn_peer(addr, qpn);
            }
            1 => {
                let addr = SocketAddr::new(input.ip(), input.u16());
                let qpn = input.qpn();
                sources.learn_resolved(addr, qpn);
                model.learn_resolved(addr, qpn);
            }
            2 => {
                let addr = SocketAddr::new(input.ip(), input.u16());
                sources.learn_anonymous(addr);
                model.learn_anonymous(addr);
            }
            _ => datagram(&mut sources, &mut model, op, &mut input),
        }
        assert!(
            sources.len() <= 2 * capacity,
            "{} senders remembered, at most {capacity} each",
            sources.len()
        );
        assert_eq!(
            sources.len(),
            model.len(),
            "the tables differ from the model"
        );
    }
}

/// One received datagram: its header parsed as the receive path parses it, then attributed.
fn datagram(sources: &mut Sources, model: &mut Model, op: u8, input: &mut Input<'_>) {
    let src = input.ip();
    let qpn = input.qpn();
    let multicast = op & 0x10 != 0;
    let imm = match input.byte() % 4 {
        0 => None,
        1 => Some(group_sender_imm(input.u16())),
        // Near the numbering the sender is at: gaps, duplicates, late ones and the wrap.
        2 => Some(u32::from(input.byte()).wrapping_sub(8)),
        _ => Some(input.u32()),
    };
    let addrs = grh::parse(&header(src, multicast, op & 0x20 != 0))
        .expect("a well-formed header was refused");
    assert_eq!(addrs.src, canonical(src), "the header names another sender");
    assert_eq!(addrs.dst.is_multicast(), multicast);
    let got = sources.attribute(addrs.src, qpn, imm, multicast);
    let sender = canonical(src);
    assert_eq!(
        canonical(got.from.ip()),
        sender,
        "a datagram from {sender} attributed to {}",
        got.from
    );
    let port = got.from.port();
    let named = multicast && imm.and_then(group_sender_port) == Some(port);
    let learned = model
        .learned
        .get(&(sender, qpn))
        .is_some_and(|p| p.contains(&port));
    let anonymous = model
        .anonymous_ever
        .get(&sender)
        .is_some_and(|p| p.contains(&port));
    assert!(
        port == 0 || named || learned || anonymous,
        "a datagram from {sender} (queue pair {qpn}) attributed to port {port}, which it never used"
    );
    if multicast || !got.sequenced {
        assert_eq!(got.missed, 0, "an unnumbered datagram reported a gap");
    }
    assert_eq!(
        got,
        model.expect((sender, qpn), imm, multicast),
        "attribution"
    );
}
