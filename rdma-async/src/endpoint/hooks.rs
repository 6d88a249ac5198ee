//! Test hooks on [`Endpoint`] (`--cfg rdma_async_hooks`, which this workspace's own builds set):
//! how tests play a peer that fails or vanishes, and look at queue pair state a user cannot see.
//! Free functions taking the endpoint, so `Endpoint` itself carries none of them.

use std::io;
use std::sync::atomic::Ordering;

use super::Endpoint;

/// How many send completions `ep` has reaped (only some sends are signaled).
pub fn send_completions(ep: &Endpoint) -> u64 {
    ep.send_completions.load(Ordering::Relaxed)
}

/// Messages `ep` has received and not yet handed to `recv` (none while a receiver holds them).
pub fn queued_messages(ep: &Endpoint) -> Option<usize> {
    ep.recv.try_lock().ok().map(|slots| slots.ready.len())
}

/// The most completions one look at a queue hands over before the caller gets its message:
/// what a peer sending without pause can queue per `recv`.
pub const REAP_LIMIT: usize = crate::cm::REAP_LIMIT;

/// The ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an id option
/// reached it.
///
/// # Errors
///
/// The error of `ibv_query_qp`.
pub fn ack_timeout(ep: &Endpoint) -> io::Result<u8> {
    ep.link.qp_ack_timeout()
}

/// The RNR timer of the queue pair (`ibv_query_qp`), to check that `ConnParams::min_rnr_timer`
/// reached it.
///
/// # Errors
///
/// The error of `ibv_query_qp`.
pub fn min_rnr_timer(ep: &Endpoint) -> io::Result<u8> {
    ep.link.qp_min_rnr_timer()
}

/// Sets the RNR timer of the queue pair as the handshake does, which must also succeed once the
/// queue pair failed (a peer may fail it before the handshake sets it).
///
/// # Errors
///
/// The error of `ibv_modify_qp` on a queue pair that has not failed.
pub fn set_min_rnr_timer(ep: &Endpoint, code: u8) -> io::Result<()> {
    ep.link.set_qp_min_rnr_timer(code)
}

/// The next receive `ep` posts fails (as `ibv_post_recv` returning `ENOMEM`), to check that such
/// a failure ends the connection with that cause.
pub fn fail_next_post_recv(ep: &Endpoint) {
    ep.qp.fail_next_post_recv();
}

/// This end goes silent without telling the peer (its queue pair moves to the error state, no
/// rdma_cm disconnect is sent), so the peer sees a host that vanished.
///
/// # Errors
///
/// The error of `ibv_modify_qp`.
pub fn vanish(ep: &Endpoint) -> io::Result<()> {
    ep.qp.set_error()
}
