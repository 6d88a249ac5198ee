//! Which connection requests an `RListener` takes into a handshake: at most
//! [`MAX_HANDSHAKES`] at once, no more from one address than leaves an eighth of them to the
//! others, and no more than half the process's locked-memory limit pinned by the rings of
//! handshakes in progress.
//!
//! An accepted handshake registers its stream's rings before it answers the request (rsockets
//! sends the ring keys in the accept's private data), and holds them until the peer's last
//! handshake packet arrives or `accept_timeout` passes. Without these bounds one peer that
//! parks requests pins the rings of every slot: 64 streams of 264 KiB are more than an 8 MiB
//! `RLIMIT_MEMLOCK`, and then every registration of the process fails, established
//! connections' and the application's too.

use std::collections::HashMap;
use std::io;
use std::net::IpAddr;

/// How many handshakes may be in progress at once; further requests wait in rdma_cm's backlog.
pub(super) const MAX_HANDSHAKES: usize = 64;

/// The part of the handshakes a listener can run at once that one address leaves to the
/// others, by default: an eighth (at least one). Not more, so that a client pool that opens
/// dozens of connections at once from one host is served as a TCP server would serve it.
const KEPT_FOR_OTHERS: usize = 8;

/// The handshakes in progress, by source address and pinned bytes.
#[derive(Debug)]
pub(super) struct Admission {
    /// Bytes each handshake pins (its stream's rings).
    ring_bytes: usize,
    /// What handshakes in progress may pin together; `None`: no bound besides the slots.
    budget: Option<usize>,
    /// Handshakes one address may have in progress.
    per_source: usize,
    pinned: usize,
    from: HashMap<IpAddr, usize>,
}

/// Why a request was not taken into a handshake.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Refusal {
    /// Its address has as many handshakes in progress as one address may.
    Source { source: IpAddr, limit: usize },
    /// Its rings would take the handshakes in progress past the memory budget.
    Memory {
        pinned: usize,
        ring_bytes: usize,
        budget: usize,
    },
}

impl Refusal {
    /// The error that says why, for the log and (cut to fit) the reject's private data.
    pub(super) fn into_error(self) -> io::Error {
        let message = match self {
            Refusal::Source { source, limit } => format!(
                "{source} has {limit} connection handshakes in progress, the most one address \
                 may have; try again"
            ),
            Refusal::Memory {
                pinned,
                ring_bytes,
                budget,
            } => format!(
                "handshakes in progress pin {pinned} bytes; {ring_bytes} more would pass their \
                 budget of {budget} (half of RLIMIT_MEMLOCK); try again"
            ),
        };
        io::Error::new(io::ErrorKind::ConnectionRefused, message)
    }
}

impl Admission {
    /// A listener whose handshakes each pin `ring_bytes`, in a process whose binding
    /// locked-memory limit is `memlock_limit`; `per_source` overrides the default share.
    pub(super) fn new(
        ring_bytes: usize,
        memlock_limit: Option<u64>,
        per_source: Option<usize>,
    ) -> Self {
        let budget = memlock_limit.map(|limit| usize::try_from(limit / 2).unwrap_or(usize::MAX));
        let capacity = budget.map_or(MAX_HANDSHAKES, |budget| {
            (budget / ring_bytes.max(1)).clamp(1, MAX_HANDSHAKES)
        });
        Admission {
            ring_bytes,
            budget,
            per_source: per_source
                .unwrap_or(capacity - (capacity / KEPT_FOR_OTHERS).max(1))
                .max(1),
            pinned: 0,
            from: HashMap::new(),
        }
    }

    /// Takes a handshake from `source` into account, or says why not. The first handshake is
    /// always taken, even when its rings alone pass the budget: its registration then fails
    /// with the error that names the limit.
    pub(super) fn admit(&mut self, source: IpAddr) -> Result<(), Refusal> {
        let source = source.to_canonical();
        let count = self.from.get(&source).copied().unwrap_or(0);
        if count >= self.per_source {
            return Err(Refusal::Source {
                source,
                limit: self.per_source,
            });
        }
        if let Some(budget) = self.budget
            && self.pinned > 0
            && self.pinned + self.ring_bytes > budget
        {
            return Err(Refusal::Memory {
                pinned: self.pinned,
                ring_bytes: self.ring_bytes,
                budget,
            });
        }
        self.from.insert(source, count + 1);
        self.pinned += self.ring_bytes;
        Ok(())
    }

    /// A handshake from `source` ended (its stream returned, or its failure handled).
    pub(super) fn release(&mut self, source: IpAddr) {
        let source = source.to_canonical();
        if let Some(count) = self.from.get_mut(&source) {
            *count -= 1;
            if *count == 0 {
                self.from.remove(&source);
            }
            self.pinned -= self.ring_bytes;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const RINGS: usize = 264 * 1024;
    const MIB: u64 = 1 << 20;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn one_address_leaves_an_eighth_of_the_slots_to_others() {
        let mut admission = Admission::new(RINGS, None, None);
        for _ in 0..56 {
            admission.admit(ip("10.0.0.1")).unwrap();
        }
        assert_eq!(
            admission.admit(ip("10.0.0.1")),
            Err(Refusal::Source {
                source: ip("10.0.0.1"),
                limit: 56
            })
        );
        admission.admit(ip("10.0.0.2")).unwrap();
        // An IPv4-mapped IPv6 address is the same source.
        assert!(admission.admit(ip("::ffff:10.0.0.1")).is_err());
        admission.release(ip("10.0.0.1"));
        admission.admit(ip("::ffff:10.0.0.1")).unwrap();
    }

    #[test]
    fn under_8_mib_of_memlock_handshakes_pin_at_most_half_of_it() {
        let mut admission = Admission::new(RINGS, Some(8 * MIB), None);
        // 4 MiB holds 15 handshakes of 264 KiB: 14 from one address, 1 left for the others.
        let mut admitted = 0;
        while admission.admit(ip("10.0.0.1")).is_ok() {
            admitted += 1;
        }
        assert_eq!(admitted, 14);
        admission.admit(ip("10.0.0.2")).unwrap();
        assert!(admission.pinned <= 4 * MIB as usize);
        assert!(matches!(
            admission.admit(ip("10.0.0.99")),
            Err(Refusal::Memory { budget, .. }) if budget == 4 * MIB as usize
        ));
        admission.release(ip("10.0.0.1"));
        admission.admit(ip("10.0.0.99")).unwrap();
    }

    #[test]
    fn the_first_handshake_is_taken_even_when_its_rings_pass_the_budget() {
        let mut admission = Admission::new(3 * MIB as usize, Some(4 * MIB), None);
        admission.admit(ip("10.0.0.1")).unwrap();
        assert!(matches!(
            admission.admit(ip("10.0.0.2")),
            Err(Refusal::Memory { .. })
        ));
        admission.release(ip("10.0.0.1"));
        admission.admit(ip("10.0.0.2")).unwrap();
    }

    #[test]
    fn a_set_share_overrides_the_default_and_zero_means_one() {
        let mut admission = Admission::new(RINGS, None, Some(100));
        for _ in 0..64 {
            admission.admit(ip("10.0.0.1")).unwrap();
        }
        let mut admission = Admission::new(RINGS, None, Some(0));
        admission.admit(ip("10.0.0.1")).unwrap();
        assert!(admission.admit(ip("10.0.0.1")).is_err());
    }

    #[test]
    fn releases_return_what_was_taken_and_unknown_ones_change_nothing() {
        let mut admission = Admission::new(RINGS, Some(8 * MIB), None);
        admission.admit(ip("10.0.0.1")).unwrap();
        admission.release(ip("10.0.0.2"));
        admission.release(ip("10.0.0.1"));
        admission.release(ip("10.0.0.1"));
        assert_eq!(admission.pinned, 0);
        assert!(admission.from.is_empty());
    }

    #[test]
    fn refusals_say_why_and_fit_a_reject() {
        for refusal in [
            Refusal::Source {
                source: ip("fe80::1234:5678:9abc:def0"),
                limit: 16,
            },
            Refusal::Memory {
                pinned: 4_194_304,
                ring_bytes: 270_336,
                budget: 4_194_304,
            },
        ] {
            let err = refusal.into_error();
            assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
            let text = err.to_string();
            assert!(text.contains("handshakes in progress"), "{text}");
            assert!(text.len() <= 140, "{} bytes: {text}", text.len());
        }
    }
}
