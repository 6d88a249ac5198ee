//! The receiving half: the message queue over the receive ring, what was granted to the peer,
//! and when to return buffer space and credits (rsocket-protocol.md §2.4, §2.5).
//!
//! The ring is used as two halves. Each half is *granted* to the peer (the first one in the
//! connection data, later ones by SGL updates) and the peer fills grants strictly in order, so
//! the data forms one contiguous byte stream around the ring. We check every DATA message
//! against the oldest unfilled grant, so a peer that writes more than it was given is caught
//! (the bytes already landed, but in memory we registered; we refuse to deliver them).

use std::collections::VecDeque;

use super::error::ProtoError;
use super::message_lengths::MessageLengths;
#[cfg(any(test, rdma_async_fuzzing))]
use super::ring::Segments;
use super::ring_access::{Bind, Revoke, RingAccess, RingKeys};
use super::sge::{ByteOrder, RsSge};

/// A buffer granted to the peer and how much of it the peer has filled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Grant {
    /// Slot of the peer's target SGL that holds it.
    slot: u32,
    offset: u32,
    len: u32,
    filled: u32,
}

/// Where our SGL updates go: the peer's target SGL.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct PeerSgl {
    addr: u64,
    key: u32,
    count: u32,
    order: ByteOrder,
}

/// A credit message to send, decided by [`Receiver::take_credit_update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CreditUpdate {
    /// A new half of the receive ring plus the new limit: a 16-byte write into the peer's
    /// target SGL slot `slot`.
    Sgl {
        slot: u32,
        payload: [u8; 16],
        remote_addr: u64,
        rkey: u32,
        limit: u16,
        /// A window bind to post before this update (zero-copy rings only).
        bind: Option<Bind>,
    },
    /// Only the new limit: a 0-byte write with immediate.
    Credits { limit: u16 },
}

/// What [`Receiver::lend`] found at the read position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Lend {
    /// `len` bytes at ring offset `offset` are readable and no peer can write them: they may
    /// be viewed until `consume`d.
    Ready { offset: u32, len: u32 },
    /// The bytes are in a half the peer has filled but may still write: carry out this
    /// revocation, then ask again.
    Revoke(Revoke),
    /// A revocation of that half is under way: ask again once it finished.
    Revoking,
    /// The bytes are in a half the peer is still filling (or the ring is not set up for
    /// lending): copy them.
    Copy,
    /// Nothing is readable.
    Empty,
}

/// Receiver state.
#[derive(Debug, Clone)]
pub(crate) struct Receiver {
    rbuf_addr: u64,
    rbuf_rkey: u32,
    rbuf_size: u32,
    half: u32,
    rq_size: u16,
    /// Unread bytes of each queued DATA message (C's rmsg ring). The bytes themselves are
    /// contiguous in the ring from `rbuf_offset`, so lengths are all the reader needs; a
    /// message is counted in `rseq_no` (returning its credit) once fully read.
    rmsgs: MessageLengths,
    /// Sum of `rmsgs`.
    readable: u32,
    /// Read position (C's `rbuf_offset`).
    rbuf_offset: u32,
    rseq_no: u16,
    rseq_comp: u16,
    /// Free bytes not yet granted to the peer.
    rbuf_bytes_avail: u32,
    /// Start of the next half to grant.
    rbuf_free_offset: u32,
    peer_sgl: Option<PeerSgl>,
    remote_sge: u32,
    grants: VecDeque<Grant>,
    /// DATA messages received (mod 2^16), checked against `credit_limit`.
    msgs_received: u16,
    /// The newest send limit we gave the peer (initially the credits in our conn data).
    credit_limit: u16,
    /// Who may write each half, when the ring lends bytes (zero-copy reads).
    access: Option<RingAccess>,
}

impl Receiver {
    pub(crate) fn new(rbuf_addr: u64, rbuf_rkey: u32, rbuf_size: u32, rq_size: u16) -> Self {
        let half = rbuf_size / 2;
        let mut grants = VecDeque::with_capacity(4);
        // The first half goes out in the connection data; the peer puts it in its slot 0.
        grants.push_back(Grant {
            slot: 0,
            offset: 0,
            len: half,
            filled: 0,
        });
        Self {
            rbuf_addr,
            rbuf_rkey,
            rbuf_size,
            half,
            rq_size,
            rmsgs: MessageLengths::with_capacity(usize::from(rq_size) + 1),
            readable: 0,
            rbuf_offset: 0,
            rseq_no: 0,
            rseq_comp: rq_size / 2,
            rbuf_bytes_avail: half,
            rbuf_free_offset: half,
            peer_sgl: None,
            remote_sge: 0,
            grants,
            msgs_received: 0,
            credit_limit: rq_size,
            access: None,
        }
    }

    /// Moves the sequence numbers on by `start` messages (see
    /// [`Sender::start_sequences_at`](super::sender::Sender::start_sequences_at)).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn start_sequences_at(&mut self, start: u16) {
        self.rseq_no = self.rseq_no.wrapping_add(start);
        self.rseq_comp = self.rseq_comp.wrapping_add(start);
        self.msgs_received = self.msgs_received.wrapping_add(start);
        self.credit_limit = self.credit_limit.wrapping_add(start);
    }

    /// Grants each half through its own keys, so that a half can be revoked and lent
    /// ([`Self::lend`]).
    pub(crate) fn with_ring_keys(mut self, keys: RingKeys) -> Self {
        self.rbuf_rkey = keys.initial[0];
        self.access = Some(RingAccess::new(keys));
        self
    }

    /// The key of the first grant (of the first half), for the connection data.
    pub(crate) fn first_grant_key(&self) -> u32 {
        self.rbuf_rkey
    }

    /// Whether the bytes at the read position can be lent, and what stands in the way.
    pub(crate) fn lend(&mut self) -> Lend {
        if self.readable == 0 {
            return Lend::Empty;
        }
        let Some(access) = &mut self.access else {
            return Lend::Copy;
        };
        let half = (self.rbuf_offset / self.half) as usize;
        let start = half as u32 * self.half;
        // A grant of this half not yet filled: the peer is still writing it.
        if self.grants.iter().any(|g| g.offset == start) {
            return Lend::Copy;
        }
        // A key whose revocation failed may still reach this half: copy, never lend.
        if access.is_unrevocable(half) {
            return Lend::Copy;
        }
        if access.is_revoked(half) {
            let len = self.readable.min(start + self.half - self.rbuf_offset);
            return Lend::Ready {
                offset: self.rbuf_offset,
                len,
            };
        }
        match access.begin_revoke(half) {
            Some(revoke) => Lend::Revoke(revoke),
            None => Lend::Revoking,
        }
    }

    /// A revocation [`Self::lend`] asked for finished.
    pub(crate) fn revoked(&mut self, half: usize, key: u32) {
        if let Some(access) = &mut self.access {
            access.revoked(half, key);
        }
    }

    /// A revocation [`Self::lend`] asked for failed: `half` is copied from now on.
    pub(crate) fn revoke_failed(&mut self, half: usize, key: u32) {
        if let Some(access) = &mut self.access {
            access.revoke_failed(half, key);
        }
    }

    /// Half the ring: the size of every grant.
    pub(crate) fn half(&self) -> u32 {
        self.half
    }

    /// Learn where the peer's target SGL is (`count` entries, payloads in `order`).
    pub(crate) fn set_peer_sgl(&mut self, addr: u64, key: u32, count: u32, order: ByteOrder) {
        self.peer_sgl = Some(PeerSgl {
            addr,
            key,
            count,
            order,
        });
        // C starts at 1 because slot 0 holds our conn-data buffer; `% count` keeps a 1-entry
        // peer in range (C would write past its array).
        self.remote_sge = 1 % count.max(1);
    }

    /// A DATA message of `len` bytes arrived. Returns the ring offset it landed at. Inlined
    /// into the completion's handling, which runs it for every message (as a call of its own
    /// it cost about 30 instructions a message more); the errors are built out of line.
    #[inline(always)]
    pub(crate) fn on_data(&mut self, len: u32) -> Result<u32, ProtoError> {
        if self.msgs_received == self.credit_limit {
            return Err(beyond_credits(self.credit_limit));
        }
        if len == 0 {
            // C never sends these. Count it as received and consumed at once so its credit
            // comes back; it carries no bytes and cannot confuse the ring.
            self.msgs_received = self.msgs_received.wrapping_add(1);
            self.rseq_no = self.rseq_no.wrapping_add(1);
            return Ok(self.write_offset());
        }
        let Some(grant) = self.grants.front_mut() else {
            return Err(no_grant(len));
        };
        let left = grant.len - grant.filled;
        if len > left {
            return Err(beyond_grant(len, grant));
        }
        let offset = grant.offset + grant.filled;
        grant.filled += len;
        if grant.filled == grant.len {
            self.grants.pop_front();
        }
        debug_assert_eq!(
            offset,
            self.write_offset(),
            "grants are consecutive halves, so data is contiguous in the ring"
        );
        self.rmsgs.push_back(len);
        self.readable += len;
        self.msgs_received = self.msgs_received.wrapping_add(1);
        Ok(offset)
    }

    /// Where the next byte from the peer lands: right after the unread bytes.
    fn write_offset(&self) -> u32 {
        ((u64::from(self.rbuf_offset) + u64::from(self.readable)) % u64::from(self.rbuf_size))
            as u32
    }

    /// The unread bytes, in order, as ring offsets (at most two segments).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn readable_segments(&self) -> Segments {
        Segments::in_ring(self.rbuf_offset, self.readable, self.rbuf_size)
    }

    /// The read position and how many readable bytes follow it before the end of the ring
    /// (the rest, if any, are at its start): the readable bytes' segments without building
    /// them, for the read of every message.
    #[inline]
    pub(crate) fn readable_run(&self) -> (usize, usize) {
        // `rbuf_offset < rbuf_size` (see `consume`).
        let to_end = self.rbuf_size - self.rbuf_offset;
        (
            self.rbuf_offset as usize,
            self.readable.min(to_end) as usize,
        )
    }

    /// Bytes from the read position to the end of its half of the ring.
    pub(crate) fn to_half_end(&self) -> usize {
        (self.half - self.rbuf_offset % self.half) as usize
    }

    /// How many bytes can be read now.
    pub(crate) fn readable_len(&self) -> usize {
        self.readable as usize
    }

    /// The application read `n` bytes from the front (C's `rrecv` bookkeeping). Inlined: it
    /// runs for every read, and the call's frame (a large `Result`) cost a third of its work.
    #[inline]
    pub(crate) fn consume(&mut self, n: usize) -> Result<(), ProtoError> {
        if n > self.readable as usize {
            return Err(ProtoError::usage(format!(
                "consume({n}) but only {} bytes are readable",
                self.readable
            )));
        }
        let mut left = n as u32;
        while left > 0 {
            let Some(msg) = self.rmsgs.front_mut() else {
                break;
            };
            let take = left.min(*msg);
            *msg -= take;
            left -= take;
            if *msg == 0 {
                self.rmsgs.pop_front();
                self.rseq_no = self.rseq_no.wrapping_add(1);
            }
        }
        let n = n as u32;
        self.readable -= n;
        // `n <= readable <= rbuf_size` and `rbuf_offset < rbuf_size`: one wrap at most.
        let (offset, wrapped) = self.rbuf_offset.overflowing_add(n);
        self.rbuf_offset = if wrapped || offset >= self.rbuf_size {
            offset.wrapping_sub(self.rbuf_size)
        } else {
            offset
        };
        self.rbuf_bytes_avail += n;
        Ok(())
    }

    /// Whether the next SGL update may go out: half a ring is free, we know the peer's SGL,
    /// and the slot it lands in no longer holds a buffer the peer has not filled (the
    /// "never overwrite a slot early" invariant, §2.5).
    #[inline]
    fn sgl_update_possible(&self) -> bool {
        self.rbuf_bytes_avail >= self.half
            && self.peer_sgl.is_some()
            && !self.grants.iter().any(|g| g.slot == self.remote_sge)
    }

    /// C's `rs_give_credits` without the control-slot and state conditions (the connection
    /// checks those).
    #[inline]
    pub(crate) fn credit_update_due(&self) -> bool {
        self.sgl_update_possible() || (self.rseq_no.wrapping_sub(self.rseq_comp) as i16) >= 0
    }

    /// C's `rs_send_credits`: decide and account for the next credit message.
    pub(crate) fn take_credit_update(&mut self) -> CreditUpdate {
        self.rseq_comp = self.rseq_no.wrapping_add(self.rq_size / 2);
        let limit = self.rseq_no.wrapping_add(self.rq_size);
        self.credit_limit = limit;
        match self.peer_sgl {
            Some(peer) if self.sgl_update_possible() => {
                let (key, bind) = match &mut self.access {
                    Some(access) => access.grant((self.rbuf_free_offset / self.half) as usize),
                    None => (self.rbuf_rkey, None),
                };
                let sge = RsSge {
                    addr: self
                        .rbuf_addr
                        .wrapping_add(u64::from(self.rbuf_free_offset)),
                    key,
                    length: self.half,
                };
                let slot = self.remote_sge;
                self.grants.push_back(Grant {
                    slot,
                    offset: self.rbuf_free_offset,
                    len: self.half,
                    filled: 0,
                });
                self.rbuf_bytes_avail -= self.half;
                self.rbuf_free_offset += self.half;
                if self.rbuf_free_offset >= self.rbuf_size {
                    self.rbuf_free_offset = 0;
                }
                self.remote_sge = (self.remote_sge + 1) % peer.count.max(1);
                CreditUpdate::Sgl {
                    slot,
                    payload: sge.to_bytes(peer.order),
                    remote_addr: peer.addr.wrapping_add(u64::from(slot) * RsSge::LEN as u64),
                    rkey: peer.key,
                    limit,
                    bind,
                }
            }
            _ => CreditUpdate::Credits { limit },
        }
    }

    /// Messages fully consumed by the application (mod 2^16).
    #[cfg(test)]
    pub(crate) fn rseq_no(&self) -> u16 {
        self.rseq_no
    }

    /// Free receive-ring bytes not yet granted.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn rbuf_bytes_avail(&self) -> u32 {
        self.rbuf_bytes_avail
    }

    /// The newest send limit we gave the peer.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn credit_limit(&self) -> u16 {
        self.credit_limit
    }

    /// Receive-ring bytes in all.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn rbuf_size(&self) -> u32 {
        self.rbuf_size
    }
}

/// [`Receiver::on_data`]'s error for a DATA message past the credits we granted.
#[cold]
#[inline(never)]
fn beyond_credits(credit_limit: u16) -> ProtoError {
    ProtoError::peer(format!(
        "DATA message beyond the send limit {credit_limit} we granted (credits exhausted)"
    ))
}

/// [`Receiver::on_data`]'s error for a DATA message with no buffer granted.
#[cold]
#[inline(never)]
fn no_grant(len: u32) -> ProtoError {
    ProtoError::peer(format!(
        "DATA message of {len} bytes but no receive buffer is granted to the peer"
    ))
}

/// [`Receiver::on_data`]'s error for a DATA message longer than what is left of its grant.
#[cold]
#[inline(never)]
fn beyond_grant(len: u32, grant: &Grant) -> ProtoError {
    ProtoError::peer(format!(
        "DATA message of {len} bytes overruns the granted buffer: only {} of the {}-byte SGE \
         at ring offset {} were left",
        grant.len - grant.filled,
        grant.len,
        grant.offset
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receiver(rbuf: u32, rq: u16) -> Receiver {
        let mut r = Receiver::new(0x5000_0000, 0x99, rbuf, rq);
        r.set_peer_sgl(0x6000_0000, 0x42, 2, ByteOrder::Little);
        r
    }

    #[test]
    fn first_update_grants_the_second_half_into_slot_1() {
        let mut r = receiver(8192, 16);
        assert!(r.credit_update_due());
        let second_half = RsSge {
            addr: 0x5000_1000,
            key: 0x99,
            length: 4096,
        };
        assert_eq!(
            r.take_credit_update(),
            CreditUpdate::Sgl {
                slot: 1,
                payload: second_half.to_bytes(ByteOrder::Little),
                remote_addr: 0x6000_0010,
                rkey: 0x42,
                limit: 16,
                bind: None,
            }
        );
        assert!(!r.credit_update_due());
    }

    fn lending_receiver(rbuf: u32) -> Receiver {
        let keys = RingKeys {
            initial: [0x1100, 0x2200],
            window: [0x3300, 0x4400],
        };
        let mut r = Receiver::new(0x5000_0000, 0x99, rbuf, 16).with_ring_keys(keys);
        r.set_peer_sgl(0x6000_0000, 0x42, 2, ByteOrder::Little);
        r
    }

    fn granted(update: CreditUpdate) -> (RsSge, Option<Bind>) {
        match update {
            CreditUpdate::Sgl { payload, bind, .. } => {
                (RsSge::from_bytes(payload, ByteOrder::Little), bind)
            }
            other => panic!("expected a grant, got {other:?}"),
        }
    }

    #[test]
    fn a_lending_ring_grants_each_half_with_its_own_keys_and_lends_only_revoked_full_halves() {
        let mut r = lending_receiver(8192);
        assert_eq!(r.first_grant_key(), 0x1100);
        assert_eq!(r.lend(), Lend::Empty);
        // The second half goes out with its own first registration's key; no bind.
        let (sge, bind) = granted(r.take_credit_update());
        assert_eq!((sge.addr, sge.key, bind), (0x5000_1000, 0x2200, None));
        // Half 0 partly filled: the peer may still write it, so the bytes are copied.
        r.on_data(1000).unwrap();
        assert_eq!(r.lend(), Lend::Copy);
        // Filled: its first registration must go before anything is lent; once.
        r.on_data(3096).unwrap();
        let revoke = Revoke::Deregister {
            half: 0,
            key: 0x1100,
        };
        assert_eq!(r.lend(), Lend::Revoke(revoke));
        assert_eq!(r.lend(), Lend::Revoking);
        r.revoked(0, 0x1100);
        assert_eq!(
            r.lend(),
            Lend::Ready {
                offset: 0,
                len: 4096
            }
        );
        // Half 1 fills too; after half 0 is consumed, half 0 is granted again through its
        // window, bound first under a new key.
        r.on_data(100).unwrap();
        r.consume(4096).unwrap();
        assert_eq!(r.lend(), Lend::Copy, "half 1 is still being filled");
        let (sge, bind) = granted(r.take_credit_update());
        assert_eq!((sge.addr, sge.key), (0x5000_0000, 0x3301));
        assert_eq!(
            bind,
            Some(Bind {
                half: 0,
                rkey: 0x3301
            })
        );
        // The window is what a lend of half 0 revokes next time.
        r.on_data(3996).unwrap();
        r.consume(4096).unwrap();
        r.on_data(4096).unwrap();
        assert_eq!(
            r.lend(),
            Lend::Revoke(Revoke::Invalidate {
                half: 0,
                key: 0x3301
            })
        );
    }

    #[test]
    fn a_plain_ring_copies() {
        let mut r = receiver(8192, 16);
        r.on_data(4096).unwrap();
        assert_eq!(r.lend(), Lend::Copy);
        let (sge, bind) = granted(r.take_credit_update());
        assert_eq!((sge.key, bind), (0x99, None));
    }

    #[test]
    fn the_read_position_wraps_at_the_end_of_the_ring() {
        let mut r = receiver(8192, 16);
        r.on_data(4096).unwrap();
        r.take_credit_update();
        r.consume(4000).unwrap();
        assert_eq!(r.on_data(4096).unwrap(), 4096);
        // From 4000 to the end of the ring, then across it: the read position wraps to 0 and
        // the bytes that follow are read from the start of the ring.
        r.consume(4192).unwrap();
        assert_eq!(r.rbuf_offset, 0);
        assert_eq!(r.readable_segments().as_slice(), []);
        r.take_credit_update();
        assert_eq!(r.on_data(100).unwrap(), 0);
        assert_eq!(r.readable_segments().as_slice()[0].offset, 0);
        r.consume(50).unwrap();
        assert_eq!(r.rbuf_offset, 50);
        assert_eq!(r.readable_segments().as_slice()[0].offset, 50);
    }

    #[test]
    fn data_is_checked_against_grants() {
        let mut r = receiver(8192, 16);
        assert_eq!(r.on_data(4000).unwrap(), 0);
        let err = r.on_data(97).unwrap_err();
        assert!(err.to_string().contains("only 96"), "{err}");
    }

    #[test]
    fn no_grant_and_credit_exhaustion() {
        let mut r = receiver(8192, 16);
        r.on_data(4096).unwrap();
        assert!(
            r.on_data(1)
                .unwrap_err()
                .to_string()
                .contains("no receive buffer")
        );

        let mut r = receiver(1 << 20, 16);
        for _ in 0..16 {
            r.on_data(1).unwrap();
        }
        assert!(
            r.on_data(1)
                .unwrap_err()
                .to_string()
                .contains("send limit 16")
        );
    }

    #[test]
    fn consume_wraps_and_counts_messages() {
        let mut r = receiver(8192, 16);
        let _ = r.take_credit_update(); // grant [4096, 8192)
        r.on_data(4096).unwrap();
        r.consume(4096).unwrap();
        let _ = r.take_credit_update(); // grant [0, 4096) into slot 0
        r.on_data(4000).unwrap();
        r.on_data(96).unwrap();
        r.on_data(100).unwrap();
        let segs: Vec<_> = r
            .readable_segments()
            .as_slice()
            .iter()
            .map(|s| (s.offset, s.len))
            .collect();
        assert_eq!(segs, [(4096, 4096), (0, 100)]);
        assert!(r.consume(4197).is_err());
        r.consume(4100).unwrap();
        assert_eq!(r.rseq_no(), 3);
        assert_eq!(r.readable_len(), 96);
        r.consume(96).unwrap();
        assert_eq!(r.rseq_no(), 4);
        assert_eq!(r.rbuf_bytes_avail(), 4096 + 100);
    }
}
