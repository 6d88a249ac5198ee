//! `RStream` / `RListener` on a real RDMA device, with each other and with C rsockets.

use std::io;
use std::net::SocketAddr;

use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_tests::{connect_when_listening, finish_tool, guard, spawn_tool, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn rlistener(options: RStreamOptions) -> RListener {
    RListener::bind_with(SocketAddr::new(test_ip(), 0), options)
        .await
        .expect("bind RListener")
}

/// Deterministic, position-dependent bytes, so misplaced data is caught.
fn pattern(seed: u64, len: usize) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) >> 7) as u8)
        .collect()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_of_many_sizes_wraps_the_rings() {
    // Small rings: every large message wraps both rings many times.
    let options = RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192);
    let listener = rlistener(options.clone()).await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            stream.write_all(&buf[..n]).await?;
        }
        stream.shutdown().await?;
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect_with(addr, &options))
        .await
        .unwrap();
    assert_eq!(client.peer_addr().unwrap(), addr);
    let (mut rd, mut wr) = tokio::io::split(&mut client);
    let sizes = [
        1usize,
        7,
        64,
        65,
        2047,
        2048,
        4096,
        8191,
        8192,
        8193,
        65536,
        100_000,
        1 << 20,
        4 << 20,
    ];
    let all: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u64, n))
        .collect();
    let expected: Vec<u8> = all.concat();
    let writer = async {
        for msg in &all {
            wr.write_all(msg).await?;
        }
        wr.shutdown().await
    };
    let reader = async {
        let mut got = Vec::with_capacity(expected.len());
        rd.read_to_end(&mut got).await?;
        io::Result::Ok(got)
    };
    let (w, r) = guard("echo", async { tokio::join!(writer, reader) }).await;
    w.unwrap();
    let got = r.unwrap();
    assert_eq!(got.len(), expected.len(), "bytes echoed");
    assert!(got == expected, "echoed bytes differ from what was sent");
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_both_ways() {
    let listener = rlistener(RStreamOptions::new()).await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut request = Vec::new();
        stream.read_to_end(&mut request).await?; // the client shut down writing
        assert_eq!(request, b"request, then EOF");
        stream.write_all(b"reply after the peer's EOF").await?;
        stream.shutdown().await?;
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect(addr)).await.unwrap();
    client.write_all(b"request, then EOF").await.unwrap();
    client.shutdown().await.unwrap();
    let mut reply = Vec::new();
    guard("reply", client.read_to_end(&mut reply))
        .await
        .unwrap();
    assert_eq!(reply, b"reply after the peer's EOF");
    guard("server", server).await.unwrap().unwrap();
    let err = client
        .write_all(b"x")
        .await
        .expect_err("writing after shutdown fails");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_peer_reads_as_eof_after_its_data() {
    let listener = rlistener(RStreamOptions::new()).await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        stream.write_all(&pattern(9, 300_000)).await?;
        drop(stream); // DISCONNECT after the data, like close(2)
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect(addr)).await.unwrap();
    let mut got = Vec::new();
    guard("read to EOF", client.read_to_end(&mut got))
        .await
        .unwrap();
    assert!(got == pattern(9, 300_000), "got {} bytes", got.len());
    guard("server", server).await.unwrap().unwrap();
}

// ---- interop with librdmacm's C rstream ------------------------------------------------------

/// rstream's `-T v` data: one running byte counter per direction, from process start.
#[derive(Default)]
struct Counter(u8);

impl Counter {
    fn fill(&mut self, buf: &mut [u8]) {
        for b in buf {
            *b = self.0;
            self.0 = self.0.wrapping_add(1);
        }
    }

    fn check(&mut self, buf: &[u8]) {
        for (i, &b) in buf.iter().enumerate() {
            assert_eq!(b, self.0, "rstream -T v data mismatch at byte {i}");
            self.0 = self.0.wrapping_add(1);
        }
    }
}

/// One side of rstream's exchange: 16-byte sync, then `iters` rounds of `xfers` transfers of
/// `size` bytes client→server followed by the same server→client.
async fn rstream_exchange(
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

async fn send(stream: &mut RStream, tx: &mut Counter, buf: &mut [u8]) {
    tx.fill(buf);
    stream.write_all(buf).await.expect("send to C rstream");
}

async fn recv(stream: &mut RStream, rx: &mut Counter, buf: &mut [u8]) {
    stream
        .read_exact(buf)
        .await
        .expect("receive from C rstream");
    rx.check(buf);
}

fn c_rstream(args: &[String]) -> tokio::process::Child {
    spawn_tool("rstream", args)
}

async fn finish(child: tokio::process::Child) -> String {
    finish_tool(child, "rstream").await
}

fn custom_run_args(size: usize, xfers: usize, iters: usize, extra: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "-T",
        "b",
        "-T",
        "v",
        "-S",
        &size.to_string(),
        "-C",
        &xfers.to_string(),
        "-I",
        &iters.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

#[rdma_async::test]
async fn our_client_with_c_rstream_server() {
    for (port, size, xfers, iters, extra) in [
        (17481u16, 64usize, 100usize, 10usize, &[][..]),
        (17482, 65536, 20, 5, &[][..]),
        (17483, 4096, 50, 4, &["-B", "4096"][..]),
    ] {
        let mut args = custom_run_args(size, xfers, iters, extra);
        args.extend([
            "-b".to_string(),
            test_ip().to_string(),
            "-p".to_string(),
            port.to_string(),
        ]);
        let child = c_rstream(&args);
        let addr = SocketAddr::new(test_ip(), port);
        let mut stream = connect_when_listening(|| RStream::connect(addr)).await;
        guard(
            "exchange with C rstream",
            rstream_exchange(&mut stream, true, size, xfers, iters),
        )
        .await;
        drop(stream);
        let text = finish(child).await;
        assert!(
            text.contains("Gb/sec"),
            "C rstream printed its result line:\n{text}"
        );
    }
}

#[rdma_async::test]
async fn c_rstream_client_with_our_server() {
    for (size, xfers, iters, extra) in [
        (64usize, 100usize, 10usize, &[][..]),
        (65536, 20, 5, &[][..]),
        (4096, 50, 4, &["-B", "4096"][..]),
    ] {
        let listener = rlistener(RStreamOptions::new()).await;
        let addr = listener.local_addr().unwrap();
        let mut args = custom_run_args(size, xfers, iters, extra);
        args.extend([
            "-s".to_string(),
            addr.ip().to_string(),
            "-p".to_string(),
            addr.port().to_string(),
        ]);
        let child = c_rstream(&args);
        let (mut stream, _) = guard("accept from C rstream", listener.accept())
            .await
            .unwrap();
        guard(
            "exchange with C rstream",
            rstream_exchange(&mut stream, false, size, xfers, iters),
        )
        .await;
        // The C client shuts down after its last read; we read its EOF, then close.
        let mut rest = Vec::new();
        guard("EOF from C rstream", stream.read_to_end(&mut rest))
            .await
            .unwrap();
        assert!(rest.is_empty(), "no bytes after the exchange");
        drop(stream);
        let text = finish(child).await;
        assert!(
            text.contains("Gb/sec"),
            "C rstream printed its result line:\n{text}"
        );
    }
}
