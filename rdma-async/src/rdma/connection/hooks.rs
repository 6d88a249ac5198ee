//! Test hooks on [`RdmaConnection`] (`--cfg rdma_async_hooks`, which this workspace's own builds
//! set; reached as `rdma_async::rdma::hooks`): how tests make the connection's polling or
//! posting fail, or the connection vanish, and look at queue pair state a user cannot see. Free
//! functions taking the connection, so `RdmaConnection` itself carries none of them.

use std::io;

use super::RdmaConnection;

/// The ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an id option
/// reached it.
///
/// # Errors
///
/// The error of `ibv_query_qp`.
pub fn ack_timeout(conn: &RdmaConnection) -> io::Result<u8> {
    conn.shared.link.qp_ack_timeout()
}

/// The RNR timer of the queue pair (`ibv_query_qp`), to check that `ConnParams::min_rnr_timer`
/// reached it.
///
/// # Errors
///
/// The error of `ibv_query_qp`.
pub fn min_rnr_timer(conn: &RdmaConnection) -> io::Result<u8> {
    conn.shared.link.qp_min_rnr_timer()
}

/// The completion task's next wait fails as if `ibv_poll_cq` had failed, which ends the
/// connection: every pending operation ends with that cause, as does every later one. The task
/// waits only when woken, so the next completion (or disconnect) triggers it.
pub fn fail_next_poll(conn: &RdmaConnection) {
    conn.shared.cq.fail_next_poll();
}

/// The next `ibv_post_send` of requests that several operations left to share a doorbell fails
/// (`ENOMEM`, as a provider refusing the chain would), and none of them is posted.
pub fn fail_next_chained_post(conn: &RdmaConnection) {
    conn.shared.qp.fail_next_ring();
}

/// The provider refuses the next [`RdmaConnection::write_batch`]'s list (`ENOMEM`): with
/// `tail`, only its last request, after posting the others (whose buffers only destroying the
/// queue pair can then settle, so the connection ends); else its first, so none is posted.
pub fn fail_next_batch(conn: &RdmaConnection, tail: bool) {
    conn.shared.qp.fail_next_batch(tail);
}

/// This end goes silent without telling the peer (its queue pair moves to the error state, no
/// rdma_cm disconnect is sent), so the peer sees a host that vanished.
///
/// # Errors
///
/// The error of `ibv_modify_qp`.
pub fn vanish(conn: &RdmaConnection) -> io::Result<()> {
    conn.shared.qp.set_error()
}
