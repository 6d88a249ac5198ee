//! `RStream::read_lent`: received bytes lent from the receive ring without a copy, once the
//! peer's access to their half is revoked; what a peer can no longer reach (a stale first key,
//! a stale window key); copying where lending is not possible; C rsockets writing to a lending
//! ring.

use rdma_async::stream::hooks;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::rstream_peer::{Counter, c_rstream_verify_args, send};
use rdma_async_device_tests::tools::finish_tool_printing;
use rdma_async_device_tests::{guard, rlistener_with, spawn_tool, stream_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The receive ring of these tests: two halves of 32 KiB.
const RING: usize = 64 << 10;
const HALF: usize = RING / 2;

fn lending() -> RStreamOptions {
    RStreamOptions::new()
        .recv_buffer_size(RING as u32)
        .zero_copy_reads(true)
}

/// Waits until at least `n` bytes are readable (the writer goes on by itself; this only looks).
async fn until_readable(stream: &RStream, n: usize) {
    while hooks::readable_len(stream).unwrap() < n {
        stream.readable().await.unwrap();
        tokio::task::yield_now().await;
    }
}

/// How a test reads: `read_lent` after waiting for a full half whenever a half or more is
/// still to come (`Behind`), or `read_lent_exact` (`Whole`).
#[derive(Clone, Copy)]
enum Reading {
    Behind,
    Whole,
}

/// Reads `len` bytes; returns them and how many were lent.
async fn read_all(stream: &mut RStream, len: usize, how: Reading) -> (Vec<u8>, usize) {
    let mut got = Vec::with_capacity(len);
    let mut lent = 0;
    while got.len() < len {
        let left = len - got.len();
        let bytes = match how {
            Reading::Behind => {
                if left >= HALF {
                    until_readable(stream, HALF).await;
                }
                stream.read_lent(HALF).await.unwrap()
            }
            Reading::Whole => stream.read_lent_exact(left).await.unwrap(),
        };
        assert!(!bytes.is_empty(), "EOF after {} of {len} bytes", got.len());
        if bytes.is_lent() {
            lent += bytes.len();
        }
        got.extend_from_slice(&bytes);
    }
    (got, lent)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_by_a_half_borrows_every_byte_and_sees_the_stream_intact() {
    const LEN: usize = 8 * HALF;
    let (mut server, mut client) = stream_pair(lending()).await;
    let data = pattern(3, LEN);
    let sent = data.clone();
    let writer = tokio::spawn(async move {
        client.write_all(&sent).await.unwrap();
        client.shutdown().await.unwrap();
        client
    });
    let (got, lent) = guard("lent reads", read_all(&mut server, LEN, Reading::Behind)).await;
    assert!(got == data, "the stream differs from what was written");
    assert_eq!(
        lent, LEN,
        "every read waited for a full half, so every byte is lent"
    );
    let stats = server.stats();
    assert_eq!(stats.lent_bytes, LEN as u64, "{stats:?}");
    assert_eq!(stats.bytes_received, LEN as u64, "{stats:?}");
    // End of stream reads as empty.
    let end = guard("EOF", server.read_lent(16)).await.unwrap();
    assert!(end.is_empty() && !end.is_lent());
    drop(end);
    guard("writer", writer).await.unwrap();
}

/// Writes `data` in 1000-byte writes (a reader is never behind by much), then shuts down.
async fn write_in_small_pieces(mut client: RStream, data: Vec<u8>) -> RStream {
    for chunk in data.chunks(1000) {
        client.write_all(chunk).await.unwrap();
    }
    client.shutdown().await.unwrap();
    client
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_asking_for_whole_halves_borrows_every_byte_while_keeping_up() {
    const LEN: usize = 8 * HALF;
    let (mut server, client) = stream_pair(lending()).await;
    let data = pattern(4, LEN + 100);
    let sent = data.clone();
    let writer = tokio::spawn(write_in_small_pieces(client, sent));
    let (got, lent) = guard("whole halves", read_all(&mut server, LEN, Reading::Whole)).await;
    assert!(got == data[..LEN], "the stream differs");
    assert_eq!(lent, LEN, "each piece asked to the end of its half");
    // 100 bytes are left, in a half the writer will not fill: asking for them copies them;
    // asking for more than the stream has left ends with UnexpectedEof.
    let tail = guard("tail", server.read_lent_exact(100)).await.unwrap();
    assert!(!tail.is_lent() && tail[..] == data[LEN..]);
    drop(tail);
    let end = guard("past the end", server.read_lent_exact(1)).await;
    assert_eq!(end.unwrap_err().kind(), std::io::ErrorKind::UnexpectedEof);
    guard("writer", writer).await.unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_keeping_up_copies_and_a_plain_ring_always_copies() {
    // Lending ring, reader reads whatever is there: bytes of a half still being filled are
    // copied (at most `max` at a time); the stream is intact either way.
    let plain = RStreamOptions::new().recv_buffer_size(RING as u32);
    for (options, lends) in [(lending(), true), (plain, false)] {
        let (mut server, client) = stream_pair(options).await;
        let data = pattern(5, 3 * HALF + 123);
        let sent = data.clone();
        let writer = tokio::spawn(write_in_small_pieces(client, sent));
        let mut got = Vec::new();
        loop {
            let bytes = guard("read_lent", server.read_lent(700)).await.unwrap();
            if bytes.is_empty() {
                break;
            }
            assert!(
                bytes.is_lent() || bytes.len() <= 700,
                "{} copied",
                bytes.len()
            );
            got.extend_from_slice(&bytes);
        }
        assert!(got == data, "the stream differs");
        if !lends {
            assert_eq!(server.stats().lent_bytes, 0, "a plain ring lent bytes");
        }
        guard("writer", writer).await.unwrap();
    }
}

/// Fills the first half, lends it, and has the writer aim a raw RDMA write at it with `key`
/// while it is lent: the write must fail and the lent bytes stay as they were.
async fn stale_write_into_a_lent_half(rounds_before: usize) {
    let (mut server, client) = stream_pair(lending()).await;
    let mut client = client;
    // The first grant: half 0 of the server's ring, under its first registration's key.
    let (half0, first_key) = hooks::peer_grant(&client, 0).expect("the first grant");
    // Each round fills a half and gives it back, so after two rounds half 0 is granted again,
    // now through its window.
    for round in 0..rounds_before {
        client
            .write_all(&pattern(round as u64, HALF))
            .await
            .unwrap();
        let (got, lent) = guard("round", read_all(&mut server, HALF, Reading::Behind)).await;
        assert_eq!((got.len(), lent), (HALF, HALF));
    }
    // The key half 0 is reachable through now (slot 0 is where its grants land).
    let (_, key) = hooks::peer_grant(&client, 0).expect("a grant in slot 0");
    if rounds_before == 0 {
        assert_eq!(key, first_key);
    } else {
        assert_ne!(
            key, first_key,
            "half 0 was granted again through its window"
        );
    }
    let data = pattern(9, HALF);
    client.write_all(&data).await.unwrap();
    until_readable(&server, HALF).await;
    let lent = guard("lend half 0", server.read_lent(HALF)).await.unwrap();
    assert!(lent.is_lent() && lent.len() == HALF);
    // The writer still knows the key it wrote half 0 with; the half is revoked now.
    guard(
        "stale write",
        hooks::raw_write(&client, half0, key, &[0xee; 32]),
    )
    .await
    .unwrap();
    assert!(lent[..] == data[..], "a revoked key wrote into lent bytes");
    drop(lent);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_first_key_of_a_lent_half_is_dead() {
    stale_write_into_a_lent_half(0).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_window_key_of_a_lent_half_is_dead() {
    stale_write_into_a_lent_half(2).await;
}

#[rdma_async::test]
async fn c_rstream_writes_into_a_lending_ring() {
    // C rstream in verify mode sends 4 × 256 KiB per iteration, then expects as much back.
    const SIZE: usize = 256 << 10;
    const XFERS: usize = 4;
    let listener = rlistener_with(lending()).await;
    let addr = listener.local_addr().unwrap();
    let mut args = c_rstream_verify_args(SIZE, XFERS, 1);
    args.extend(rdma_async_device_tests::argv![
        "-s",
        addr.ip(),
        "-p",
        addr.port()
    ]);
    let child = spawn_tool("rstream", &args);
    let (mut stream, _) = guard("accept from C rstream", listener.accept())
        .await
        .unwrap();
    let (mut tx, mut rx) = (Counter::default(), Counter::default());
    let (sync, _) = read_all(&mut stream, 16, Reading::Whole).await;
    rx.check(&sync);
    send(&mut stream, &mut tx, &mut [0u8; 16]).await;
    let (got, lent) = guard(
        "lent reads from C",
        read_all(&mut stream, SIZE * XFERS, Reading::Whole),
    )
    .await;
    rx.check(&got);
    // Every piece but the last asked to the end of its half and was lent. The 16-byte sync
    // moved the stream 16 bytes into the ring, so its last 16 bytes start a half the writer
    // never fills: copied.
    assert_eq!(lent, SIZE * XFERS - 16, "lent bytes");
    let mut buf = vec![0u8; SIZE];
    for _ in 0..XFERS {
        send(&mut stream, &mut tx, &mut buf).await;
    }
    let end = guard("EOF from C rstream", stream.read_lent(16))
        .await
        .unwrap();
    assert!(end.is_empty(), "C rstream sent bytes after the exchange");
    drop(end);
    finish_tool_printing(child, "rstream", &["Gb/sec"]).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_split_read_half_borrows_while_its_write_half_writes() {
    const LEN: usize = 4 * HALF;
    let (server, client) = stream_pair(lending()).await;
    let (mut server_rx, mut server_tx) = server.into_split();
    let (mut client_rx, client_tx) = client.into_split();
    let data = pattern(8, LEN);
    let sent = data.clone();
    // Both directions at once: the server's write half sends while its read half borrows.
    let client_writes = tokio::spawn(async move {
        let mut tx = client_tx;
        tx.write_all(&sent).await.unwrap();
        tx
    });
    let server_writes = tokio::spawn(async move {
        server_tx.write_all(&pattern(9, LEN)).await.unwrap();
        server_tx.shutdown().await.unwrap();
        server_tx
    });
    let mut got = Vec::new();
    let mut lent = 0;
    while got.len() < LEN {
        let piece = guard("lent piece", server_rx.read_lent_exact(LEN - got.len()))
            .await
            .unwrap();
        lent += if piece.is_lent() { piece.len() } else { 0 };
        got.extend_from_slice(&piece);
    }
    assert!(got == data, "the stream differs");
    assert_eq!(lent, LEN);
    let mut back = Vec::new();
    guard("the other direction", client_rx.read_to_end(&mut back))
        .await
        .unwrap();
    assert!(back == pattern(9, LEN));
    guard("client writer", client_writes).await.unwrap();
    guard("server writer", server_writes).await.unwrap();
}
