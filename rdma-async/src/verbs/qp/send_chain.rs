//! [`SendChain`]: send work requests gathered and posted together, with one `ibv_post_send`.
//!
//! Each `ibv_post_send` rings the device's doorbell: an MMIO write on a NIC, a system call on
//! Soft-RoCE. A stream's write call of several chunks, or a chunk and the credit update due with
//! it, costs one doorbell this way rather than one per work request. The requests are checked
//! and converted as they are pushed, into room left uninitialised (most chains are one short
//! request, and this runs once per message), and linked only when posted.

use std::io;
use std::mem::MaybeUninit;
use std::ptr;

use rdma_async_sys as sys;

use super::queue_pair::OwnedBufferQueuePair;
use super::work_request::{MAX_SEGMENTS, Payload, WorkRequest, set_opcode, set_write_with_imm};
use crate::error;

/// Most work requests one chain posts at once: a stream's 1 MiB write call is 16 chunks of
/// 64 KiB.
const MAX_CHAIN: usize = 16;

/// Most gather entries of all the requests of one post: two per request (a ring's wrap).
const MAX_CHAIN_SEGMENTS: usize = 2 * MAX_CHAIN;

/// Bytes of inline payloads a chain holds. The provider copies inline bytes only when the chain
/// is posted, so the chain keeps its own copy: room for four of rsockets' default 64-byte
/// inline chunks, or sixteen 16-byte control messages. A fuller chain is posted first; a
/// payload larger than this (a queue pair granted a larger inline limit) is posted at once,
/// alone, from the caller's bytes.
const INLINE_ROOM: usize = 256;

/// Send work requests for one queue pair, posted in the order pushed. A push that finds the
/// chain full posts what it holds first; [`SendChain::post`] posts the rest. Requests still
/// held when the chain is dropped are never posted.
pub(crate) struct SendChain<'q> {
    qp: &'q OwnedBufferQueuePair,
    /// The first `len` are initialised, but for `sg_list` and `next` (set by `post`).
    wrs: [MaybeUninit<sys::ibv_send_wr>; MAX_CHAIN],
    /// The first `sges_used` are initialised. An inline request's entry holds the offset of its
    /// bytes in `inline` until `post` makes it a pointer.
    sges: [MaybeUninit<sys::ibv_sge>; MAX_CHAIN_SEGMENTS],
    /// Where each request's gather entries start in `sges`.
    first_sge: [u8; MAX_CHAIN],
    /// The first `inline_used` bytes are initialised.
    inline: [MaybeUninit<u8>; INLINE_ROOM],
    len: usize,
    sges_used: usize,
    inline_used: usize,
    /// `ibv_post_send` calls made.
    posts: u64,
}

impl<'q> SendChain<'q> {
    /// An empty chain for `qp`.
    pub(crate) fn new(qp: &'q OwnedBufferQueuePair) -> Self {
        SendChain {
            qp,
            wrs: [const { MaybeUninit::uninit() }; MAX_CHAIN],
            sges: [const { MaybeUninit::uninit() }; MAX_CHAIN_SEGMENTS],
            first_sge: [0; MAX_CHAIN],
            inline: [const { MaybeUninit::uninit() }; INLINE_ROOM],
            len: 0,
            sges_used: 0,
            inline_used: 0,
            posts: 0,
        }
    }

    /// Whether no request waits to be posted.
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `ibv_post_send` calls this chain made so far.
    pub(crate) fn posts(&self) -> u64 {
        self.posts
    }

    /// Checks `req` against the queue pair (its ranges, its inline limit) and appends it, after
    /// posting the requests held if there is no room for it. An error leaves `req` out; one
    /// from that post means some of the held requests may not have been posted.
    pub(crate) fn push(&mut self, req: &WorkRequest<'_>) -> io::Result<()> {
        let (count, inline) = gather_shape(self.qp, req.payload)?;
        let inline_len = inline.map_or(0, <[u8]>::len);
        if self.len == MAX_CHAIN
            || self.sges_used + count > MAX_CHAIN_SEGMENTS
            || self.inline_used + inline_len > INLINE_ROOM
        {
            self.post()?;
        }
        // A single request always fits an empty chain (MAX_SEGMENTS <= MAX_CHAIN_SEGMENTS), but
        // for an inline payload larger than the chain's room.
        if inline_len > INLINE_ROOM {
            return self.post_alone(req);
        }
        let first = self.sges_used;
        let entries = &mut self.sges[first..first + count];
        match (req.payload, inline) {
            (_, Some(bytes)) => {
                if let Some(entry) = entries.first_mut() {
                    let offset = self.inline_used;
                    let room = &mut self.inline[offset..offset + bytes.len()];
                    // SAFETY: `room` is `bytes.len()` writable bytes of the chain's own array
                    // (`offset + len <= INLINE_ROOM` was made sure of above), which cannot
                    // overlap the caller's `bytes`; `MaybeUninit<u8>` has the layout of `u8`.
                    unsafe {
                        ptr::copy_nonoverlapping(
                            bytes.as_ptr(),
                            room.as_mut_ptr().cast::<u8>(),
                            bytes.len(),
                        );
                    }
                    self.inline_used += bytes.len();
                    entry.write(sys::ibv_sge {
                        addr: offset as u64,
                        length: bytes.len() as u32,
                        lkey: 0,
                    });
                }
            }
            (payload, None) => gather_entries(self.qp, payload, entries)?,
        }
        self.add(req, first, count, inline.is_some());
        Ok(())
    }

    /// Appends the request `req`, whose `count` gather entries are initialised at `first`.
    #[inline]
    fn add(&mut self, req: &WorkRequest<'_>, first: usize, count: usize, inline: bool) {
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let wr = self.wrs[self.len].write(unsafe { std::mem::zeroed() });
        fill_send_wr(wr, req.wr_id, count, inline, req.signaled);
        set_opcode(wr, req.opcode);
        // At most MAX_CHAIN_SEGMENTS (32): fits.
        self.first_sge[self.len] = first as u8;
        self.sges_used += count;
        self.len += 1;
    }

    /// Posts the inline request `req` (the chain empty) with its entry pointing at its own
    /// bytes, which live for this call.
    fn post_alone(&mut self, req: &WorkRequest<'_>) -> io::Result<()> {
        let Payload::Inline(bytes) = req.payload else {
            return Err(error::invalid_input(
                "only inline requests are posted alone",
            ));
        };
        self.sges[0].write(sys::ibv_sge {
            addr: bytes.as_ptr() as u64,
            length: bytes.len() as u32,
            lkey: 0,
        });
        self.add(req, 0, 1, true);
        self.link_and_post(false)
    }

    /// Posts the requests held, if any, with one `ibv_post_send`, and empties the chain (also
    /// on an error, after which some of them may not have been posted).
    #[inline]
    pub(crate) fn post(&mut self) -> io::Result<()> {
        if self.len == 0 {
            return Ok(());
        }
        self.link_and_post(true)
    }

    /// Links the held requests and posts them; with `relocate`, inline entries hold offsets
    /// into `inline` and become pointers first.
    fn link_and_post(&mut self, relocate: bool) -> io::Result<()> {
        let len = std::mem::take(&mut self.len);
        self.sges_used = 0;
        self.inline_used = 0;
        // Linked only now: the chain may have moved since the requests were pushed.
        let sge_base = self.sges.as_mut_ptr().cast::<sys::ibv_sge>();
        let wr_base = self.wrs.as_mut_ptr().cast::<sys::ibv_send_wr>();
        let inline_base = self.inline.as_ptr() as u64;
        for i in 0..len {
            // SAFETY: the first `len` requests were initialised by `add`, `i < len`, and no
            // other reference into `wrs` lives.
            let wr = unsafe { &mut *wr_base.wrapping_add(i) };
            wr.sg_list = if wr.num_sge == 0 {
                ptr::null_mut()
            } else {
                // Its `num_sge` entries were initialised from here by `push`, within `sges`.
                let list = sge_base.wrapping_add(usize::from(self.first_sge[i]));
                if relocate && wr.send_flags & sys::ibv_send_flags::IBV_SEND_INLINE != 0 {
                    // SAFETY: `list` is this request's first entry, initialised; no other
                    // reference into `sges` lives.
                    let entry = unsafe { &mut *list };
                    entry.addr += inline_base;
                }
                list
            };
            wr.next = if i + 1 < len {
                wr_base.wrapping_add(i + 1)
            } else {
                ptr::null_mut()
            };
        }
        self.posts += 1;
        // SAFETY: `len >= 1`, so the first request is initialised; the loop's references are
        // gone.
        let head = unsafe { &mut *wr_base };
        // SAFETY: the chain is the first `len` initialised requests, linked above, each listing
        // only initialised gather entries. Those were checked by `push` against buffers this
        // QP owns, which stay allocated and registered until after the QP is destroyed (an
        // attached buffer stays with the QP until its owner reclaims it after the completion
        // covering its request was polled); inline entries point into `self.inline` (or, posted
        // alone, into the caller's bytes, borrowed for this call) and were checked against the
        // QP's inline limit; the provider copies them during the call.
        unsafe { self.qp.post_send_owned(head) }
    }
}

// Here rather than beside the queue pair: one request is a chain of one, and the chain builds on
// the queue pair, not the other way round.
impl OwnedBufferQueuePair {
    /// Posts one work request to the send queue, alone: its request and gather entries are
    /// built on the stack, and an inline payload is posted from the caller's bytes (the
    /// provider copies them during the call), with none of a chain's room to fill and link.
    /// Always inlined: its frame cost a stream's write call some 15 instructions.
    #[inline(always)]
    pub(crate) fn post(&self, req: &WorkRequest<'_>) -> io::Result<()> {
        self.post_one_with(req.wr_id, req.payload, req.signaled, |wr| {
            set_opcode(wr, req.opcode);
        })
    }

    /// Posts, alone, an RDMA write with the immediate `imm` of `payload` to `remote_addr`
    /// under `rkey`: [`Self::post`] for a stream's data write, the usual write call (one chunk,
    /// nothing else due), with the request filled straight from these parts: built as a
    /// [`WorkRequest`] first, its fields went through memory once more and its opcode was
    /// matched again (some 20 instructions a message).
    #[inline(always)]
    pub(crate) fn post_write_with_imm(
        &self,
        wr_id: u64,
        (remote_addr, rkey): (u64, u32),
        imm: u32,
        payload: Payload<'_>,
        signaled: bool,
    ) -> io::Result<()> {
        self.post_one_with(wr_id, payload, signaled, |wr| {
            set_write_with_imm(wr, remote_addr, rkey, imm);
        })
    }

    /// Posts one request alone: `payload`'s gather entries on the stack, `set_op` writing the
    /// opcode and its operands into the zeroed request.
    #[inline(always)]
    fn post_one_with(
        &self,
        wr_id: u64,
        payload: Payload<'_>,
        signaled: bool,
        set_op: impl FnOnce(&mut sys::ibv_send_wr),
    ) -> io::Result<()> {
        let (count, inline) = gather_shape(self, payload)?;
        let mut entries = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SEGMENTS];
        match inline {
            Some(bytes) => {
                entries[0].write(sys::ibv_sge {
                    addr: bytes.as_ptr() as u64,
                    length: bytes.len() as u32,
                    lkey: 0,
                });
            }
            None => gather_entries(self, payload, &mut entries[..count])?,
        }
        // SAFETY: ibv_send_wr is plain old data; zero is valid for every field.
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        fill_send_wr(&mut wr, wr_id, count, inline.is_some(), signaled);
        set_op(&mut wr);
        if count > 0 {
            wr.sg_list = entries.as_mut_ptr().cast::<sys::ibv_sge>();
        }
        // SAFETY: `wr` is one request (`next` null) whose `count` gather entries were
        // initialised above: checked by `gather_entries` against buffers this QP owns, which
        // stay allocated and registered until after the QP is destroyed (an attached buffer stays
        // with the QP until its owner reclaims it, after the completion covering this request
        // was polled), or, inline, the caller's bytes, borrowed for this call and checked
        // against the QP's inline limit by `gather_shape`; the provider copies them during the
        // call.
        unsafe { self.post_send_owned(&mut wr) }
    }
}

/// A request's number of gather entries, and its inline bytes if it has an inline payload,
/// after checking the payload's shape against `qp` (its segment count, its inline limit).
/// Always inlined, its errors out of line: it runs for every post, and as a call of its own
/// it cost a streamed 64 B message some 30 instructions.
#[inline(always)]
fn gather_shape<'p>(
    qp: &OwnedBufferQueuePair,
    payload: Payload<'p>,
) -> io::Result<(usize, Option<&'p [u8]>)> {
    Ok(match payload {
        Payload::Empty => (0, None),
        Payload::Segments(segments) if segments.len() > MAX_SEGMENTS => {
            return Err(error::invalid_input("too many gather segments"));
        }
        Payload::Segments(segments) => (segments.len(), None),
        Payload::Attached { .. } => (1, None),
        Payload::Inline(bytes) => {
            // The device must copy the bytes while posting: a longer "inline" request would
            // leave it reading `bytes` after the post returned.
            let limit = qp.max_inline_data();
            if bytes.len() > limit as usize {
                return Err(over_inline_limit(bytes.len(), limit));
            }
            (usize::from(!bytes.is_empty()), Some(bytes))
        }
    })
}

/// The error of an inline payload of `len` bytes over the queue pair's `limit`.
#[cold]
#[inline(never)]
fn over_inline_limit(len: usize, limit: u32) -> io::Error {
    error::invalid_input(format!(
        "{len} bytes exceed the queue pair's inline limit of {limit}"
    ))
}

/// Writes the gather entries of a payload in registered memory (segments of `qp`'s buffers,
/// or a buffer attached to it) into `entries`, checking each range; `entries` is as long as
/// [`gather_shape`] counted. Inline and empty payloads have none here.
#[inline]
fn gather_entries(
    qp: &OwnedBufferQueuePair,
    payload: Payload<'_>,
    entries: &mut [MaybeUninit<sys::ibv_sge>],
) -> io::Result<()> {
    match payload {
        Payload::Segments(segments) => {
            for (entry, seg) in entries.iter_mut().zip(segments) {
                entry.write(qp.sge(*seg)?);
            }
        }
        Payload::Attached { id, offset, len } => {
            entries[0].write(qp.attached_sge(id, offset, len)?);
        }
        Payload::Empty | Payload::Inline(_) => {}
    }
    Ok(())
}

/// Fills the zeroed send request `wr`'s id, its count of gather entries (`sg_list` and `next`
/// left null) and its flags, in place; the opcode is the caller's to set.
#[inline]
fn fill_send_wr(wr: &mut sys::ibv_send_wr, wr_id: u64, count: usize, inline: bool, signaled: bool) {
    wr.wr_id = wr_id;
    wr.num_sge = count as i32;
    if inline {
        wr.send_flags |= sys::ibv_send_flags::IBV_SEND_INLINE;
    }
    if signaled {
        wr.send_flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED;
    }
}

impl std::fmt::Debug for SendChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendChain")
            .field("len", &self.len)
            .field("posts", &self.posts)
            .finish_non_exhaustive()
    }
}
