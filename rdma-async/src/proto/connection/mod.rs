//! One side of an rsockets stream: the state machine the driver feeds with completions and
//! application calls, and asks for work requests to post ([`Connection`] says how). This file
//! holds the connection, its setup and its end; sending, receiving and the control messages
//! it plans are in the submodules.

use super::config::{Config, RS_SGL_SIZE};
use super::conn_data::ConnData;
use super::control::Control;
use super::error::{ProtoError, ProtoErrorKind};
use super::imm::CtrlCode;
use super::receiver::Receiver;
use super::ring_access::RingKeys;
use super::sender::Sender;
use super::sge::RsSge;
use super::state::ConnState;
use super::timers::Timers;
use super::wr::SendQueue;

mod control_writes;
mod recv;
mod send;
mod timeouts;

pub(crate) use recv::ReadStatus;
#[cfg(test)]
pub(crate) use recv::RecvAction;
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use recv::RecvEvent;
pub(crate) use send::WriteError;

/// Where the driver registered this side's remotely writable memory. Addresses and keys are
/// opaque to the core; it only does arithmetic on them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LocalLayout {
    /// Start of the receive ring (`config.rbuf_size()` bytes, remote write).
    pub(crate) rbuf_addr: u64,
    /// rkey of the receive ring.
    pub(crate) rbuf_rkey: u32,
    /// Start of our target SGL (`TARGET_SGL_BYTES` bytes, remote write).
    pub(crate) target_sgl_addr: u64,
    /// rkey of the target SGL.
    pub(crate) target_sgl_rkey: u32,
    /// For a ring that lends received bytes (zero-copy reads): each half's own keys, which
    /// replace `rbuf_rkey` in every grant.
    pub(crate) ring_keys: Option<RingKeys>,
}

/// Bytes of the target SGL memory the driver registers: `RS_SGL_SIZE` entries of 16 bytes (we
/// advertise no iomap table, so nothing follows it).
pub(crate) const TARGET_SGL_BYTES: usize = RS_SGL_SIZE * RsSge::LEN;

/// Protocol state and logic of one side of an rsockets stream.
///
/// A `Connection` performs no I/O. Its driver (`StreamCore`, in `stream/driver/`) owns
/// the queue pair, the completion queue and the registered memory; it tells the connection what
/// happened and what the application asks for, and posts the work requests the connection
/// plans. `Connection` has roughly five kinds of methods:
///
/// - A. Setup, once: [`new`](Self::new) with the sizes and where the driver registered the
///   rings, [`local_conn_data`](Self::local_conn_data) for the private data of our connect or
///   accept, and [`handle_peer_conn_data`](Self::handle_peer_conn_data) with the peer's, after
///   which the connection is connected.
/// - B. Handlers of what the device and rdma_cm report, named `handle_*`:
///   [`handle_recv_completion`](Self::handle_recv_completion) (which says whether to post the
///   receive again), [`handle_send_completion`](Self::handle_send_completion),
///   [`handle_disconnected`](Self::handle_disconnected) (`RDMA_CM_EVENT_DISCONNECTED`) and
///   [`handle_fatal`](Self::handle_fatal) (a local failure, such as a failed `ibv_post_send`).
/// - C. Commands of the application. Writes: [`prepare_write`](Self::prepare_write) plans the
///   next chunk of a write as a [`DataWrite`](super::plan::DataWrite) (the driver copies the
///   bytes into the send ring, or sends them inline, and posts it);
///   [`prepare_external_write`](Self::prepare_external_write) plans one sent from the caller's
///   own registered memory. Reads:
///   [`readable_run`](Self::readable_run) says where the readable bytes are in the
///   receive ring and [`consume`](Self::consume) takes them once copied out;
///   [`lend`](Self::lend) and [`deregistered`](Self::deregistered) hand them out without a copy
///   instead. And [`shutdown_write`](Self::shutdown_write), [`close`](Self::close),
///   [`queue_keepalive`](Self::queue_keepalive).
/// - D. The output to poll: [`poll_control`](Self::poll_control), the next control message to
///   post (credits, a grant of a receive-ring half, SHUTDOWN, DISCONNECT, a keepalive) as a
///   [`ControlWrite`](super::plan::ControlWrite), with [`control_ready`](Self::control_ready)
///   as the cheap look first. Work requests go to the device in the order they were planned,
///   data and control alike: the connection matches send completions in that order.
/// - E. Getters, taking `&self`, which also say who waits for what. The connection keeps no
///   wakers: [`write_readiness`](Self::write_readiness) and [`read_status`](Self::read_status)
///   say whether a write or a read can go on now, and when not, what will change that (a send
///   completion or a credit or buffer grant of the peer for a writer, a receive completion for
///   a reader), so the driver wakes its waiting readers and writers after it handled
///   completions or a CM event.
///   Also [`read_status_len`](Self::read_status_len), [`lend_limit`](Self::lend_limit),
///   [`is_send_outstanding`](Self::is_send_outstanding),
///   [`all_sends_done`](Self::all_sends_done), [`is_disconnected`](Self::is_disconnected) and
///   [`error`](Self::error).
///
/// The simplest correct use is to call (B) and (C) as things happen and, after each of them,
/// (D) until it returns `None`, posting what it returns; then wake whoever waits. The driver
/// does it in this order:
///
/// 1. Building: `new` (with the inline size the queue pair granted), then every receive of
///    the receive queue is posted (ids with `WR_ID_RECV_FLAG`, no buffer) before the peer can
///    send; `local_conn_data` goes out in the handshake, and the peer's connection data is
///    handed to `handle_peer_conn_data` (the passive side from the request, the active side
///    once established). The first `poll_control` then grants the peer the second half of our
///    receive ring.
/// 2. A batch of completions, in the order the completion queue returned them: each
///    successful receive to `handle_recv_completion` (failed and flushed receives carry nothing
///    and are skipped), each send completion, flushed or failed ones included, to
///    `handle_send_completion`. Then the receives it says to post again, with one post, before
///    the control messages that return their credits; then `poll_control` until `None`, each
///    write posted after the window bind it may carry; then the waiting readers and writers
///    are woken.
/// 3. A write: `prepare_write` until it returns an error, each chunk added to one chain of
///    work requests. When it fails before any chunk was planned, the queued completions are
///    handled (2) and it is asked again; still `Blocked`, the writer waits (and while it waits,
///    probes the peer now and then with `queue_keepalive` and `poll_control`). After the chunks,
///    `poll_control`; the chain goes to the device with one `ibv_post_send`.
/// 4. A read: when `read_status_len` is 0 the queued completions are handled (2) first; then
///    `read_status`: with data, copy out of `readable_run` and `consume`, then
///    `poll_control` (consuming is what returns credits and ring space to the peer); `Blocked`
///    waits for completions; `Eof` and `Failed` end the read.
/// 5. rdma_cm's `DISCONNECTED`: every completion still queued is handled (2) first, so bytes
///    the peer sent before it are readable, then `handle_disconnected`.
/// 6. Closing: `shutdown_write` or `close`, `poll_control`, then completions (2) until
///    `all_sends_done` or `is_disconnected` (or `error`).
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    config: Config,
    layout: LocalLayout,
    state: ConnState,
    sender: Sender,
    receiver: Receiver,
    sends: SendQueue,
    control: Control,
    timers: Timers,
}

impl Connection {
    /// A connection whose buffers the driver registered at `layout`, sized by `config`.
    pub(crate) fn new(config: Config, layout: LocalLayout) -> Self {
        Self {
            sender: Sender::new(&config),
            receiver: {
                let receiver = Receiver::new(
                    layout.rbuf_addr,
                    layout.rbuf_rkey,
                    config.rbuf_size(),
                    config.credits(),
                );
                match layout.ring_keys {
                    Some(keys) => receiver.with_ring_keys(keys),
                    None => receiver,
                }
            },
            config,
            layout,
            state: ConnState::default(),
            sends: SendQueue::default(),
            control: Control::default(),
            timers: Timers::default(),
        }
    }

    /// The (clamped) sizes this connection uses.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn config(&self) -> &Config {
        &self.config
    }

    /// The sending half, for the fuzz harness's and the tests' look at its credits.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn sender(&self) -> &Sender {
        &self.sender
    }

    /// The receiving half, for the fuzz harness's and the tests' look at what it granted.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn receiver(&self) -> &Receiver {
        &self.receiver
    }

    /// Our connection data, for the CM connect or accept private data.
    pub(crate) fn local_conn_data(&self) -> ConnData {
        ConnData::local(
            self.config.credits(),
            self.layout.target_sgl_addr,
            self.layout.target_sgl_rkey,
            self.layout.rbuf_addr,
            self.receiver.first_grant_key(),
            self.receiver.half(),
        )
    }

    /// Take the peer's connection data (C's `rs_save_conn_data`): from now on the connection is
    /// connected, readable and writable.
    pub(crate) fn handle_peer_conn_data(&mut self, peer: &ConnData) -> Result<(), ProtoError> {
        if self.state.connected || self.state.disconnected || self.state.error.is_some() {
            return Err(ProtoError::usage(
                "peer connection data given twice (or after the connection ended)",
            ));
        }
        peer.validate()?;
        self.sender.seed(peer.data_buf, peer.credits);
        self.receiver.set_peer_sgl(
            peer.target_sgl.addr,
            peer.target_sgl.key,
            peer.target_sgl.length,
            peer.sgl_byte_order(),
        );
        self.state.connect();
        Ok(())
    }

    // ---- closing -------------------------------------------------------------------------

    /// Local `shutdown(SHUT_WR)`: no more writes; the peer is told with SHUTDOWN if we are
    /// still reading, otherwise with DISCONNECT (§3.2). Idempotent.
    pub(crate) fn shutdown_write(&mut self) {
        if !self.state.connected || !self.state.writable {
            return;
        }
        self.state.writable = false;
        let code = if self.state.readable {
            CtrlCode::Shutdown
        } else {
            CtrlCode::Disconnect
        };
        self.control.queue(code);
    }

    /// Local close (`shutdown(SHUT_RDWR)`): no more reads or writes; DISCONNECT is queued.
    /// Idempotent. The connection becomes disconnected when the DISCONNECT completes.
    pub(crate) fn close(&mut self) {
        if !self.state.connected {
            return;
        }
        self.state.readable = false;
        self.state.writable = false;
        self.control.queue(CtrlCode::Disconnect);
    }

    /// Queue a keepalive (a plain 0-byte RDMA WRITE; it only makes a dead peer surface as a
    /// send error).
    pub(crate) fn queue_keepalive(&mut self) {
        if self.state.connected {
            self.control.queue(CtrlCode::Keepalive);
        }
    }

    /// The CM reported `RDMA_CM_EVENT_DISCONNECTED`. The driver handles every completion
    /// already queued first, so every byte the peer sent before it disconnected is readable.
    ///
    /// A peer that closed in order sent DISCONNECT (or SHUTDOWN) after its last byte, and RC
    /// delivers in order, so by now reads see end-of-stream after that byte. A peer that did
    /// not (its process died, or it tore the queue pair down with sends in flight) may have
    /// written bytes that never arrived: reads then return what did arrive and fail with a
    /// reset instead of a clean end-of-stream, which would hide the loss.
    pub(crate) fn handle_disconnected(&mut self) {
        if self.state.connected && self.state.readable {
            self.fail(ProtoError::new(
                ProtoErrorKind::Reset,
                "the peer disconnected without closing the stream (no rsockets DISCONNECT or \
                 SHUTDOWN came first), so bytes it wrote may be missing",
            ));
            self.state.disconnected = true;
        } else {
            self.enter_disconnected();
        }
    }

    /// The driver hit a fatal local error (e.g. `ibv_post_send` failed): enter the error
    /// state.
    pub(crate) fn handle_fatal(&mut self, err: ProtoError) -> ProtoError {
        self.fail(err)
    }

    /// C's `rs_conn_all_sends_done`: nothing left to wait for before tearing down (every send
    /// completed and no CTRL message is waiting), or not connected any more.
    pub(crate) fn all_sends_done(&self) -> bool {
        !self.state.connected || (self.sends.is_empty() && !self.control.has_pending())
    }

    /// Sends posted and not yet completed. Memory they use must stay registered until this is
    /// 0 (after a disconnect the driver drains the flushed completions).
    #[cfg(test)]
    pub(crate) fn sends_in_flight(&self) -> usize {
        self.sends.len()
    }

    fn enter_disconnected(&mut self) {
        self.state.disconnect();
        self.control.clear_pending();
    }

    fn fail(&mut self, err: ProtoError) -> ProtoError {
        self.state.fail(err.clone());
        self.control.clear_pending();
        err
    }

    // ---- state queries -------------------------------------------------------------------

    /// Connected (peer data taken, not disconnected or failed). Stays true after a local
    /// shutdown/close until the DISCONNECT completes.
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn is_connected(&self) -> bool {
        self.state.connected
    }

    /// New data may still arrive for local reads.
    #[cfg(test)]
    pub(crate) fn is_readable(&self) -> bool {
        self.state.readable
    }

    /// Local writes are still allowed (they may be blocked on resources).
    #[cfg(test)]
    pub(crate) fn is_writable(&self) -> bool {
        self.state.writable
    }

    /// Disconnected (C's `rs_disconnected`, POLLHUP).
    pub(crate) fn is_disconnected(&self) -> bool {
        self.state.disconnected
    }

    /// No more data will arrive (POLLRDHUP): the peer shut down or disconnected, or the
    /// connection failed. Bytes that arrived before may still be unread.
    pub(crate) fn is_read_closed(&self) -> bool {
        !self.state.readable
            && (self.state.connected || self.state.disconnected || self.state.error.is_some())
    }

    /// End of stream for reads: nothing left to read and nothing more will arrive.
    #[cfg(test)]
    pub(crate) fn is_eof(&self) -> bool {
        self.read_status() == ReadStatus::Eof
    }

    /// The sticky error, if the connection failed (POLLERR).
    pub(crate) fn error(&self) -> Option<&ProtoError> {
        self.state.error.as_ref()
    }

    /// Starts both directions' message sequence numbers at `start` instead of 0, for a harness
    /// that wants them to wrap soon: call it on both ends with the same `start`, after the
    /// peer's connection data and before any message (credit updates carry send limits as
    /// 16-bit sequence numbers, so the two ends must agree on where they start).
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn start_sequences_at(&mut self, start: u16) {
        self.sender.start_sequences_at(start);
        self.receiver.start_sequences_at(start);
    }

    /// Sender counters for diagnostics and tests: (sseq_no, sseq_comp, sbuf bytes free, data
    /// SQ entries free).
    #[cfg(test)]
    pub(crate) fn send_counters(&self) -> (u16, u16, u32, u32) {
        (
            self.sender.sseq_no(),
            self.sender.sseq_comp(),
            self.sender.sbuf_bytes_avail(),
            self.sender.sqe_avail(),
        )
    }

    /// Receiver counters for diagnostics and tests: (rseq_no, ungranted free ring bytes).
    #[cfg(test)]
    pub(crate) fn recv_counters(&self) -> (u16, u32) {
        (self.receiver.rseq_no(), self.receiver.rbuf_bytes_avail())
    }

    /// Control messages in flight.
    #[cfg(test)]
    pub(crate) fn control_in_flight(&self) -> u32 {
        self.control.in_flight()
    }

    /// What is left of the buffer the peer granted in our target SGL slot `slot`.
    #[cfg(any(test, rdma_async_hooks))]
    pub(crate) fn target_slot(&self, slot: usize) -> Option<RsSge> {
        self.sender.target_slot(slot)
    }
}
