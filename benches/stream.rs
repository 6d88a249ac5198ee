//! `RStream` benchmarks: QD=1 ping-pong latency (64 B, 4 KiB, 64 KiB; p50/p99 of the round
//! trips from an HDR histogram) and streaming throughput (64 KiB and 1 MiB writes, copied and
//! zero-copy from registered memory with `write_region`; and with nothing copied either way, the
//! reader borrowing the bytes in its ring with `read_lent_exact`).
//!
//! Needs an RDMA device: run through `scripts/bench` (Soft-RoCE in a guest where there is none).
//! The C rsockets and TCP comparison of the same exchange is `scripts/compare`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::RoundTrips;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex as AsyncMutex;

/// A connected client whose peer runs `serve` on the same runtime.
fn connect<F, Fut>(rt: &tokio::runtime::Runtime, serve: F) -> Arc<AsyncMutex<RStream>>
where
    F: FnOnce(RStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    connect_with(rt, RStreamOptions::new(), serve)
}

/// [`connect`], the peer accepting with `options`.
fn connect_with<F, Fut>(
    rt: &tokio::runtime::Runtime,
    options: RStreamOptions,
    serve: F,
) -> Arc<AsyncMutex<RStream>>
where
    F: FnOnce(RStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let listener = RListener::bind_with(SocketAddr::new(common::addr(), 0), &options)
            .await
            .expect("bind");
        let target = listener.local_addr().expect("local address");
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.expect("accept");
            serve(stream).await;
        });
        Arc::new(AsyncMutex::new(
            RStream::connect(target).await.expect("connect"),
        ))
    })
}

fn ping_pong(c: &mut Criterion) {
    let rt = common::runtime();
    let client = connect(&rt, |mut server| async move {
        let mut buf = vec![0u8; 65536];
        // Echo each message back: the client always sends one whole message and waits.
        while let Ok(n) = server.read(&mut buf).await {
            if n == 0 || server.write_all(&buf[..n]).await.is_err() {
                break;
            }
        }
    });
    let mut group = c.benchmark_group("rstream_ping_pong");
    group.measurement_time(Duration::from_secs(5));
    for size in [64usize, 4096, 65536] {
        let hist = RoundTrips::new();
        group.throughput(Throughput::Bytes(2 * size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, hist) = (client.clone(), hist.clone());
                async move {
                    let mut stream = client.lock().await;
                    let (msg, mut back) = (vec![7u8; size], vec![0u8; size]);
                    hist.time(iters, async || {
                        stream.write_all(&msg).await.expect("write");
                        stream.read_exact(&mut back).await.expect("read");
                    })
                    .await
                }
            });
        });
        hist.report(&format!("rstream_ping_pong/{size}"));
    }
    group.finish();
}

fn streaming(c: &mut Criterion) {
    let rt = common::runtime();
    // The peer drains everything and answers one byte per `size` bytes, so each timed batch
    // ends when the last write has been received.
    let client = connect(&rt, |server| drain_announced(server, false));
    let mut group = c.benchmark_group("rstream_streaming");
    group.measurement_time(Duration::from_secs(5));
    for size in [65536usize, 1 << 20] {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt)
                .iter_custom(|iters| time_writes(client.clone(), size, iters, false));
        });
        // The same from registered memory, without a copy into the send ring.
        let id = BenchmarkId::new("zero_copy", size);
        group.bench_with_input(id, &size, |b, &size| {
            b.to_async(&rt)
                .iter_custom(|iters| time_writes(client.clone(), size, iters, true));
        });
    }
    group.finish();
}

/// The streaming benchmarks' peer: reads the byte count each batch announces (8 bytes), drains
/// that many bytes (copied out with `read`, or with `lent`, borrowed in the ring with
/// `read_lent_exact` and dropped), and answers one byte, so the batch's time ends when the last
/// write was received.
async fn drain_announced(mut server: RStream, lent: bool) {
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let mut len = [0u8; 8];
        if server.read_exact(&mut len).await.is_err() {
            break;
        }
        let mut pending = u64::from_le_bytes(len);
        while pending > 0 {
            let want = pending.min(buf.len() as u64) as usize;
            let got = if lent {
                server.read_lent_exact(want).await.map(|piece| piece.len())
            } else {
                server.read(&mut buf[..want]).await
            };
            match got {
                Ok(0) | Err(_) => return,
                Ok(n) => pending -= n as u64,
            }
        }
        if server.write_all(&[1]).await.is_err() {
            break;
        }
    }
}

/// Writes `iters` messages of `size` bytes after a header announcing them, copied from a
/// vector (`write_all`) or, with `region`, from one registered region (`write_region`); the
/// time until the peer acknowledged the last.
async fn time_writes(
    client: Arc<AsyncMutex<RStream>>,
    size: usize,
    iters: u64,
    region: bool,
) -> Duration {
    let mut stream = client.lock().await;
    let msg = vec![9u8; size];
    let mut registered = if region {
        let mut r = stream.context().reg_msgs(size).expect("register");
        r.fill(9);
        Some(r)
    } else {
        None
    };
    let start = Instant::now();
    stream
        .write_all(&(iters * size as u64).to_le_bytes())
        .await
        .expect("header");
    for _ in 0..iters {
        match registered.take() {
            Some(r) => {
                let (written, back) = stream.write_region(r, ..).await;
                written.expect("write_region");
                registered = Some(back.expect("the region comes back"));
            }
            None => stream.write_all(&msg).await.expect("write"),
        }
    }
    let mut ack = [0u8; 1];
    stream.read_exact(&mut ack).await.expect("ack");
    start.elapsed()
}

/// Streaming with nothing copied: the writer sends from registered memory (`write_region`), the
/// reader borrows each piece in its receive ring (`read_lent_exact`) and drops it.
fn streaming_without_copies(c: &mut Criterion) {
    let rt = common::runtime();
    let lending = RStreamOptions::new().zero_copy_reads(true);
    let client = connect_with(&rt, lending, |server| drain_announced(server, true));
    let mut group = c.benchmark_group("rstream_streaming_no_copy");
    group.measurement_time(Duration::from_secs(5));
    for size in [65536usize, 1 << 20] {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt)
                .iter_custom(|iters| time_writes(client.clone(), size, iters, true));
        });
    }
    group.finish();
}

criterion_group!(benches, ping_pong, streaming, streaming_without_copies);
criterion_main!(benches);
