//! Test hooks on [`RStream`] (`--cfg rdma_async_hooks`, which this workspace's own builds set):
//! how tests play a peer that breaks the protocol, floods, or vanishes, and look at state a user
//! cannot see. Free functions taking the stream, so `RStream` itself carries none of them.

use std::io;

use super::RStream;
use super::options::RStreamOptions;

/// Sends the raw immediate word `imm` to the peer outside the protocol, to check how a peer
/// handles a protocol violation. It breaks the stream.
///
/// # Errors
///
/// The error of `ibv_post_send`.
pub fn send_raw_immediate(stream: &RStream, imm: u32) -> io::Result<()> {
    stream.inner.core().send_raw_immediate(imm)
}

/// Bytes received and not yet read.
///
/// # Errors
///
/// Polling the completion queue failed.
pub fn readable_len(stream: &RStream) -> io::Result<usize> {
    stream.inner.core().readable_len()
}

/// The address the peer's grant in our target SGL slot `slot` takes the next byte at, and its
/// key.
pub fn peer_grant(stream: &RStream, slot: usize) -> Option<(u64, u32)> {
    stream.inner.core().peer_grant(slot)
}

/// RDMA-writes `bytes` (inline) to `remote_addr` under `rkey`, outside the protocol, and waits
/// until the write completed (it breaks the stream: its completion is not one the protocol
/// expects). For a test of what a peer can still reach.
///
/// # Errors
///
/// The error of `ibv_post_send`.
pub async fn raw_write(
    stream: &RStream,
    remote_addr: u64,
    rkey: u32,
    bytes: &[u8],
) -> io::Result<()> {
    stream
        .inner
        .core()
        .raw_write(remote_addr, rkey, bytes)
        .await
}

/// The rsockets connection data a connection request with `options` carries (its rings at
/// made-up addresses), for a test that plays a client which sends a request and never completes
/// the handshake (`cm::ParkedConnect`).
pub fn request_data(options: &RStreamOptions) -> Vec<u8> {
    let layout = crate::proto::LocalLayout {
        ring_keys: None,
        rbuf_addr: 0x1000,
        rbuf_rkey: 1,
        target_sgl_addr: 0x2000,
        target_sgl_rkey: 2,
    };
    crate::proto::Connection::new(options.config(), layout)
        .local_conn_data()
        .encode()
        .to_vec()
}

/// Posts up to `max` 0-byte DATA messages, as many as the peer's credits allow now, and returns
/// how many (0: await [`RStream::writable`]). They are valid rsockets messages that carry
/// nothing: how a test floods a peer.
///
/// # Errors
///
/// The connection's error, or that of `ibv_post_send`.
pub fn send_empty_messages(stream: &RStream, max: usize) -> io::Result<usize> {
    stream.inner.core().send_empty_messages(max)
}

/// The ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an id option
/// reached it.
///
/// # Errors
///
/// The error of `ibv_query_qp`.
pub fn ack_timeout(stream: &RStream) -> io::Result<u8> {
    stream.inner.core().link().qp_ack_timeout()
}

/// This end goes silent without telling the peer (its queue pair moves to the error state, no
/// rdma_cm disconnect is sent), so the peer sees a host that vanished.
///
/// # Errors
///
/// The error of `ibv_modify_qp`.
pub fn vanish(stream: &RStream) -> io::Result<()> {
    stream.inner.core().vanish()
}

/// The next receive this stream posts fails (as `ibv_post_recv` returning `ENOMEM`), to check
/// that such a failure ends the stream with that cause.
pub fn fail_next_post_recv(stream: &RStream) {
    stream.inner.core().fail_next_post_recv();
}
