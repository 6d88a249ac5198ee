//! Receiving: [`RDatagram::recv_from`] and its relatives, and what a receive completion is
//! checked for before its datagram is queued (its Global Route Header names the sender).

use std::io;
use std::net::SocketAddr;

use super::{RDatagram, lock};
use crate::cm::Slots;
use crate::datagram::grh;
use crate::datagram::stats::Counters;
use crate::verbs::{GRH_LEN, WcStatus, WorkCompletion};

/// Receive slots, all posted; what arrived waits in `ready`.
type RecvSlots = Slots<ArrivedDatagram, ()>;

/// A received datagram waiting in its receive slot.
#[derive(Debug)]
pub(super) struct ArrivedDatagram {
    slot: usize,
    len: usize,
    from: SocketAddr,
}

/// Whether a receive takes the datagram it returns, or leaves it for the next (a peek).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Take {
    Remove,
    Keep,
}

impl RDatagram {
    /// Receives one datagram from the connected peer into `buf`; see [`Self::recv_from`].
    ///
    /// # Errors
    ///
    /// As [`Self::recv_from`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::recv_from`].
    pub async fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.recv_from(buf).await.map(|(n, _)| n)
    }

    /// Receives one datagram into `buf` and returns its length and sender. A datagram longer
    /// than `buf` is truncated: the rest is discarded (as with `UdpSocket`) and the returned
    /// length is what was copied.
    ///
    /// The sender is the address its socket is bound to when it is an rdma-async socket (it
    /// introduced itself when it resolved us). Other senders are reported by the IP address
    /// in the datagram's header, with the rdma_cm port of their latest request to us, or port
    /// 0 if they made none (multicast senders, for example).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::datagram::RDatagram;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let socket = RDatagram::bind("10.77.0.1:7174").await?;
    ///     // No datagram is longer than the port's MTU.
    ///     let mut buf = vec![0; socket.max_datagram()];
    ///     loop {
    ///         let (len, from) = socket.recv_from(&mut buf).await?;
    ///         socket.send_to(&buf[..len], from).await?; // echo
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// Errors of the device when it can no longer receive.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a datagram is only taken when it is returned.
    pub async fn recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.next_datagram(buf, Take::Remove).await
    }

    /// Receives one datagram into `buf` without removing it: the next receive returns the same
    /// datagram. Returns its length (truncated to `buf`, as [`Self::recv_from`]) and sender.
    ///
    /// With a connected socket ([`Self::connect`]), datagrams from other senders are discarded
    /// on the way, as a receive discards them.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::datagram::RDatagram;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let socket = RDatagram::bind("10.77.0.1:7174").await?;
    ///     let mut buf = vec![0; socket.max_datagram()];
    ///     let (len, from) = socket.peek_from(&mut buf).await?;
    ///     println!("{from} sent {len} bytes");
    ///     // The same datagram again, now taken.
    ///     let (len, from) = socket.recv_from(&mut buf).await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Self::recv_from`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: nothing is taken.
    pub async fn peek_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        self.next_datagram(buf, Take::Keep).await
    }

    /// Waits for the next datagram (from the connected peer, if any) and copies it into `buf`.
    async fn next_datagram(&self, buf: &mut [u8], take: Take) -> io::Result<(usize, SocketAddr)> {
        let mut slots = self.recv.lock().await;
        loop {
            self.fill_or_end(&mut slots).await?;
            if let Some(got) = self.take(&mut slots, buf, take)? {
                return Ok(got);
            }
        }
    }

    /// Receives a datagram from the connected peer if one is waiting.
    ///
    /// # Errors
    ///
    /// `NotConnected` without [`Self::connect`]; otherwise as [`Self::try_recv_from`].
    pub fn try_recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.peer_addr()?;
        self.try_recv_from(buf).map(|(n, _)| n)
    }

    /// Receives a datagram if one is waiting.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when none is (or another task is receiving); otherwise as
    /// [`Self::recv_from`].
    pub fn try_recv_from(&self, buf: &mut [u8]) -> io::Result<(usize, SocketAddr)> {
        let mut slots = self.recv.try_lock()?;
        loop {
            if let Some(got) = self.take(&mut slots, buf, Take::Remove)? {
                return Ok(got);
            }
            if !self
                .recv
                .try_fill(&mut slots, &mut |s, wc| self.reap_recv(s, wc))?
            {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Waits until a datagram is waiting to be received.
    ///
    /// # Errors
    ///
    /// As [`Self::recv_from`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn readable(&self) -> io::Result<()> {
        let mut slots = self.recv.lock().await;
        self.fill_or_end(&mut slots).await
    }

    /// Waits until a datagram is ready, or fails once the socket ended (its device was removed),
    /// which no completion would report.
    async fn fill_or_end(&self, slots: &mut RecvSlots) -> io::Result<()> {
        self.check_alive()?;
        let reap = &mut |s: &mut RecvSlots, wc: &WorkCompletion| self.reap_recv(s, wc);
        let fill = self.recv.fill(slots, None, reap);
        // `fill` is cancel safe: what arrived stays ready.
        tokio::select! {
            filled = fill => filled,
            e = self.shared.ended() => Err(e),
        }
    }

    /// Copies out the oldest queued datagram (from the connected peer, if any) and, unless
    /// `take` keeps it, posts its slot again.
    fn take(
        &self,
        slots: &mut RecvSlots,
        buf: &mut [u8],
        take: Take,
    ) -> io::Result<Option<(usize, SocketAddr)>> {
        let peer = *lock(&self.peer);
        while let Some(got) = slots.ready.front() {
            if peer.is_some_and(|p| p != got.from) {
                Counters::add(&self.shared.counters.filtered, 1);
                self.repost(got.slot);
                slots.ready.pop_front();
                continue;
            }
            let (slot, len, from) = (got.slot, got.len, got.from);
            let n = len.min(buf.len());
            let copied = self
                .qp
                .recv_buffer()
                .read_at(slot * self.slot_len + GRH_LEN, &mut buf[..n]);
            if take == Take::Keep {
                copied?;
                return Ok(Some((n, from)));
            }
            slots.ready.pop_front();
            self.repost(slot);
            copied?;
            if len > n {
                Counters::add(&self.shared.counters.truncated, 1);
            }
            return Ok(Some((n, from)));
        }
        Ok(None)
    }

    fn repost(&self, slot: usize) {
        let posted = self
            .qp
            .post_recv(slot as u64, slot * self.slot_len, self.slot_len);
        if let Err(e) = posted {
            tracing::debug!(error = %e, "reposting a datagram receive failed");
            self.recv.error().set(e);
        }
    }

    /// A receive completed: queue its datagram, or count it malformed and post the slot again.
    fn reap_recv(&self, slots: &mut RecvSlots, wc: &WorkCompletion) {
        if wc.status == WcStatus::FLUSH {
            // The queue pair is being destroyed.
            return;
        }
        let slot = wc.wr_id as usize;
        match self.classify(wc) {
            Some(received) => slots.ready.push_back(received),
            None => {
                Counters::add(&self.shared.counters.malformed, 1);
                if slot < self.recv_depth {
                    self.repost(slot);
                }
            }
        }
    }

    /// Checks a receive completion and attributes its datagram; `None` for one to discard.
    fn classify(&self, wc: &WorkCompletion) -> Option<ArrivedDatagram> {
        let slot = wc.wr_id as usize;
        let byte_len = wc.byte_len as usize;
        if !wc.status.is_success() {
            tracing::debug!(status = %wc.status.describe(), "datagram receive failed");
            return None;
        }
        // The device reports the GRH area plus the payload; both must fit the posted slot.
        if slot >= self.recv_depth || !(GRH_LEN..=self.slot_len).contains(&byte_len) {
            return None;
        }
        let mut header = [0u8; GRH_LEN];
        self.qp
            .recv_buffer()
            .read_at(slot * self.slot_len, &mut header)
            .ok()?;
        let addrs = grh::parse(&header)?;
        let multicast = addrs.dst.is_multicast();
        let who = self
            .shared
            .sources()
            .attribute(addrs.src, wc.src_qp, wc.imm_data, multicast);
        Counters::add(&self.shared.counters.dropped, u64::from(who.missed));
        Counters::add(&self.shared.counters.received, 1);
        if !multicast {
            self.learn_reply_route(who.from, who.sequenced, wc, &header);
        }
        Some(ArrivedDatagram {
            slot,
            len: byte_len - GRH_LEN,
            from: who.from,
        })
    }
}
