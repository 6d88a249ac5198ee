//! The fake's send chain ([`FakeChain`]) and what posting it does: each request executed at
//! once, in order, as a device would.

use std::io;

use crate::verbs::{Opcode, Payload, Segment, WcStatus, WorkCompletion, WorkRequest};

use super::super::{PostChain, RBUF, TARGET_SGL};
use super::{
    FakeDevice, RBUF_ADDR, RBUF_RKEY, Shared, TARGET_SGL_ADDR, TARGET_SGL_RKEY, lock, unsupported,
    wake,
};

/// A request held by a [`FakeChain`]: its payload's bytes are read when it is posted, as a
/// device reads them after the doorbell (inline bytes are copied into the request).
#[derive(Debug)]
enum HeldPayload {
    Empty,
    Segments(Vec<Segment>),
    Inline(Vec<u8>),
}

#[derive(Debug)]
struct HeldRequest {
    wr_id: u64,
    opcode: Opcode,
    payload: HeldPayload,
    signaled: bool,
}

/// A send chain of the fake: requests held until posted.
#[derive(Debug)]
pub(in crate::stream::driver) struct FakeChain<'a> {
    device: &'a FakeDevice,
    held: Vec<HeldRequest>,
    posts: u64,
}

/// The most requests a chain holds before a push posts them (as `SendChain` does).
const MAX_CHAIN: usize = 16;

impl<'a> FakeChain<'a> {
    /// An empty chain of `device`.
    pub(super) fn new(device: &'a FakeDevice) -> Self {
        FakeChain {
            device,
            held: Vec::new(),
            posts: 0,
        }
    }
}

impl PostChain for FakeChain<'_> {
    fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    fn posts(&self) -> u64 {
        self.posts
    }

    fn push(&mut self, req: &WorkRequest<'_>) -> io::Result<()> {
        let payload = match req.payload {
            Payload::Empty => HeldPayload::Empty,
            Payload::Segments(segments) => HeldPayload::Segments(segments.to_vec()),
            Payload::Inline(bytes) if bytes.len() > self.device.max_inline => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{} bytes exceed the fake's inline limit of {}",
                        bytes.len(),
                        self.device.max_inline
                    ),
                ));
            }
            Payload::Inline(bytes) => HeldPayload::Inline(bytes.to_vec()),
            Payload::Attached { .. } => return Err(unsupported("attached buffers")),
        };
        if self.held.len() == MAX_CHAIN {
            self.post()?;
        }
        self.held.push(HeldRequest {
            wr_id: req.wr_id,
            opcode: req.opcode,
            payload,
            signaled: req.signaled,
        });
        Ok(())
    }

    fn post(&mut self) -> io::Result<()> {
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        self.posts += 1;
        self.device.execute(held)
    }
}

impl FakeDevice {
    /// Executes posted requests in order, as the device would; wakes whoever has new
    /// completions.
    fn execute(&self, requests: Vec<HeldRequest>) -> io::Result<()> {
        let (me, peer) = (self.end, self.peer());
        let mut wakers = Vec::new();
        let result = {
            let mut shared = lock(&self.shared);
            if std::mem::take(&mut shared.ends[me].fail_next_post) {
                Err(io::Error::other("fake device: injected post failure"))
            } else {
                let mut result = Ok(());
                let flushed = shared.disconnected;
                for req in &requests {
                    shared.ends[me].occupy_send();
                    if flushed {
                        // The queue pair is in the error state: every request completes
                        // flushed, and nothing reaches the peer.
                        shared.ends[me].complete_send(WorkCompletion {
                            wr_id: req.wr_id,
                            status: WcStatus::FLUSH,
                            ..WorkCompletion::EMPTY
                        });
                        continue;
                    }
                    if let Err(e) = execute_one(&mut shared, me, req) {
                        // Not posted after all.
                        shared.ends[me].sends_outstanding -= 1;
                        result = Err(e);
                        break;
                    }
                }
                wakers.extend(shared.ends[me].take_wakers());
                wakers.extend(shared.ends[peer].take_wakers());
                result
            }
        };
        wake(wakers);
        result
    }
}

/// Executes one request of end `me`: the RDMA write's bytes land in the peer's buffer, its
/// immediate in one of the peer's receives; a signaled request completes locally. A write
/// outside the peer's buffers completes with a remote access error, as on a device.
fn execute_one(shared: &mut Shared, me: usize, req: &HeldRequest) -> io::Result<()> {
    let peer = 1 - me;
    let Opcode::Write {
        remote_addr,
        rkey,
        imm,
    } = req.opcode
    else {
        return Err(unsupported("sends, reads or atomics (streams only write)"));
    };
    let bytes = match &req.payload {
        HeldPayload::Empty => Vec::new(),
        HeldPayload::Inline(bytes) => bytes.clone(),
        HeldPayload::Segments(segments) => {
            let mut bytes = Vec::new();
            for seg in segments {
                let buffer = &shared.ends[me].buffers[seg.buffer];
                let range = seg.offset..seg.offset + seg.len;
                let src = buffer.get(range).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidInput, "segment outside its buffer")
                })?;
                bytes.extend_from_slice(src);
            }
            bytes
        }
    };
    let len = bytes.len();
    let fits = |&(buffer, offset): &(usize, usize)| {
        offset
            .checked_add(len)
            .is_some_and(|end| end <= shared.ends[peer].buffers[buffer].len())
    };
    // A write of no bytes touches no memory: a device checks neither address nor key.
    let landed = if len == 0 {
        true
    } else if let Some((buffer, offset)) = target(peer, remote_addr, rkey).filter(fits) {
        shared.ends[peer].buffers[buffer][offset..offset + len].copy_from_slice(&bytes);
        true
    } else {
        false
    };
    let status = if landed {
        if let Some(imm) = imm {
            let receiver = &mut shared.ends[peer];
            receiver.unreceived.push_back((imm, len as u32));
            receiver.deliver_unreceived();
        }
        WcStatus::SUCCESS
    } else {
        WcStatus::REMOTE_ACCESS
    };
    if req.signaled || !status.is_success() {
        shared.ends[me].complete_send(WorkCompletion {
            wr_id: req.wr_id,
            status,
            ..WorkCompletion::EMPTY
        });
    } else {
        shared.ends[me].unsignaled += 1;
    }
    Ok(())
}

/// Which of `end`'s buffers (and where in it) the bytes at `addr` under `rkey` are.
fn target(end: usize, addr: u64, rkey: u32) -> Option<(usize, usize)> {
    let end = end as u32;
    let (buffer, base) = if rkey == RBUF_RKEY + end {
        (RBUF, RBUF_ADDR)
    } else if rkey == TARGET_SGL_RKEY + end {
        (TARGET_SGL, TARGET_SGL_ADDR)
    } else {
        return None;
    };
    let offset = usize::try_from(addr.checked_sub(base)?).ok()?;
    Some((buffer, offset))
}
