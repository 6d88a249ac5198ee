//! `Endpoint`: messages over a reliable connected queue pair established through rdma_cm.
//!
//! Each `send` copies the message into a slot of a registered send buffer and posts it; each
//! received message is copied out of a registered receive slot, which is then posted again. The
//! endpoint owns all registered memory and destroys its queue pair before freeing it, so every
//! future may be dropped at any point without the device touching freed memory.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::net::ToSocketAddrs;

use crate::cm::ConnectRequest;
use crate::cm::handshake;
use crate::cm::link::CmLink;
use crate::cm::{SlotQueue, Slots};
use crate::error::{self, wc_error};
use crate::reactor::AsyncCq;
use crate::verbs::{
    Access, CmId, Opcode, OwnedBufferQueuePair, Payload, QpCaps, RegisteredBuffer, Segment,
    WcStatus, WorkCompletion, WorkRequest,
};

mod lent;
mod options;

use lent::{SentRegion, post_receive};
pub use options::EndpointOptions;

const SEND_BUFFER: usize = 0;
const RECV_BUFFER: usize = 1;

/// The send slots: a region's send holds its lend id, and the region comes back as ready.
type SendSlots = Slots<SentRegion, u64>;
/// The receive slots: one posted in a pool buffer holds its lend id.
type RecvSlots = Slots<Bytes, u64>;

/// A connected RDMA endpoint that exchanges messages (`IBV_WR_SEND` / posted receives).
///
/// Messages keep their boundaries: each `send` arrives as one `recv`. It interoperates with any
/// librdmacm program that exchanges send/receive messages over `RDMA_PS_TCP` (such as
/// `ucmatose`). Dropping the endpoint disconnects.
///
/// # What `Ok` from `send` promises
///
/// That the message was handed to the device, as a socket write's `Ok` does: not that it
/// arrived. Messages still in flight when the endpoint is dropped (or its process ends) may be
/// lost, and the peer's `recv` then ends with an error, not with silence. To close without
/// losing any, call [`Self::disconnect`], which waits until every posted send completed (the
/// peer's device has acknowledged it) before disconnecting; to know the peer's application
/// has a message, have it answer. ([`crate::rdma::RdmaConnection`]'s operations return only
/// once their completion arrived: their `Ok` is the acknowledgement.)
#[derive(Debug)]
pub struct Endpoint {
    // Drop order matters: disconnect, then destroy the queue pair, then free its buffers and CQs.
    link: CmLink,
    qp: OwnedBufferQueuePair,
    /// Slots of the send buffer; a slot is free again when its send completed. A slot that
    /// sends from a caller's region holds its lend id; the region comes back through `ready`.
    send: SlotQueue<SentRegion, u64>,
    /// Receive slots, all posted; what arrived waits in `ready`. A slot posted in a pool
    /// buffer holds its lend id, else it is the slot of the receive buffer with its number.
    recv: SlotQueue<Bytes, u64>,
    /// Where receives land without a copy ([`EndpointOptions::recv_pool`]).
    recv_pool: Option<crate::device::BufferPool>,
    /// Regions of `send_region` calls dropped before their completion: freed when it comes.
    abandoned: std::sync::Mutex<std::collections::HashSet<u64>>,
    max_message_size: usize,
    /// The inline limit the queue pair really got.
    max_inline: usize,
    /// How often a waiting `recv` probes the peer ([`EndpointOptions::keepalive`]).
    keepalive: Option<Duration>,
    /// Every how many sends one asks for a completion ([`crate::reactor::SendOrder::signal`]).
    signal_interval: usize,
    /// Send completions reaped, for the test hook that checks how few sends are signaled.
    #[cfg(feature = "test-hooks")]
    send_completions: std::sync::atomic::AtomicU64,
}

/// Every how many sends one is signaled, for a send queue `depth` deep: a quarter of the
/// queue, so that slots come back while the rest is still in flight, and at most 16 (as
/// `RStream`'s data writes), beyond which fewer completions save next to nothing.
fn signal_interval(depth: u32) -> usize {
    (depth as usize / 4).clamp(1, 16)
}

/// The work request of a probe: a 0-byte RDMA write to address 0 with rkey 0, as rsockets'
/// keepalive, which the peer's device acknowledges without touching memory (no key is checked
/// for 0 bytes) and its application never sees.
fn empty_write(slot: usize) -> WorkRequest<'static> {
    WorkRequest {
        wr_id: slot as u64,
        opcode: Opcode::Write {
            remote_addr: 0,
            rkey: 0,
            imm: None,
        },
        payload: Payload::Empty,
        signaled: true,
    }
}

/// What `build` creates between route resolution and connect/accept.
struct EndpointParts {
    qp: OwnedBufferQueuePair,
    send_cq: AsyncCq,
    recv_cq: AsyncCq,
    /// The lend id of each receive slot posted in a pool buffer.
    recv_lent: Vec<Option<u64>>,
}

fn build(id: &Arc<CmId>, opts: &EndpointOptions) -> io::Result<EndpointParts> {
    let max = opts.max_message_size;
    let pd = opts.dial.context_for(id)?.pd().clone();
    let async_send_cq = AsyncCq::create(id, opts.send_depth, opts.busy_poll)?;
    let async_recv_cq = AsyncCq::create(id, opts.recv_depth, opts.busy_poll)?;
    let (send_cq, recv_cq) = (async_send_cq.queue(), async_recv_cq.queue());
    let send_buf = RegisteredBuffer::new(
        pd.clone(),
        max * opts.send_depth as usize,
        Access::default(),
    )?;
    let recv_buf = RegisteredBuffer::new(
        pd.clone(),
        max * opts.recv_depth as usize,
        Access::default(),
    )?;
    let caps = QpCaps {
        max_send_wr: opts.send_depth,
        max_recv_wr: opts.recv_depth,
        max_inline_data: opts.max_inline,
        max_send_sge: 1,
    };
    let qp = OwnedBufferQueuePair::new(
        id.clone(),
        pd,
        send_cq.clone(),
        recv_cq.clone(),
        caps,
        vec![send_buf, recv_buf],
        Vec::new(),
    )?;
    // Receives are posted before the handshake, so the peer may send as soon as it is connected.
    let recv_lent = (0..opts.recv_depth as usize)
        .map(|slot| post_receive(&qp, opts.recv_pool.as_ref(), slot, max))
        .collect::<io::Result<_>>()?;
    Ok(EndpointParts {
        qp,
        send_cq: async_send_cq,
        recv_cq: async_recv_cq,
        recv_lent,
    })
}

impl Endpoint {
    /// Connects to `addr`, trying each resolved address in turn and returning the last error,
    /// like `TcpStream::connect`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::endpoint::{Endpoint, EndpointOptions};
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let endpoint = Endpoint::connect("10.77.0.1:7471", &EndpointOptions::new()).await?;
    ///     // Each send arrives as one message.
    ///     endpoint.send(b"ping").await?;
    ///     let reply = endpoint.recv().await?;
    ///     println!("{} bytes back", reply.len());
    ///     endpoint.disconnect().await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// `NotFound` when this machine has no RDMA device; `ConnectionRefused` when nothing listens
    /// or the peer rejects (the [`crate::cm::CmError`] inside carries the peer's private data);
    /// `TimedOut` when the peer does not answer or `connect_timeout` passes; the resolver's error
    /// when a name does not resolve; `InvalidInput` for bad options.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the half-built connection (queue pair, memory,
    /// rdma_cm id); the peer sees the attempt fail.
    pub async fn connect<A: ToSocketAddrs>(
        addr: A,
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        options.check()?;
        handshake::connect(
            addr,
            &options.dial,
            &options.params,
            |id| Ok((build(id, options)?, None)),
            |parts, link| Self::assemble(parts, link, options),
        )
        .await
    }

    /// Accepts `request` and returns once the connection is established.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` when the peer gives up during the handshake; `TimedOut` (the request
    /// rejected) when the peer does not complete it within the options' `accept_timeout`;
    /// `InvalidInput` for bad options or oversized private data; verbs errors creating the
    /// queue pair.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything created for the connection.
    pub async fn accept(
        request: ConnectRequest,
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        options.check()?;
        handshake::accept(
            request,
            &options.dial,
            &options.params,
            |id| Ok((build(id, options)?, None)),
            |parts, link| Self::assemble(parts, link, options),
        )
        .await
    }

    fn assemble(
        parts: EndpointParts,
        link: CmLink,
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        let max_inline = parts.qp.max_inline_data() as usize;
        let recv = SlotQueue::new(parts.recv_cq, options.recv_depth as usize, Some(&link))?;
        recv.try_lock()?.held = parts.recv_lent;
        Ok(Endpoint {
            send: SlotQueue::new(parts.send_cq, options.send_depth as usize, Some(&link))?,
            recv,
            recv_pool: options.recv_pool.clone(),
            abandoned: Default::default(),
            link,
            qp: parts.qp,
            max_message_size: options.max_message_size,
            max_inline,
            keepalive: options.keepalive,
            signal_interval: signal_interval(options.send_depth),
            #[cfg(feature = "test-hooks")]
            send_completions: Default::default(),
        })
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.link.peer_addr()
    }

    /// The local address of the connection.
    pub fn local_addr(&self) -> SocketAddr {
        self.link.local_addr()
    }

    /// Private data the peer sent in the handshake (its accept, or its request), zero-padded by
    /// IB/RoCE to the transport's size.
    pub fn peer_private_data(&self) -> &[u8] {
        self.link.peer_private_data()
    }

    /// The largest message this endpoint sends or receives.
    pub fn max_message_size(&self) -> usize {
        self.max_message_size
    }

    /// The local queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.qp.qp_num()
    }

    /// Test hook: how many send completions this endpoint has reaped (only some sends are
    /// signaled).
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __send_completions(&self) -> u64 {
        self.send_completions
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Test hook: the ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an
    /// id option reached it.
    ///
    /// # Errors
    ///
    /// The error of `ibv_query_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __ack_timeout(&self) -> io::Result<u8> {
        self.link.qp_ack_timeout()
    }

    /// Test hook: the RNR timer of the queue pair (`ibv_query_qp`), to check that
    /// `ConnParams::min_rnr_timer` reached it.
    ///
    /// # Errors
    ///
    /// The error of `ibv_query_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __min_rnr_timer(&self) -> io::Result<u8> {
        self.link.qp_min_rnr_timer()
    }

    /// Test hook: sets the RNR timer of the queue pair as the handshake does, which must also
    /// succeed once the queue pair failed (a peer may fail it before the handshake sets it).
    ///
    /// # Errors
    ///
    /// The error of `ibv_modify_qp` on a queue pair that has not failed.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __set_min_rnr_timer(&self, code: u8) -> io::Result<()> {
        self.link.set_qp_min_rnr_timer(code)
    }

    /// Test hook: the next receive this endpoint posts fails (as `ibv_post_recv` returning
    /// `ENOMEM`), to check that such a failure ends the connection with that cause.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __fail_next_post_recv(&self) {
        self.qp.fail_next_post_recv();
    }

    /// Test hook: this end goes silent without telling the peer (its queue pair moves to the
    /// error state, no rdma_cm disconnect is sent), so the peer sees a host that vanished.
    ///
    /// # Errors
    ///
    /// The error of `ibv_modify_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __vanish(&self) -> io::Result<()> {
        self.qp.set_error()
    }

    /// Sends one message. Returns once it is handed to the device (like a socket write); waits
    /// only when `send_depth` sends are still in flight.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the message is longer than `max_message_size`; `BrokenPipe` once the
    /// connection is closed; `TimedOut` when the transport gave up reaching the peer.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped before it completes, the message was not sent.
    pub async fn send(&self, msg: &[u8]) -> io::Result<()> {
        if msg.len() > self.max_message_size {
            return Err(error::invalid_input(format!(
                "message of {} bytes exceeds the endpoint's max_message_size of {}",
                msg.len(),
                self.max_message_size
            )));
        }
        let mut slots = self.send.lock().await;
        let slot = self
            .send
            .take_free(&mut slots, Some(&self.link), &mut |s, wc| {
                self.reap_send(s, wc)
            })
            .await?;
        let offset = slot * self.max_message_size;
        if msg.len() > self.max_inline
            && let Err(e) = self.qp.buffer(SEND_BUFFER).write_at(offset, msg)
        {
            slots.free.push(slot);
            return Err(e);
        }
        let segment = [Segment {
            buffer: SEND_BUFFER,
            offset,
            len: msg.len(),
        }];
        let payload = if msg.len() <= self.max_inline && !msg.is_empty() {
            Payload::Inline(msg)
        } else if msg.is_empty() {
            Payload::Empty
        } else {
            Payload::Segments(&segment)
        };
        let req = WorkRequest {
            wr_id: slot as u64,
            opcode: Opcode::Send { imm: None },
            payload,
            signaled: false,
        };
        self.post_send(&mut slots, slot, req, false)
    }

    /// Posts `req` from send slot `slot` (just taken from the free ones), signaled when `must`
    /// be or when [`crate::reactor::SendOrder::signal`] says; a failed post frees the slot again.
    fn post_send(
        &self,
        slots: &mut SendSlots,
        slot: usize,
        mut req: WorkRequest<'_>,
        must: bool,
    ) -> io::Result<()> {
        req.signaled = slots
            .order
            .signal(must, self.signal_interval, slots.free.len());
        if let Err(e) = self.qp.post(&req) {
            slots.free.push(slot);
            return Err(e);
        }
        slots.order.posted(slot, req.signaled);
        Ok(())
    }

    /// A send completed: its slot, and those of the sends posted before it (an RC send queue
    /// completes in order, so they are done and succeeded: a failed one completes on its own,
    /// first), are free again, and a region one of them sent from comes back; the first
    /// failure ends the connection.
    fn reap_send(&self, slots: &mut SendSlots, wc: &WorkCompletion) {
        let slot = wc.wr_id as usize;
        #[cfg(feature = "test-hooks")]
        self.send_completions
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let mut order = std::mem::take(&mut slots.order);
        for done in order.complete(slot) {
            let lent = slots.held.get_mut(done).and_then(Option::take);
            slots.release(done);
            if let Some(id) = lent {
                self.region_sent(slots, id, done != slot || wc.status.is_success());
            }
        }
        slots.order = order;
        if !wc.status.is_success() && !self.send.error().is_set() {
            let err = wc_error(wc, self.peer_addr(), true);
            tracing::debug!(parent: self.link.span(), error = %err, "send failed");
            self.send.error().set(err);
        }
    }

    /// Receives the next message.
    ///
    /// # Errors
    ///
    /// `ConnectionReset` once the peer disconnected and every message it sent before was
    /// received; `NotConnected` after [`Self::disconnect`]; `TimedOut` or other kinds when the
    /// transport failed.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a message is only taken when it is returned; one that arrived while the
    /// future was pending waits for the next call.
    pub async fn recv(&self) -> io::Result<Bytes> {
        let mut slots = self.recv.lock().await;
        let mut probes = self
            .keepalive
            .map(|t| tokio::time::interval_at(tokio::time::Instant::now() + t, t));
        let reap = &mut |s: &mut RecvSlots, wc: &WorkCompletion| self.reap_recv(s, wc);
        loop {
            let fill = self.recv.fill(&mut slots, Some(&self.link), reap);
            match &mut probes {
                None => break fill.await?,
                // `fill` is cancel safe: a probe restarts it without losing anything.
                Some(probes) => tokio::select! {
                    filled = fill => break filled?,
                    _ = probes.tick() => self.probe(),
                },
            }
        }
        // Messages that completed before a disconnect are taken before it is reported.
        Ok(slots.ready.pop_front().unwrap_or_default())
    }

    /// Posts a keepalive (a 0-byte RDMA write, to address 0 with rkey 0 as rsockets does) from a
    /// free send slot. A dead peer fails it, which moves the queue pair to the error state; the
    /// flushed receives then report that failure ([`Self::send_failure`]). With every slot in
    /// flight there is nothing to do: those sends notice a dead peer themselves.
    fn probe(&self) {
        let Ok(mut slots) = self.send.try_lock() else {
            return;
        };
        let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
        if self.send.reap_queued(&mut slots, reap).is_err() || self.send.error().is_set() {
            return;
        }
        let Some(slot) = slots.free.pop() else {
            return;
        };
        if let Err(e) = self.post_send(&mut slots, slot, empty_write(slot), true) {
            tracing::debug!(parent: self.link.span(), error = %e, "posting a keepalive failed");
        }
    }

    /// The send side's failure, reaping what already completed there (when no sender is busy
    /// with it): why the receives were flushed, if a send (or a keepalive) failed.
    fn send_failure(&self) -> Option<io::Error> {
        if let Ok(mut slots) = self.send.try_lock() {
            let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
            let _ = self.send.reap_queued(&mut slots, reap);
        }
        self.send.error().report()
    }

    /// A receive completed: take the message (the pool buffer it landed in, or a copy out of
    /// the receive buffer) and post the slot again.
    fn reap_recv(&self, slots: &mut RecvSlots, wc: &WorkCompletion) {
        let max = self.max_message_size;
        let slot = wc.wr_id as usize;
        // The completion was polled: the device is done with a lent buffer, whatever the status.
        let lent = slots
            .held
            .get_mut(slot)
            .and_then(Option::take)
            .and_then(|id| self.qp.reclaim(id));
        if wc.status == WcStatus::FLUSH {
            // The queue pair is in the error state: after a disconnect the link reports it;
            // after a failed send (the peer timed out) nothing else would, so take its cause.
            if let Some(e) = self.send_failure() {
                self.recv.error().set(e);
            }
            return;
        }
        if !wc.status.is_success() {
            let err = wc_error(wc, self.peer_addr(), false);
            tracing::debug!(parent: self.link.span(), error = %err, "receive failed");
            self.recv.error().set(err);
            return;
        }
        // The device wrote at most the posted length; check the reported length anyway.
        let len = (wc.byte_len as usize).min(max);
        let msg = match lent {
            Some(buffer) => lent::received(buffer, len),
            None => {
                // Copied straight into the new buffer, not zeroed first.
                let mut msg = Vec::with_capacity(len);
                if let Err(e) = self
                    .qp
                    .buffer(RECV_BUFFER)
                    .append_to(slot * max, len, &mut msg)
                {
                    self.recv.error().set(e);
                    return;
                }
                Bytes::from(msg)
            }
        };
        slots.ready.push_back(msg);
        match post_receive(&self.qp, self.recv_pool.as_ref(), slot, max) {
            Ok(held) => {
                if let Some(entry) = slots.held.get_mut(slot) {
                    *entry = held;
                }
            }
            Err(e) if !self.link.is_disconnected() => {
                // One receive fewer would fail one of the peer's later sends (receiver not
                // ready) and leave the endpoint's books wrong: end the connection, with this
                // cause. The rest of the batch is still reaped, so what arrived stays readable
                // first.
                tracing::warn!(parent: self.link.span(), error = %e, "posting a receive again failed; closing the connection");
                self.send
                    .error()
                    .set(io::Error::new(e.kind(), e.to_string()));
                self.recv.error().set(e);
                let _ = self.link.disconnect();
            }
            Err(_) => {}
        }
    }

    /// Waits for posted sends to complete, then disconnects: the peer's receives end with
    /// `ConnectionReset` after the messages sent before. Like closing a socket, this does not wait
    /// for the peer: rdma_cm confirms the disconnect only once the peer's application handles
    /// it, which [`Self::closed`] waits for. Further sends fail with `BrokenPipe`; messages
    /// already received can still be read.
    ///
    /// # Errors
    ///
    /// The OS error of `rdma_disconnect`.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if dropped while sends are still completing, no disconnect was started (and
    /// dropping the endpoint disconnects at once).
    pub async fn disconnect(&self) -> io::Result<()> {
        self.flush_sends().await;
        self.link.disconnect()
    }

    /// Waits until every posted send completed (or failed), so an orderly disconnect does not
    /// flush messages the peer was about to receive. Sends posted after the last signaled one
    /// complete with no word: a signaled empty write behind them ([`empty_write`]) reports them.
    async fn flush_sends(&self) {
        let mut slots = self.send.lock().await;
        while slots.free.len() < slots.depth() && !self.send.error().is_set() {
            if self.link.is_disconnected() {
                return;
            }
            // With no slot free the last send took the last one, and was signaled.
            if slots.order.ends_unsignaled()
                && let Some(slot) = slots.free.pop()
                && self
                    .post_send(&mut slots, slot, empty_write(slot), true)
                    .is_err()
            {
                return;
            }
            let reap = &mut |s: &mut SendSlots, wc: &WorkCompletion| self.reap_send(s, wc);
            if self
                .send
                .reap_next(&mut slots, Some(&self.link), reap)
                .await
                .is_err()
            {
                return;
            }
        }
    }

    /// Waits until the connection is closed by either side.
    ///
    /// # Errors
    ///
    /// The OS error of reading the event channel.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn closed(&self) -> io::Result<()> {
        self.link.closed().await
    }
}
