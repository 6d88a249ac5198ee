//! Time as an input: the write probe (TCP's persist timer) and rsockets' keepalive.
//!
//! The connection keeps the deadlines; its driver reads the earliest with
//! `Connection::poll_timeout`, arms one timer for it, and calls `Connection::handle_timeout`
//! with the time when it fires (quinn-proto's shape). Nothing here reads a clock, so the
//! simulator drives it with instants of its own.
//!
//! A writer blocked on credits has nothing in flight, so a peer host that vanished is never
//! noticed: no work request is there to run out of transport retries. While the writer waits,
//! a probe (rsockets' keepalive, a 0-byte RDMA write the peer's application never sees) goes out
//! every [`WRITE_PROBE_INTERVAL`]; a dead peer then fails the probe's transport retries and the
//! writer gets that error. A live peer that simply does not read costs one 0-byte write per
//! interval. The keepalive (`RStreamOptions::keepalive`) sends the same write every interval
//! whether anyone waits or not, so a reader learns of a dead peer too.

use std::time::{Duration, Instant};

/// How long a writer waits for credits before probing the peer, and between probes.
pub(crate) const WRITE_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// The deadlines of one connection.
#[derive(Debug, Clone, Default)]
pub(super) struct Timers {
    /// When the blocked writer next probes the peer; `None`: no writer waits. Progress clears
    /// it, so the next wait starts a whole interval.
    probe_at: Option<Instant>,
    /// The keepalive's interval and when it is next due.
    keepalive: Option<(Duration, Instant)>,
}

/// What [`Timers::expire`] found due (each then queues one keepalive write).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Expired {
    /// The blocked writer's probe.
    pub(crate) probe: bool,
    /// The periodic keepalive.
    pub(crate) keepalive: bool,
}

impl Expired {
    /// Whether anything was due.
    pub(crate) fn any(self) -> bool {
        self.probe || self.keepalive
    }
}

impl Timers {
    /// A writer is about to wait at `now`. Returns whether this starts a wait (a writer polled
    /// again with no progress in between is still in the same one), which arms the probe.
    pub(super) fn writer_blocked(&mut self, now: Instant) -> bool {
        if self.probe_at.is_some() {
            return false;
        }
        self.probe_at = Some(now + WRITE_PROBE_INTERVAL);
        true
    }

    /// The writer made progress (or can): no probe until it waits again.
    pub(super) fn writer_unblocked(&mut self) {
        self.probe_at = None;
    }

    /// Sends a keepalive every `interval`, the first one `interval` after `now`.
    pub(super) fn set_keepalive(&mut self, interval: Duration, now: Instant) {
        self.keepalive = Some((interval, now + interval));
    }

    /// The earliest deadline.
    pub(super) fn next(&self) -> Option<Instant> {
        let keepalive = self.keepalive.map(|(_, at)| at);
        match (self.probe_at, keepalive) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Takes what is due at `now`; each timer that fired starts its next interval at `now` (a
    /// timer that fires late does not fire again at once to catch up).
    pub(super) fn expire(&mut self, now: Instant) -> Expired {
        let mut expired = Expired::default();
        if let Some(at) = self.probe_at
            && now >= at
        {
            self.probe_at = Some(now + WRITE_PROBE_INTERVAL);
            expired.probe = true;
        }
        if let Some((interval, at)) = self.keepalive
            && now >= at
        {
            self.keepalive = Some((interval, now + interval));
            expired.keepalive = true;
        }
        expired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_probe_is_due_an_interval_into_a_wait_and_every_interval_after() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        assert_eq!(timers.next(), None);
        assert!(timers.writer_blocked(t0), "the first wait starts one");
        assert!(
            !timers.writer_blocked(t0 + Duration::from_millis(500)),
            "same wait"
        );
        assert_eq!(timers.next(), Some(t0 + WRITE_PROBE_INTERVAL));
        assert!(!timers.expire(t0 + Duration::from_millis(999)).any());
        let late = t0 + Duration::from_millis(1500);
        assert!(timers.expire(late).probe);
        assert_eq!(timers.next(), Some(late + WRITE_PROBE_INTERVAL));
        timers.writer_unblocked();
        assert_eq!(timers.next(), None, "progress stops the probe");
        assert!(timers.writer_blocked(late), "the next wait is a new one");
    }

    #[test]
    fn the_keepalive_fires_every_interval_beside_the_probe() {
        let t0 = Instant::now();
        let mut timers = Timers::default();
        timers.set_keepalive(Duration::from_secs(5), t0);
        assert_eq!(timers.next(), Some(t0 + Duration::from_secs(5)));
        timers.writer_blocked(t0 + Duration::from_secs(4));
        assert_eq!(
            timers.next(),
            Some(t0 + Duration::from_secs(5)),
            "the earlier one"
        );
        let fired = timers.expire(t0 + Duration::from_secs(5));
        assert_eq!(
            fired,
            Expired {
                probe: true,
                keepalive: true
            }
        );
        assert_eq!(timers.next(), Some(t0 + Duration::from_secs(6)));
    }
}
