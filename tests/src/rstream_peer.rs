//! The data exchange of librdmacm's C `rstream` in verify mode (`-T v`), so a test can be its
//! peer.

use rdma_async::stream::RStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// rstream's `-T v` data: one running byte counter per direction, from process start.
#[derive(Debug, Default)]
pub struct Counter(u8);

impl Counter {
    /// Fills `buf` with the next bytes of the sequence.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.0;
            self.0 = self.0.wrapping_add(1);
        }
    }

    /// Checks that `buf` holds the next bytes of the sequence.
    pub fn check(&mut self, buf: &[u8]) {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, self.0, "rstream -T v data mismatch at byte {i}");
            self.0 = self.0.wrapping_add(1);
        }
    }
}

/// One side of rstream's exchange: 16-byte sync, then `iters` rounds of `xfers` transfers of
/// `size` bytes client→server followed by the same server→client.
pub async fn rstream_exchange(
    stream: &mut RStream,
    client: bool,
    size: usize,
    xfers: usize,
    iters: usize,
) {
    let (mut tx, mut rx) = (Counter::default(), Counter::default());
    let mut buf = vec![0u8; size.max(16)];
    if client {
        send(stream, &mut tx, &mut buf[..16]).await;
        recv(stream, &mut rx, &mut buf[..16]).await;
    } else {
        recv(stream, &mut rx, &mut buf[..16]).await;
        send(stream, &mut tx, &mut buf[..16]).await;
    }
    for _ in 0..iters {
        for sending in [client, !client] {
            for _ in 0..xfers {
                if sending {
                    send(stream, &mut tx, &mut buf[..size]).await;
                } else {
                    recv(stream, &mut rx, &mut buf[..size]).await;
                }
            }
        }
    }
}

/// Sends the next `buf.len()` bytes of `tx`'s sequence.
pub async fn send(stream: &mut RStream, tx: &mut Counter, buf: &mut [u8]) {
    tx.fill(buf);
    stream.write_all(buf).await.expect("send to C rstream");
}

/// Receives `buf.len()` bytes and checks them against `rx`'s sequence.
pub async fn recv(stream: &mut RStream, rx: &mut Counter, buf: &mut [u8]) {
    stream
        .read_exact(buf)
        .await
        .expect("receive from C rstream");
    rx.check(buf);
}

/// C rstream's arguments for a blocking, verifying custom run (`-T b -T v`) of `iters` rounds
/// of `xfers` transfers of `size` bytes each way.
pub fn c_rstream_verify_args(size: usize, xfers: usize, iters: usize) -> Vec<String> {
    crate::argv!["-T", "b", "-T", "v", "-S", size, "-C", xfers, "-I", iters]
}

/// Our server's side of a run with a C `rstream` client: the exchange, then the client's EOF
/// (it shuts down after its last read) with no byte after the exchange.
pub async fn serve_c_rstream_client(stream: &mut RStream, size: usize, xfers: usize, iters: usize) {
    crate::guard(
        "exchange with C rstream",
        rstream_exchange(stream, false, size, xfers, iters),
    )
    .await;
    let mut rest = Vec::new();
    crate::guard("EOF from C rstream", stream.read_to_end(&mut rest))
        .await
        .unwrap();
    assert!(rest.is_empty(), "C rstream sent bytes after the exchange");
}
