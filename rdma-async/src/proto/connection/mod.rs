//! One side of an rsockets stream: the state machine the driver feeds with completions and
//! application calls, and asks for work requests to post.

use super::config::{Config, RS_MAX_CTRL_MSG, RS_SGL_SIZE};
use super::conn_data::ConnData;
use super::control::Control;
use super::error::{ProtoError, ProtoErrorKind};
use super::imm::{CtrlCode, Op};
use super::plan::{ControlKind, ControlWrite, DataWrite};
use super::plan::{LendStep, WindowBind};
use super::receiver::{CreditUpdate, Lend, Receiver};
use super::ring::Segments;
use super::ring_access::{Revoke, RingKeys};
use super::sender::{Chunk, Sender, WriteBlocked, WriteCall};
use super::sge::{ByteOrder, RsSge};
use super::state::ConnState;
use super::wr::{SendKind, SendQueue};

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

/// Why `prepare_write` produced nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum WriteError {
    /// Nothing can be sent now; a send completion or a credit/SGL message from the peer will
    /// change that (the reason says which). Wait, then call again.
    Blocked(WriteBlocked),
    /// Writing is over: we shut down writing, or the connection is disconnected. C returns
    /// `ECONNRESET` here.
    Closed,
    /// The connection failed, or the call was invalid (the error says which).
    Failed(ProtoError),
}

/// What a read would see now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ReadStatus {
    /// This many bytes can be read (see `readable_segments`).
    Data(usize),
    /// Nothing yet; a receive completion will change that.
    Blocked,
    /// End of stream: the peer shut down or disconnected (or we closed) and all data was read.
    Eof,
    /// The connection failed and all data received before the failure was read.
    Failed(ProtoError),
}

/// What a receive completion was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RecvEvent {
    /// `len` bytes of data landed at ring offset `offset` and are now readable.
    Data { offset: usize, len: usize },
    /// The peer granted a new buffer in our target SGL slot `slot`, and a new send limit.
    SglUpdate { slot: usize, limit: u16 },
    /// A new send limit only.
    Credits { limit: u16 },
    /// A control message.
    Ctrl(CtrlCode),
    /// Nothing to do (an `RS_OP_WRITE` tag, or a completion after the connection failed).
    Ignored,
}

/// The result of a receive completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RecvAction {
    /// Whether to post a replacement receive: yes while connected (C reposts 1:1), no after a
    /// DISCONNECT or SHUTDOWN-while-not-writable made the connection disconnected.
    pub(crate) repost: bool,
    /// What arrived.
    pub(crate) event: RecvEvent,
}

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

    // ---- sending -------------------------------------------------------------------------

    /// `Ok` if `prepare_write` would produce a chunk now (C's `rs_can_send` plus state checks).
    pub(crate) fn write_readiness(&self) -> Result<(), WriteError> {
        if let Some(err) = &self.state.error {
            return Err(WriteError::Failed(err.clone()));
        }
        if !self.state.connected && !self.state.disconnected {
            return Err(WriteError::Failed(ProtoError::usage(
                "write before the peer's connection data was handled",
            )));
        }
        if !self.state.writable {
            return Err(WriteError::Closed);
        }
        match self.sender.blocked() {
            Some(reason) => Err(WriteError::Blocked(reason)),
            None => Ok(()),
        }
    }

    /// Whether a write would make progress now (POLLOUT).
    #[cfg(test)]
    pub(crate) fn can_write(&self) -> bool {
        self.write_readiness().is_ok()
    }

    /// Plan the next chunk of an application write with `remaining` bytes (> 0) left in this
    /// call. The state is updated before returning (target SGE advanced, sequence number and
    /// send-queue accounting), so the driver must post the returned write.
    pub(crate) fn prepare_write(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<DataWrite, WriteError> {
        self.prepare_chunk(remaining, |sender| sender.next_chunk(call, remaining))
    }

    /// Checks the connection can write `remaining` (> 0) bytes, lets `next` plan the chunk,
    /// and records it as an outstanding send.
    fn prepare_chunk(
        &mut self,
        remaining: usize,
        next: impl FnOnce(&mut Sender) -> Result<Chunk, WriteBlocked>,
    ) -> Result<DataWrite, WriteError> {
        self.write_readiness()?;
        if remaining == 0 {
            return Err(WriteError::Failed(ProtoError::usage(
                "a 0-byte write sends nothing: no chunk to prepare",
            )));
        }
        let chunk = next(&mut self.sender).map_err(WriteError::Blocked)?;
        Ok(self.data_write(chunk))
    }

    /// Records `chunk` as an outstanding send and returns its write.
    fn data_write(&mut self, chunk: Chunk) -> DataWrite {
        let wr_id = self.sends.push(SendKind::Data { len: chunk.len });
        DataWrite {
            wr_id,
            signaled: chunk.signaled,
            len: chunk.len as usize,
            sbuf: chunk.sbuf,
            inline: chunk.inline,
            remote_addr: chunk.remote_addr,
            rkey: chunk.rkey,
            imm: Op::Data(chunk.len).encode(),
        }
    }

    /// Plan the next chunk of a zero-copy write (sent from the caller's registered memory, not
    /// the send ring) with `remaining` bytes (> 0) left; see `Sender::next_external_chunk`. The
    /// returned write has an empty `sbuf` and is not inline: the driver sends its `len` bytes
    /// from the caller's memory.
    pub(crate) fn prepare_external_write(
        &mut self,
        call: &mut WriteCall,
        remaining: usize,
    ) -> Result<DataWrite, WriteError> {
        self.prepare_chunk(remaining, |sender| {
            sender.next_external_chunk(call, remaining)
        })
    }

    /// Whether the send `wr_id` was posted and has not completed yet.
    pub(crate) fn is_send_outstanding(&self, wr_id: u64) -> bool {
        self.sends.is_outstanding(wr_id)
    }

    /// Plans a 0-byte DATA message: valid for the peer (it costs one of our credits and
    /// returns at once), but carrying nothing. Tests flood a peer with these.
    #[cfg(feature = "test-hooks")]
    pub(crate) fn prepare_empty_write(&mut self) -> Result<DataWrite, WriteError> {
        self.write_readiness()?;
        let chunk = self
            .sender
            .next_empty_chunk()
            .map_err(WriteError::Blocked)?;
        let wr_id = self.sends.push(SendKind::Data { len: 0 });
        Ok(DataWrite {
            wr_id,
            signaled: chunk.signaled,
            len: 0,
            sbuf: chunk.sbuf,
            inline: true,
            remote_addr: chunk.remote_addr,
            rkey: chunk.rkey,
            imm: Op::Data(0).encode(),
        })
    }

    /// A send work request completed (`ok` = success status). Sends complete in post order, so
    /// this also completes every unsignaled send posted before it. Returns the error if this
    /// completion broke the connection.
    pub(crate) fn handle_send_completion(
        &mut self,
        wr_id: u64,
        ok: bool,
    ) -> Result<(), ProtoError> {
        let mut disconnect_done = false;
        let mut last = None;
        if let Err(err) = self.sends.completed_by(wr_id) {
            return Err(self.fail(err));
        }
        for (_, kind) in self.sends.complete_through(wr_id)? {
            match kind {
                SendKind::Data { len } => self.sender.complete(len),
                SendKind::Control(kind) => {
                    self.control.release();
                    disconnect_done |= kind == ControlKind::Ctrl(CtrlCode::Disconnect);
                }
                SendKind::Bind { .. } => {}
                // A flushed invalidation revoked nothing; the connection is failing anyway.
                SendKind::Invalidate { half, key } if ok => self.receiver.revoked(half, key),
                SendKind::Invalidate { .. } => {}
            }
            last = Some(kind);
        }
        if disconnect_done {
            // C: our DISCONNECT is out (or flushed): the connection is over.
            self.enter_disconnected();
        }
        if !ok && self.state.connected {
            let err = ProtoError::new(
                ProtoErrorKind::SendFailed,
                format!("a {last:?} send completed with an error status"),
            );
            return Err(self.fail(err));
        }
        Ok(())
    }

    // ---- receiving -----------------------------------------------------------------------

    /// A receive completed successfully (the driver skips receives with an error status, as C
    /// does). `imm` is the host-order immediate word, `byte_len` the completion's byte count.
    /// For an SGL update, `read_target_sgl_slot(slot)` must return the 16 bytes the peer wrote
    /// into our target SGL entry `slot` (the driver copies them out of registered memory).
    pub(crate) fn handle_recv_completion(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        read_target_sgl_slot: impl FnOnce(usize) -> [u8; 16],
    ) -> Result<RecvAction, ProtoError> {
        if self.state.error.is_some() {
            return Ok(RecvAction {
                repost: false,
                event: RecvEvent::Ignored,
            });
        }
        if !self.state.connected && !self.state.disconnected {
            return Err(self.fail(ProtoError::usage(
                "receive completion before the peer's connection data was handled",
            )));
        }
        match self.process_recv(imm, byte_len, read_target_sgl_slot) {
            Ok(event) => Ok(RecvAction {
                repost: self.state.connected,
                event,
            }),
            Err(err) => Err(self.fail(err)),
        }
    }

    fn process_recv(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        read_target_sgl_slot: impl FnOnce(usize) -> [u8; 16],
    ) -> Result<RecvEvent, ProtoError> {
        let Some(word) = imm else {
            return Err(ProtoError::peer(
                "receive completion without immediate data (the iWARP SEND-based message \
                 mode is not supported)",
            ));
        };
        match Op::decode(word)? {
            Op::Data(len) => {
                if byte_len != len {
                    // IBA: byte_len of an RDMA WRITE WITH IMM is the bytes written. A mismatch
                    // means a lying peer or a provider whose byte_len we cannot trust (which
                    // would also break SGL-update detection), so fail loudly.
                    return Err(ProtoError::peer(format!(
                        "DATA immediate says {len} bytes but the completion reports {byte_len}"
                    )));
                }
                let offset = self.receiver.on_data(len)?;
                Ok(RecvEvent::Data {
                    offset: offset as usize,
                    len: len as usize,
                })
            }
            Op::Sgl(limit) => {
                let slot = match byte_len {
                    0 => None,
                    16 => {
                        let slot = self.sender.next_update_slot();
                        let sge =
                            RsSge::from_bytes(read_target_sgl_slot(slot), ByteOrder::native());
                        Some(self.sender.apply_sgl_update(sge)?)
                    }
                    other => {
                        return Err(ProtoError::peer(format!(
                            "SGL message with a {other}-byte payload; expected 16 (buffer \
                             update) or 0 (credits only)"
                        )));
                    }
                };
                self.sender.apply_limit(limit)?;
                Ok(match slot {
                    Some(slot) => RecvEvent::SglUpdate { slot, limit },
                    None => RecvEvent::Credits { limit },
                })
            }
            Op::IomapSgl(index) => Err(ProtoError::peer(format!(
                "IOMAP_SGL update for entry {index}, but we advertised no iomap entries"
            ))),
            Op::Ctrl(code) => {
                self.handle_peer_ctrl(code);
                Ok(RecvEvent::Ctrl(code))
            }
            Op::DirectWrite(_) => Ok(RecvEvent::Ignored),
        }
    }

    /// rsocket-protocol.md §3.3.
    fn handle_peer_ctrl(&mut self, code: CtrlCode) {
        if !self.state.connected {
            return;
        }
        match code {
            CtrlCode::Disconnect => self.enter_disconnected(),
            CtrlCode::Shutdown => {
                if self.state.writable {
                    self.state.readable = false;
                } else {
                    self.enter_disconnected();
                }
            }
            // Never arrives with an immediate from C (it is a plain write); nothing to do.
            CtrlCode::Keepalive => {}
        }
    }

    /// What a read would see now.
    pub(crate) fn read_status(&self) -> ReadStatus {
        let n = self.receiver.readable_len();
        if n > 0 {
            ReadStatus::Data(n)
        } else if let Some(err) = &self.state.error {
            ReadStatus::Failed(err.clone())
        } else if self.state.readable {
            ReadStatus::Blocked
        } else if self.state.connected || self.state.disconnected {
            ReadStatus::Eof
        } else {
            // Not connected yet.
            ReadStatus::Blocked
        }
    }

    /// How many bytes can be read now.
    pub(crate) fn read_status_len(&self) -> usize {
        self.receiver.readable_len()
    }

    /// Bytes from the read position to the end of its half of the receive ring: the most one
    /// lent piece can hold.
    pub(crate) fn lend_limit(&self) -> usize {
        self.receiver.to_half_end()
    }

    /// The readable bytes as receive-ring offsets, in stream order (copy source).
    pub(crate) fn readable_segments(&self) -> Segments {
        self.receiver.readable_segments()
    }

    /// The application consumed `n` readable bytes (after copying them out).
    pub(crate) fn consume(&mut self, n: usize) -> Result<(), ProtoError> {
        self.receiver.consume(n)
    }

    /// Whether the bytes at the read position can be lent to the application without a copy,
    /// and what the driver must do first (zero-copy reads). Once the connection is no longer
    /// connected nothing is revoked any more (a failed queue pair completes no invalidation):
    /// what cannot be lent already is copied.
    pub(crate) fn lend(&mut self) -> LendStep {
        let connected = self.state.connected && self.state.error.is_none();
        match self.receiver.lend() {
            Lend::Empty => LendStep::Empty,
            Lend::Ready { offset, len } => LendStep::Ready {
                offset: offset as usize,
                len: len as usize,
            },
            Lend::Copy => LendStep::Copy,
            _ if !connected => LendStep::Copy,
            Lend::Revoking => LendStep::Wait,
            Lend::Revoke(Revoke::Deregister { half, key }) => LendStep::Deregister { half, key },
            Lend::Revoke(Revoke::Invalidate { half, key }) => LendStep::Invalidate {
                wr_id: self.sends.push(SendKind::Invalidate { half, key }),
                half,
                key,
            },
        }
    }

    /// The deregistration [`LendStep::Deregister`] asked for is done.
    pub(crate) fn deregistered(&mut self, half: usize, key: u32) {
        self.receiver.revoked(half, key);
    }

    // ---- control messages ----------------------------------------------------------------

    /// Whether a control message is due (a CTRL message, credits or a buffer grant), free
    /// control slot or not: [`Self::poll_control`] has nothing to give without one, and the
    /// data path asks this first, as most calls find nothing due.
    #[inline]
    pub(crate) fn control_wanted(&self) -> bool {
        // After our DISCONNECT the peer will not send again; credits would be wasted.
        self.state.connected
            && (self.control.has_pending()
                || (!self.control.disconnect_queued() && self.receiver.credit_update_due()))
    }

    /// The next control message to post, if one is due and a control slot is free. Call it
    /// after every `handle_*`, `consume` and `shutdown_write`/`close` until it returns `None`.
    pub(crate) fn poll_control(&mut self) -> Option<ControlWrite> {
        if !self.control_wanted() || !self.control.slot_free() {
            return None;
        }
        if let Some(code) = self.control.pop_pending() {
            return Some(self.plan_ctrl(code));
        }
        let (bind, kind, payload, remote_addr, rkey, imm) = match self.receiver.take_credit_update()
        {
            CreditUpdate::Sgl {
                slot,
                payload,
                remote_addr,
                rkey,
                limit,
                bind,
            } => (
                bind,
                ControlKind::SglUpdate { slot, limit },
                Some(payload),
                remote_addr,
                rkey,
                Op::Sgl(limit).encode(),
            ),
            CreditUpdate::Credits { limit } => (
                None,
                ControlKind::Credits { limit },
                None,
                0,
                0,
                Op::Sgl(limit).encode(),
            ),
        };
        // The bind goes first in the send queue, so the window is bound (under the key the
        // update names) before the peer can learn it.
        let bind = bind.map(|b| WindowBind {
            wr_id: self.sends.push(SendKind::Bind { half: b.half }),
            half: b.half,
            rkey: b.rkey,
        });
        let mut write = self.plan_control(kind, Some(imm), payload, remote_addr, rkey);
        write.bind = bind;
        Some(write)
    }

    fn plan_ctrl(&mut self, code: CtrlCode) -> ControlWrite {
        let imm = match code {
            // C posts keepalives as plain RDMA WRITEs: the peer never sees them.
            CtrlCode::Keepalive => None,
            _ => Some(Op::Ctrl(code).encode()),
        };
        self.plan_control(ControlKind::Ctrl(code), imm, None, 0, 0)
    }

    fn plan_control(
        &mut self,
        kind: ControlKind,
        imm: Option<u32>,
        payload: Option<[u8; 16]>,
        remote_addr: u64,
        rkey: u32,
    ) -> ControlWrite {
        let ctrl_slot = self.control.take_slot();
        let wr_id = self.sends.push(SendKind::Control(kind));
        // A credit or buffer update goes unsignaled unless it takes the last free control
        // slot: the next control message then waits for a completion, and this one's (sends
        // complete in order) frees every slot. Until then any later signaled send frees them.
        // After a local shutdown no data write will come to complete it, and
        // `all_sends_done` must become true: signaled. CTRL messages are rare, and a
        // DISCONNECT's completion ends the connection.
        let signaled = matches!(kind, ControlKind::Ctrl(_))
            || !self.state.writable
            || !self.control.slot_free();
        ControlWrite {
            wr_id,
            kind,
            signaled,
            imm,
            payload,
            remote_addr,
            rkey,
            inline: self.config.inline_size() as usize >= RS_MAX_CTRL_MSG,
            ctrl_slot,
            bind: None,
        }
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

    /// Whether a control message is due but every control slot is taken: it waits for a send
    /// completion (the simulator checks one is coming).
    #[cfg(test)]
    pub(crate) fn control_waiting_for_slot(&self) -> bool {
        self.state.connected
            && !self.control.slot_free()
            && (self.control.has_pending()
                || (!self.control.disconnect_queued() && self.receiver.credit_update_due()))
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
