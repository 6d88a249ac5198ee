//! Sending: [`RDatagram::send_to`] and its relatives, each datagram written into a free send
//! slot of the socket's buffer and posted to the route of its destination.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::ToSocketAddrs;

use super::{RDatagram, lock};
use crate::cm::Slots;
use crate::cm::resolve::{each_addr, resolve};
use crate::datagram::address_handles::CountedHandle;
use crate::datagram::peers::Route;
use crate::datagram::stats::Counters;
use crate::error;
use crate::verbs::{UdSend, WcStatus, WorkCompletion};

/// Send slots; each holds the address handle its send names until the send completes.
type SendSlots = Slots<(), Arc<CountedHandle>>;

impl RDatagram {
    /// Sends one datagram to `target` (the first address it resolves to) and returns its
    /// length once the device has it. The first datagram to a new peer resolves the peer
    /// through rdma_cm; the route is cached. Multicast groups must be joined first
    /// ([`Self::join_multicast`]); their port is ignored.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when `buf` exceeds [`Self::max_datagram`] (checked before anything is
    /// posted) or the address family differs from the socket's; `ConnectionRefused` when no
    /// datagram socket is bound at `target`; `TimedOut` when the peer does not answer;
    /// `NotConnected` for a multicast group not joined.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, the datagram was not sent (a
    /// route being resolved may still be cached).
    pub async fn send_to<A: ToSocketAddrs>(&self, buf: &[u8], target: A) -> io::Result<usize> {
        self.check_alive()?;
        self.check_len(buf.len())?;
        let target = first_addr(target).await?;
        let route = self.route_to(target).await?;
        self.send_on(&route, buf).await
    }

    /// Sends to `target` if it can be done at once: the route is cached and a send slot free.
    ///
    /// # Errors
    ///
    /// `WouldBlock` when every send slot is in flight (wait with [`Self::writable`]);
    /// `NotConnected` when no route to `target` is cached yet ([`Self::send_to`] or
    /// [`Self::connect`] make it; a peer that sent to us included: its datagram only gives the
    /// way back, made into a route by the first `send_to`); otherwise as [`Self::send_to`].
    pub fn try_send_to(&self, buf: &[u8], target: SocketAddr) -> io::Result<usize> {
        self.check_len(buf.len())?;
        let route = self.cached_route(target)?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                format!("no route to {target} is cached yet: send_to or connect resolves it"),
            )
        })?;
        let mut slots = self.send.try_lock()?;
        self.send
            .reap_queued(&mut slots, &mut |s, wc| self.reap_send(s, wc))?;
        match slots.free.pop() {
            Some(slot) => self.post_in_slot(&mut slots, slot, &route, buf),
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }

    /// Sets the default peer for [`Self::send`] and [`Self::recv`], resolving it now (so
    /// errors show here). Receives then return only datagrams from that peer; others are
    /// discarded and counted as `filtered`.
    ///
    /// # Errors
    ///
    /// As [`Self::send_to`]'s resolution.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the peer is set only when this returns `Ok`.
    pub async fn connect<A: ToSocketAddrs>(&self, addr: A) -> io::Result<()> {
        each_addr(addr, |addr| async move {
            self.route_to(addr).await?;
            *lock(&self.peer) = Some(addr);
            Ok(())
        })
        .await
    }

    /// Sends to the connected peer.
    ///
    /// # Errors
    ///
    /// `NotConnected` without [`Self::connect`]; otherwise as [`Self::send_to`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::send_to`].
    pub async fn send(&self, buf: &[u8]) -> io::Result<usize> {
        self.check_alive()?;
        self.check_len(buf.len())?;
        let peer = self.peer_addr()?;
        let route = self.route_to(peer).await?;
        self.send_on(&route, buf).await
    }

    /// Sends to the connected peer if it can be done at once (a send slot is free).
    ///
    /// # Errors
    ///
    /// `NotConnected` without [`Self::connect`]; `WouldBlock` when every send slot is in
    /// flight (wait with [`Self::writable`]); otherwise as [`Self::try_send_to`].
    pub fn try_send(&self, buf: &[u8]) -> io::Result<usize> {
        self.try_send_to(buf, self.peer_addr()?)
    }

    /// Waits until a send slot is free (a datagram to a cached route can go at once).
    ///
    /// # Errors
    ///
    /// Errors of polling the completion queue.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn writable(&self) -> io::Result<()> {
        let mut slots = self.send.lock().await;
        while slots.free.is_empty() {
            self.send
                .reap_next(&mut slots, None, &mut |s, wc| self.reap_send(s, wc))
                .await?;
        }
        Ok(())
    }

    fn check_len(&self, len: usize) -> io::Result<()> {
        if len > self.max_datagram {
            return Err(error::invalid_input(format!(
                "datagram of {len} bytes exceeds the {} bytes one RDMA datagram can carry on \
                 this path (the port's MTU)",
                self.max_datagram
            )));
        }
        Ok(())
    }

    async fn send_on(&self, route: &Arc<Route>, buf: &[u8]) -> io::Result<usize> {
        let mut slots = self.send.lock().await;
        let slot = self
            .send
            .take_free(&mut slots, None, &mut |s, wc| self.reap_send(s, wc))
            .await?;
        self.post_in_slot(&mut slots, slot, route, buf)
    }

    fn post_in_slot(
        &self,
        slots: &mut SendSlots,
        slot: usize,
        route: &Arc<Route>,
        buf: &[u8],
    ) -> io::Result<usize> {
        let offset = slot * self.max_datagram;
        let posted = self.qp.send_buffer().write_at(offset, buf).and_then(|()| {
            self.qp.post_send(&UdSend {
                wr_id: slot as u64,
                offset,
                len: buf.len(),
                ah: &route.ah,
                remote_qpn: route.qpn,
                remote_qkey: route.qkey,
                imm: route.next_imm(self.qp.qp_num()),
            })
        });
        if let Err(e) = posted {
            slots.free.push(slot);
            return Err(e);
        }
        if let Some(hold) = slots.held.get_mut(slot) {
            *hold = Some(route.ah.clone());
        }
        Counters::add(&self.shared.counters.sent, 1);
        Ok(buf.len())
    }

    /// A send completed: its slot is free again (a lost datagram is no error).
    fn reap_send(&self, slots: &mut SendSlots, wc: &WorkCompletion) {
        slots.release(wc.wr_id as usize);
        if !wc.status.is_success() && wc.status != WcStatus::FLUSH {
            tracing::debug!(status = %wc.status.describe(), "datagram send failed");
            Counters::add(&self.shared.counters.send_errors, 1);
        }
    }
}

async fn first_addr<A: ToSocketAddrs>(target: A) -> io::Result<SocketAddr> {
    resolve(target)
        .await?
        .into_iter()
        .next()
        .ok_or_else(|| error::invalid_input("no address to send to"))
}
