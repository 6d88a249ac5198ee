//! Test hooks: how tests play a peer that breaks the protocol or vanishes (`--cfg
//! rdma_async_hooks`; `crate::stream::hooks` hands them to tests).

use std::future::poll_fn;
use std::io;

use tokio::io::ReadBuf;

use crate::proto::WriteError;
use crate::stream::gather::Gather;
use crate::verbs::{Opcode, Payload, WorkRequest};

use super::{StreamCore, StreamDevice};

impl StreamCore {
    /// Posts a 0-byte RDMA write with immediate `imm`, outside the protocol (unsignaled, so the
    /// protocol never sees a completion for it): how tests play a peer that breaks the protocol.
    pub(in crate::stream) fn send_raw_immediate(&self, imm: u32) -> io::Result<()> {
        let _state = self.lock();
        self.device.qp.post(&WorkRequest {
            wr_id: 0,
            opcode: Opcode::Write {
                remote_addr: 0,
                rkey: 0,
                imm: Some(imm),
            },
            payload: Payload::Empty,
            signaled: false,
        })
    }

    /// Bytes received and not yet read, after handling what the completion queue holds (see
    /// `stream::hooks::readable_len`).
    pub(in crate::stream) fn readable_len(&self) -> io::Result<usize> {
        let mut state = self.lock();
        self.pump_some(&mut state)?;
        Ok(state.conn.read_status_len())
    }

    /// Where the peer's grant in our target SGL slot `slot` would take the next byte, and its
    /// key (see `stream::hooks::peer_grant`).
    pub(in crate::stream) fn peer_grant(&self, slot: usize) -> Option<(u64, u32)> {
        let state = self.lock();
        state.conn.target_slot(slot).map(|sge| (sge.addr, sge.key))
    }

    /// Writes `bytes` (inline, at most the inline size) to `remote_addr` under `rkey`, outside
    /// the protocol (see `stream::hooks::raw_write`); returns once the write completed.
    pub(in crate::stream) async fn raw_write(
        &self,
        remote_addr: u64,
        rkey: u32,
        bytes: &[u8],
    ) -> io::Result<()> {
        {
            let _state = self.lock();
            self.device.qp.post(&WorkRequest {
                wr_id: 0,
                opcode: Opcode::Write {
                    remote_addr,
                    rkey,
                    imm: None,
                },
                payload: Payload::Inline(bytes),
                signaled: true,
            })?;
        }
        // Its completion (or the error that breaks the connection) shows in the stream's state.
        let mut probe = [0u8; 1];
        let _ = poll_fn(|cx| {
            let mut buf = ReadBuf::new(&mut probe);
            self.poll_read(cx, &mut buf, true)
        })
        .await;
        Ok(())
    }

    /// Makes the next receive post fail (see `stream::hooks::fail_next_post_recv`).
    pub(in crate::stream) fn fail_next_post_recv(&self) {
        self.device.qp.fail_next_post_recv();
    }

    /// Posts up to `max` 0-byte DATA messages, as many as the peer's credits and the send
    /// queue allow now (valid rsockets messages that carry nothing): how tests flood a peer.
    /// Returns how many were posted; 0 means wait for `writable()`.
    pub(in crate::stream) fn send_empty_messages(&self, max: usize) -> io::Result<usize> {
        let mut state = self.lock();
        self.pump_some(&mut state)?;
        let mut sent = 0;
        let mut chain = self.device.chain();
        let mut refused = None;
        while sent < max {
            match state.conn.prepare_empty_write() {
                Ok(write) => {
                    self.push_data(&mut state, Some(&mut chain), &write, &mut Gather::new(&[]))?;
                    sent += 1;
                }
                Err(WriteError::Blocked(_)) => break,
                Err(WriteError::Closed) => {
                    refused = Some(self.failure(&state, None));
                    break;
                }
                Err(WriteError::Failed(e)) => {
                    refused = Some(self.failure(&state, Some(e)));
                    break;
                }
            }
        }
        // What was planned is posted either way: the protocol counts it as sent.
        self.push_controls(&mut state, &mut chain)?;
        self.post_chain(&mut state, &mut chain)?;
        if let Some(e) = refused {
            return Err(e);
        }
        Ok(sent)
    }

    /// Moves the queue pair to the error state without a word to the peer: from then on this
    /// end drops the peer's packets, as a host that vanished would.
    pub(in crate::stream) fn vanish(&self) -> io::Result<()> {
        self.device.qp.set_error()
    }
}
