//! One side of an rsockets stream: the state machine the driver feeds with completions and
//! application calls, and asks for work requests to post. This file holds the connection, its
//! setup and its end; sending, receiving and the control messages it plans are in the
//! submodules.

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
use super::wr::SendQueue;

mod control_writes;
mod recv;
mod send;

pub(crate) use recv::ReadStatus;
#[cfg(test)]
pub(crate) use recv::RecvAction;
#[cfg(any(test, feature = "fuzzing"))]
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

/// One side of a stream connection.
#[derive(Debug, Clone)]
pub(crate) struct Connection {
    config: Config,
    layout: LocalLayout,
    state: ConnState,
    sender: Sender,
    receiver: Receiver,
    sends: SendQueue,
    control: Control,
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
        }
    }

    /// The (clamped) sizes this connection uses.
    #[cfg(any(test, feature = "fuzzing"))]
    pub(crate) fn config(&self) -> &Config {
        &self.config
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
    #[cfg(test)]
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

    /// End of stream for reads: nothing left to read and nothing more will arrive.
    #[cfg(test)]
    pub(crate) fn is_eof(&self) -> bool {
        self.read_status() == ReadStatus::Eof
    }

    /// The sticky error, if the connection failed (POLLERR).
    pub(crate) fn error(&self) -> Option<&ProtoError> {
        self.state.error.as_ref()
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
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) fn target_slot(&self, slot: usize) -> Option<RsSge> {
        self.sender.target_slot(slot)
    }
}
