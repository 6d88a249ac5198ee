//! Posting caller memory through an in-flight table: the segments of a request are checked
//! against the buffers held for it, the buffers move into a slot of the table, and only then is
//! the request posted (if posting fails, the slot is freed and the buffers come back). The
//! caller-memory queue pair and the shared receive queue both post this way.

use std::io;
use std::ptr;
use std::task::Waker;

use rdma_async_sys as sys;

use super::in_flight::{Held, InFlightTable, Ticket, WorkQueue};
use super::work_request::{MAX_SEGMENTS, Segment};
use crate::error;

/// An unused scatter/gather entry.
const NO_SGE: sys::ibv_sge = sys::ibv_sge {
    addr: 0,
    length: 0,
    lkey: 0,
};

/// Checks `segments` against the buffers they index and builds their scatter/gather entries.
fn held_sges(
    held: &Held,
    segments: &[Segment],
    max: u32,
    sges: &mut [sys::ibv_sge; MAX_SEGMENTS],
) -> io::Result<usize> {
    if segments.len() > max as usize || segments.len() > MAX_SEGMENTS {
        return Err(error::invalid_input(format!(
            "{} scatter/gather segments; this queue pair takes at most {max}",
            segments.len()
        )));
    }
    for (sge, seg) in sges.iter_mut().zip(segments) {
        *sge = held_sge(held, seg)?;
    }
    Ok(segments.len())
}

/// The scatter/gather entry of `seg`, checked against the buffer of `held` it indexes. Inlined
/// (every single-buffer operation checks its one segment here), its errors built out of line.
#[inline(always)]
pub(super) fn held_sge(held: &Held, seg: &Segment) -> io::Result<sys::ibv_sge> {
    let Some(buf) = held.get(seg.buffer) else {
        return Err(no_buffer(seg.buffer));
    };
    let buf = buf.registered();
    if seg
        .offset
        .checked_add(seg.len)
        .is_none_or(|end| end > buf.len())
    {
        return Err(outside_region(seg, buf.len()));
    }
    let Ok(length) = u32::try_from(seg.len) else {
        return Err(segment_too_long());
    };
    Ok(sys::ibv_sge {
        addr: buf.addr(seg.offset),
        length,
        lkey: buf.lkey(),
    })
}

/// [`held_sge`]'s error for a segment naming a buffer that is not held. Cold and out of line,
/// as the next two: checked on every post, they never fail for a well-formed operation.
#[cold]
#[inline(never)]
fn no_buffer(index: usize) -> io::Error {
    error::invalid_input(format!("no buffer {index}"))
}

/// [`held_sge`]'s error for a segment beyond its `len`-byte region.
#[cold]
#[inline(never)]
fn outside_region(seg: &Segment, len: usize) -> io::Error {
    error::invalid_input(format!(
        "range {}..{} is outside the {len}-byte region",
        seg.offset,
        seg.offset.saturating_add(seg.len),
    ))
}

/// [`held_sge`]'s error for a segment longer than a scatter/gather entry can say.
#[cold]
#[inline(never)]
fn segment_too_long() -> io::Error {
    error::invalid_input("a segment is longer than 4 GiB")
}

/// Posts a receive of caller memory through `post` (a queue pair's or a shared receive queue's
/// `ibv_post_recv`), holding the buffers in `table` first.
pub(super) fn post_recv_into(
    table: &InFlightTable,
    held: Held,
    segments: &[Segment],
    max_sge: u32,
    post: impl FnOnce(*mut sys::ibv_recv_wr, *mut *mut sys::ibv_recv_wr) -> io::Result<()>,
) -> Result<Ticket, (io::Error, Held)> {
    hold_and_post(
        table,
        WorkQueue::Recv,
        held,
        segments,
        max_sge,
        None,
        |wr_id, sges| {
            // SAFETY: ibv_recv_wr is plain old data; zero is valid for every field.
            let mut wr: sys::ibv_recv_wr = unsafe { std::mem::zeroed() };
            wr.wr_id = wr_id;
            wr.sg_list = sges.as_mut_ptr();
            wr.num_sge = sges.len() as i32;
            let mut bad = ptr::null_mut();
            post(&mut wr, &mut bad)
        },
    )
}

/// Checks `segments` against the buffers of `held`, moves `held` into a slot of `table` for
/// `queue` (with `waker`, the waiter's, when given), and has `post` post a work request with
/// the slot's `wr_id` over the checked scatter/gather entries. If posting fails the slot is
/// freed and the buffers come back.
pub(super) fn hold_and_post(
    table: &InFlightTable,
    queue: WorkQueue,
    held: Held,
    segments: &[Segment],
    max_sge: u32,
    waker: Option<&Waker>,
    post: impl FnOnce(u64, &mut [sys::ibv_sge]) -> io::Result<()>,
) -> Result<Ticket, (io::Error, Held)> {
    // One segment (every single-buffer operation) needs neither the full array nor the loop.
    let mut one = [NO_SGE];
    let mut many = None;
    let checked = match segments {
        [seg] if max_sge >= 1 => held_sge(&held, seg).map(|sge| {
            one[0] = sge;
            &mut one[..]
        }),
        _ => {
            let sges = many.insert([NO_SGE; MAX_SEGMENTS]);
            held_sges(&held, segments, max_sge, sges).map(move |n| &mut sges[..n])
        }
    };
    let sges = match checked {
        Ok(sges) => sges,
        Err(e) => return Err((e, held)),
    };
    let (ticket, wr_id) = match waker {
        Some(waker) => table.insert_waiting(held, queue, waker)?,
        None => table.insert(held, queue)?,
    };
    if let Err(e) = post(wr_id, sges) {
        return Err((e, table.take_back(ticket)));
    }
    Ok(ticket)
}
