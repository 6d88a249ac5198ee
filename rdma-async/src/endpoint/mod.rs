//! `Endpoint`: messages over a reliable connected queue pair established through rdma_cm.
//!
//! Each `send` copies the message into a slot of a registered send buffer and posts it; each
//! received message is copied out of a registered receive slot, which is then posted again. The
//! endpoint owns all registered memory and destroys its queue pair before freeing it, so every
//! future may be dropped at any point without the device touching freed memory.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use tokio::net::ToSocketAddrs;

use crate::cm::ConnectRequest;
use crate::cm::handshake;
use crate::cm::link::CmLink;
use crate::error;
use crate::reactor::FdWaiter;
use crate::reactor::{AsyncCq, wc_error};
use crate::verbs::{
    Access, CmId, CompletionChannel, CompletionQueue, Opcode, Payload, ProtectionDomain, QpCaps,
    QueuePair, RegisteredBuffer, Segment, WcStatus, WorkCompletion, WorkRequest,
};

mod options;

pub use options::EndpointOptions;

const SEND_BUFFER: usize = 0;
const RECV_BUFFER: usize = 1;

#[derive(Debug)]
struct SendState {
    free_slots: Vec<usize>,
    error: Option<(io::ErrorKind, String)>,
}

#[derive(Debug)]
struct RecvState {
    ready: VecDeque<Bytes>,
    error: Option<(io::ErrorKind, String)>,
}

/// A connected RDMA endpoint that exchanges messages (`IBV_WR_SEND` / posted receives).
///
/// Messages keep their boundaries: each `send` arrives as one `recv`. It interoperates with any
/// librdmacm program that exchanges send/receive messages over `RDMA_PS_TCP` (such as
/// `ucmatose`). Dropping the endpoint disconnects.
#[derive(Debug)]
pub struct Endpoint {
    // Drop order matters: disconnect, then destroy the queue pair, then free its buffers and CQs.
    link: CmLink,
    qp: QueuePair,
    send_cq: AsyncCq,
    send_waiter: FdWaiter,
    recv_cq: AsyncCq,
    recv_waiter: FdWaiter,
    send: tokio::sync::Mutex<SendState>,
    recv: tokio::sync::Mutex<RecvState>,
    max_message_size: usize,
    send_depth: usize,
    /// The inline limit the queue pair really got.
    max_inline: usize,
}

/// What `build` creates between route resolution and connect/accept.
struct EndpointParts {
    qp: QueuePair,
    send_cq: AsyncCq,
    send_waiter: FdWaiter,
    recv_cq: AsyncCq,
    recv_waiter: FdWaiter,
}

fn build(id: &Arc<CmId>, opts: &EndpointOptions) -> io::Result<EndpointParts> {
    let max = opts.max_message_size;
    let pd = Arc::new(ProtectionDomain::new(id.clone())?);
    let send_cq = Arc::new(CompletionQueue::new(
        Arc::new(CompletionChannel::new(id.clone())?),
        opts.send_depth,
    )?);
    let recv_cq = Arc::new(CompletionQueue::new(
        Arc::new(CompletionChannel::new(id.clone())?),
        opts.recv_depth,
    )?);
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
    let qp = QueuePair::new(
        pd,
        send_cq.clone(),
        recv_cq.clone(),
        caps,
        vec![send_buf, recv_buf],
    )?;
    // Receives are posted before the handshake, so the peer may send as soon as it is connected.
    for slot in 0..opts.recv_depth as usize {
        qp.post_recv(
            slot as u64,
            Some(Segment {
                buffer: RECV_BUFFER,
                offset: slot * max,
                len: max,
            }),
        )?;
    }
    let send_cq = AsyncCq::new(send_cq, opts.busy_poll);
    let recv_cq = AsyncCq::new(recv_cq, opts.busy_poll);
    Ok(EndpointParts {
        qp,
        send_waiter: send_cq.waiter()?,
        recv_waiter: recv_cq.waiter()?,
        send_cq,
        recv_cq,
    })
}

impl Endpoint {
    /// Connects to `addr`, trying each resolved address in turn and returning the last error,
    /// like `TcpStream::connect`.
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
            |parts, link| Ok(Self::assemble(parts, link, options)),
        )
        .await
    }

    /// Accepts `request` and returns once the connection is established.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` when the peer gives up during the handshake; `InvalidInput` for bad
    /// options or oversized private data; verbs errors creating the queue pair.
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
            &options.dial.id,
            &options.params,
            |id| Ok((build(id, options)?, None)),
            |parts, link| Ok(Self::assemble(parts, link, options)),
        )
        .await
    }

    fn assemble(parts: EndpointParts, link: CmLink, options: &EndpointOptions) -> Endpoint {
        let max = options.max_message_size;
        let max_inline = parts.qp.max_inline_data() as usize;
        Endpoint {
            link,
            qp: parts.qp,
            send_cq: parts.send_cq,
            send_waiter: parts.send_waiter,
            recv_cq: parts.recv_cq,
            recv_waiter: parts.recv_waiter,
            send: tokio::sync::Mutex::new(SendState {
                free_slots: (0..options.send_depth as usize).rev().collect(),
                error: None,
            }),
            recv: tokio::sync::Mutex::new(RecvState {
                ready: VecDeque::new(),
                error: None,
            }),
            max_message_size: max,
            send_depth: options.send_depth as usize,
            max_inline,
        }
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
        let mut state = self.send.lock().await;
        let mut wcs = [WorkCompletion::EMPTY; 16];
        loop {
            if let Some((kind, msg)) = &state.error {
                return Err(io::Error::new(*kind, msg.clone()));
            }
            if self.link.poll_closed()? {
                return Err(self.link.closed_error(true));
            }
            let n = self.send_cq.try_poll(&mut wcs)?;
            self.reap_sends(&mut state, &wcs[..n]);
            if n > 0 {
                continue;
            }
            if let Some(slot) = state.free_slots.pop() {
                let offset = slot * self.max_message_size;
                if msg.len() > self.max_inline {
                    self.qp.buffer(SEND_BUFFER).write_at(offset, msg)?;
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
                    signaled: true,
                };
                if let Err(e) = self.qp.post(&req) {
                    state.free_slots.push(slot);
                    return Err(e);
                }
                return Ok(());
            }
            let n = self
                .completions_or_closed(&self.send_cq, &self.send_waiter, &mut wcs)
                .await?;
            self.reap_sends(&mut state, &wcs[..n]);
        }
    }

    /// Waits for completions on `cq` or for the connection to close (then returns 0).
    async fn completions_or_closed(
        &self,
        cq: &AsyncCq,
        waiter: &FdWaiter,
        wcs: &mut [WorkCompletion],
    ) -> io::Result<usize> {
        tokio::select! {
            biased;
            n = cq.completions(waiter, wcs) => n,
            closed = self.link.closed() => closed.map(|()| 0),
        }
    }

    fn reap_sends(&self, state: &mut SendState, wcs: &[WorkCompletion]) {
        for wc in wcs {
            state.free_slots.push(wc.wr_id as usize);
            if !wc.status.is_success() && state.error.is_none() {
                let err = wc_error(wc, self.peer_addr(), true);
                tracing::debug!(parent: self.link.span(), error = %err, "send failed");
                state.error = Some((err.kind(), err.to_string()));
            }
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
        let mut state = self.recv.lock().await;
        let mut wcs = [WorkCompletion::EMPTY; 16];
        loop {
            if let Some(msg) = state.ready.pop_front() {
                return Ok(msg);
            }
            if let Some((kind, msg)) = &state.error {
                return Err(io::Error::new(*kind, msg.clone()));
            }
            let n = self.recv_cq.try_poll(&mut wcs)?;
            if n > 0 {
                self.reap_recvs(&mut state, &wcs[..n]);
                continue;
            }
            if self.link.poll_closed()? {
                // Messages that completed before the disconnect were taken above.
                return Err(self.link.closed_error(false));
            }
            let n = self
                .completions_or_closed(&self.recv_cq, &self.recv_waiter, &mut wcs)
                .await?;
            self.reap_recvs(&mut state, &wcs[..n]);
        }
    }

    fn reap_recvs(&self, state: &mut RecvState, wcs: &[WorkCompletion]) {
        let max = self.max_message_size;
        for wc in wcs {
            let slot = wc.wr_id as usize;
            if wc.status == WcStatus::FLUSH {
                // The queue pair is in the error state: the disconnect (or an earlier error)
                // is what to report.
                continue;
            }
            if !wc.status.is_success() {
                let err = wc_error(wc, self.peer_addr(), false);
                tracing::debug!(parent: self.link.span(), error = %err, "receive failed");
                state.error.get_or_insert((err.kind(), err.to_string()));
                continue;
            }
            // The device wrote at most the posted length; check the reported length anyway.
            let len = (wc.byte_len as usize).min(max);
            let mut msg = vec![0; len];
            if let Err(e) = self.qp.buffer(RECV_BUFFER).read_at(slot * max, &mut msg) {
                state.error.get_or_insert((e.kind(), e.to_string()));
                continue;
            }
            state.ready.push_back(Bytes::from(msg));
            let segment = Segment {
                buffer: RECV_BUFFER,
                offset: slot * max,
                len: max,
            };
            if let Err(e) = self.qp.post_recv(wc.wr_id, Some(segment))
                && !self.link.is_disconnected()
            {
                state.error.get_or_insert((e.kind(), e.to_string()));
            }
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
    /// flush messages the peer was about to receive.
    async fn flush_sends(&self) {
        let mut state = self.send.lock().await;
        let mut wcs = [WorkCompletion::EMPTY; 16];
        while state.free_slots.len() < self.send_depth && state.error.is_none() {
            if self.link.is_disconnected() {
                return;
            }
            match self
                .completions_or_closed(&self.send_cq, &self.send_waiter, &mut wcs)
                .await
            {
                Ok(n) => self.reap_sends(&mut state, &wcs[..n]),
                Err(_) => return,
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
