//! Setting a stream up: the queue pair, its registered rings and the protocol state, and the
//! exchange of rsockets connection data.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use crate::proto::{
    ConnData, Connection, LocalLayout, ProtoError, TARGET_SGL_BYTES, WR_ID_RECV_FLAG,
};
use crate::reactor::AsyncCq;
use crate::stream::lending_ring::{WINDOW_WRS, lending_ring};
use crate::stream::options::RStreamOptions;
use crate::verbs::{
    Access, CmId, OwnedBufferQueuePair, ProtectionDomain, QpCaps, RegisteredBuffer, page_size,
};

use super::{CTRL_SLOT, CTRL_SLOTS, SPARE_RECVS};

/// What the handshake builds before connecting or accepting.
pub(in crate::stream) struct StreamParts {
    pub(super) qp: OwnedBufferQueuePair,
    pub(super) cq: AsyncCq,
    pub(super) conn: Connection,
    /// Receives posted beyond the credits' `rq_size` ([`spare_recvs`]).
    pub(super) spare_recvs: usize,
}

/// Creates the queue pair, rings and protocol state on `id`'s device; returns them with the
/// 40-byte rsockets connection data to send.
pub(in crate::stream) fn build(
    id: &Arc<CmId>,
    opts: &RStreamOptions,
) -> io::Result<(StreamParts, Option<Vec<u8>>)> {
    let config = opts.config();
    let pd = opts.dial.context_for(id)?.pd().clone();
    let spare_recvs = spare_recvs(config.rq_size(), &pd);
    let recv_depth = config.rq_size() + spare_recvs as u32;
    let entries = config.sq_size() + recv_depth;
    let async_cq = if opts.shared_channels {
        AsyncCq::create_shared(id, entries, opts.queue.busy_poll)?
    } else {
        AsyncCq::create(id, entries, opts.queue.busy_poll)?
    };
    let cq = async_cq.queue();
    let remote_write = Access {
        remote_write: true,
        ..Access::default()
    };
    let sbuf = RegisteredBuffer::new(pd.clone(), config.sbuf_size() as usize, Access::default())?;
    let (rbuf, windows, ring_keys) = if opts.zero_copy_reads {
        lending_ring(&pd, config.rbuf_size() as usize)?
    } else {
        let rbuf = RegisteredBuffer::new(pd.clone(), config.rbuf_size() as usize, remote_write)?;
        (rbuf, Vec::new(), None)
    };
    let target_sgl = RegisteredBuffer::new(pd.clone(), TARGET_SGL_BYTES, remote_write)?;
    let ctrl = RegisteredBuffer::new(pd.clone(), CTRL_SLOT * CTRL_SLOTS, Access::default())?;
    let layout = LocalLayout {
        rbuf_addr: rbuf.addr(0),
        rbuf_rkey: rbuf.rkey(),
        target_sgl_addr: target_sgl.addr(0),
        target_sgl_rkey: target_sgl.rkey(),
        ring_keys,
    };
    // Room for the window binds and invalidations besides rsockets' own sends.
    let window_wrs = if ring_keys.is_some() { WINDOW_WRS } else { 0 };
    let caps = QpCaps {
        max_send_wr: config.sq_size() + window_wrs,
        max_recv_wr: recv_depth,
        max_inline_data: config.inline_size(),
        max_send_sge: 2,
    };
    let qp = OwnedBufferQueuePair::new(
        id.clone(),
        pd,
        cq.clone(),
        cq.clone(),
        caps,
        vec![sbuf, rbuf, target_sgl, ctrl],
        windows,
    )?;
    // The provider may grant more inline room than asked; rsockets uses what it got.
    let config = config.with_inline_size(qp.max_inline_data());
    let conn = Connection::new(config, layout);
    // RDMA writes with immediate need receives without buffers; all are posted before the
    // peer can send anything.
    qp.post_empty_recvs(WR_ID_RECV_FLAG, recv_depth as usize)?;
    let conn_data = conn.local_conn_data().encode().to_vec();
    Ok((
        StreamParts {
            qp,
            cq: async_cq,
            conn,
            spare_recvs,
        },
        Some(conn_data),
    ))
}

/// Queues this deep fit every device's `max_qp_wr` that we know of (rxe's and siw's are 16384,
/// mlx5's 32768): below it the device is not asked.
const DEEP_QUEUE: u32 = 4096;

/// The receives to post beyond `rq_size` ([`SPARE_RECVS`]), as many as `pd`'s device takes: a
/// queue of `rq_size` at its `max_qp_wr` gets none, and each consumed receive goes back at
/// once.
fn spare_recvs(rq_size: u32, pd: &ProtectionDomain) -> usize {
    spares_within(rq_size, || pd.max_qp_wr())
}

/// [`spare_recvs`] on a device whose `max_qp_wr` the query gives.
fn spares_within(rq_size: u32, max_qp_wr: impl FnOnce() -> Option<u32>) -> usize {
    let wanted = SPARE_RECVS as u32;
    if rq_size + wanted <= DEEP_QUEUE {
        return SPARE_RECVS;
    }
    // A failed query leaves the spares out: the queue pair's own creation reports the cause.
    let room = max_qp_wr().map_or(0, |max| max.saturating_sub(rq_size));
    room.min(wanted) as usize
}

/// The bytes of memory that [`build`] registers for one stream with `opts`, counted as the
/// locked-memory limit counts them: whole pages, once per registration (the zero-copy receive
/// ring is registered whole and then in four halves, so it counts three times).
pub(in crate::stream) fn pinned_bytes(opts: &RStreamOptions) -> usize {
    let config = opts.config();
    let page = page_size();
    let pages = |len: usize| len.div_ceil(page) * page;
    let rbuf = pages(config.rbuf_size() as usize);
    let rbuf = if opts.zero_copy_reads { 3 * rbuf } else { rbuf };
    pages(config.sbuf_size() as usize)
        + rbuf
        + pages(TARGET_SGL_BYTES)
        + pages(CTRL_SLOT * CTRL_SLOTS)
}

/// Decodes and applies the peer's connection data.
pub(in crate::stream) fn apply_peer_conn_data(
    parts: &mut StreamParts,
    data: &[u8],
    peer: SocketAddr,
) -> io::Result<()> {
    let peer_data = ConnData::decode(data).map_err(|e| invalid_conn_data(e, peer))?;
    parts
        .conn
        .handle_peer_conn_data(&peer_data)
        .map_err(|e| invalid_conn_data(e, peer))
}

fn invalid_conn_data(err: ProtoError, peer: SocketAddr) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidData,
        format!("{peer} sent invalid rsockets connection data: {err}"),
    )
}

#[cfg(test)]
mod tests {
    use super::{DEEP_QUEUE, SPARE_RECVS, spares_within};

    #[test]
    fn spare_receives_fit_the_device_and_shallow_queues_do_not_ask_it() {
        let never = || -> Option<u32> { panic!("a shallow queue asked the device") };
        assert_eq!(spares_within(384, never), SPARE_RECVS);
        assert_eq!(
            spares_within(DEEP_QUEUE - SPARE_RECVS as u32, never),
            SPARE_RECVS
        );
        let rxe = || Some(16384);
        assert_eq!(spares_within(8192, rxe), SPARE_RECVS);
        assert_eq!(
            spares_within(16380, rxe),
            4,
            "the room left below the limit"
        );
        assert_eq!(spares_within(16384, rxe), 0, "a queue at the limit");
        assert_eq!(
            spares_within(20000, rxe),
            0,
            "a queue beyond it (its creation fails)"
        );
        assert_eq!(spares_within(8192, || None), 0, "a failed query");
    }
}
