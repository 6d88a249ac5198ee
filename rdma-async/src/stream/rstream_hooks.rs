//! Test hooks on [`RStream`] (feature `test-hooks`): how tests play a peer that breaks the
//! protocol, floods, or vanishes, and look at state a user cannot see.

use std::io;

use super::RStream;
use super::options::RStreamOptions;

impl RStream {
    /// Test hook: sends the raw immediate word `imm` to the peer outside the protocol, to
    /// check how a peer handles a protocol violation. It breaks the stream.
    ///
    /// # Errors
    ///
    /// The error of `ibv_post_send`.
    #[doc(hidden)]
    pub fn __send_raw_immediate(&self, imm: u32) -> io::Result<()> {
        self.inner.core().send_raw_immediate(imm)
    }

    /// Test hook: bytes received and not yet read.
    ///
    /// # Errors
    ///
    /// Polling the completion queue failed.
    #[doc(hidden)]
    pub fn __readable_len(&self) -> io::Result<usize> {
        self.inner.core().readable_len()
    }

    /// Test hook: the address the peer's grant in our target SGL slot `slot` takes the next
    /// byte at, and its key.
    #[doc(hidden)]
    pub fn __peer_grant(&self, slot: usize) -> Option<(u64, u32)> {
        self.inner.core().peer_grant(slot)
    }

    /// Test hook: RDMA-writes `bytes` (inline) to `remote_addr` under `rkey`, outside the
    /// protocol, and waits until the write completed (it breaks the stream: its completion is
    /// not one the protocol expects). For a test of what a peer can still reach.
    ///
    /// # Errors
    ///
    /// The error of `ibv_post_send`.
    #[doc(hidden)]
    pub async fn __raw_write(&self, remote_addr: u64, rkey: u32, bytes: &[u8]) -> io::Result<()> {
        self.inner.core().raw_write(remote_addr, rkey, bytes).await
    }

    /// Test hook: the rsockets connection data a connection request with `options` carries
    /// (its rings at made-up addresses), for a test that plays a client which sends a request
    /// and never completes the handshake (`cm::ParkedConnect`).
    #[doc(hidden)]
    pub fn __request_data(options: &RStreamOptions) -> Vec<u8> {
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

    /// Test hook: posts up to `max` 0-byte DATA messages, as many as the peer's credits allow
    /// now, and returns how many (0: await [`Self::writable`]). They are valid rsockets
    /// messages that carry nothing: how a test floods a peer.
    ///
    /// # Errors
    ///
    /// The connection's error, or that of `ibv_post_send`.
    #[doc(hidden)]
    pub fn __send_empty_messages(&self, max: usize) -> io::Result<usize> {
        self.inner.core().send_empty_messages(max)
    }

    /// Test hook: the ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an
    /// id option reached it.
    ///
    /// # Errors
    ///
    /// The error of `ibv_query_qp`.
    #[doc(hidden)]
    pub fn __ack_timeout(&self) -> io::Result<u8> {
        self.inner.core().link().qp_ack_timeout()
    }

    /// Test hook: this end goes silent without telling the peer (its queue pair moves to the
    /// error state, no rdma_cm disconnect is sent), so the peer sees a host that vanished.
    #[doc(hidden)]
    pub fn __vanish(&self) -> io::Result<()> {
        self.inner.core().vanish()
    }

    /// Test hook: the next receive this stream posts fails (as `ibv_post_recv` returning
    /// `ENOMEM`), to check that such a failure ends the stream with that cause.
    #[doc(hidden)]
    pub fn __fail_next_post_recv(&self) {
        self.inner.core().fail_next_post_recv();
    }
}
