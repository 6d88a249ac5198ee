//! Receiving: what a receive completion carries (data, a buffer grant or credits, a control
//! message), and the application's side of the receive ring: what a read sees, copying out and
//! consuming, and lending bytes without a copy.

use super::Connection;
use crate::proto::error::ProtoError;
use crate::proto::imm::{CtrlCode, Op};
use crate::proto::plan::LendStep;
use crate::proto::receiver::Lend;
#[cfg(any(test, rdma_async_fuzzing))]
use crate::proto::ring::Segments;
use crate::proto::ring_access::Revoke;
use crate::proto::sge::{ByteOrder, RsSge};
use crate::proto::wr::SendKind;

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

impl Connection {
    /// The driver's entry for a receive that completed successfully: returns whether to post a
    /// replacement receive, as [`Self::handle_recv_completion`]'s `repost`. A plain DATA word
    /// on a connected, healthy connection (nearly every completion of a stream) is handled
    /// inline, without decoding the word into an [`Op`] or building the event; everything else
    /// goes through the full handling.
    #[inline]
    pub(crate) fn recv_completed(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        read_target_sgl_slot: impl FnOnce(usize) -> [u8; 16],
    ) -> Result<bool, ProtoError> {
        // Op 0 in the top bits makes the word the length itself; the completion's byte count
        // must equal it.
        if let Some(word) = imm
            && Op::is_plain_data(word)
            && word == byte_len
            && self.state.connected
            && self.state.error.is_none()
        {
            return match self.receiver.on_data(word) {
                Ok(_) => Ok(true),
                Err(err) => Err(self.fail(err)),
            };
        }
        self.recv_completed_slow(imm, byte_len, read_target_sgl_slot)
    }

    /// [`Self::recv_completed`] for every other completion: out of line, so that the DATA
    /// path carries no frame for the rest.
    #[inline(never)]
    fn recv_completed_slow(
        &mut self,
        imm: Option<u32>,
        byte_len: u32,
        read_target_sgl_slot: impl FnOnce(usize) -> [u8; 16],
    ) -> Result<bool, ProtoError> {
        self.handle_recv_completion(imm, byte_len, read_target_sgl_slot)
            .map(|action| action.repost)
    }

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
                } else if self.control.close_queued_as_disconnect() {
                    // Our SHUTDOWN has not gone out yet (no control slot was free), and the
                    // peer reads until it comes: it goes, as a DISCONNECT now, and its
                    // completion ends the connection (C drops it, and the peer reads EOF only
                    // from rdma_cm's disconnect, which this crate reads as a reset).
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
    #[cfg(any(test, rdma_async_fuzzing))]
    pub(crate) fn readable_segments(&self) -> Segments {
        self.receiver.readable_segments()
    }

    /// The read position in the receive ring, and the readable bytes from there to the ring's
    /// end; the other readable bytes, if any, start at offset 0 (copy source).
    #[inline]
    pub(crate) fn readable_run(&self) -> (usize, usize) {
        self.receiver.readable_run()
    }

    /// The application consumed `n` readable bytes (after copying them out).
    #[inline]
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
}
