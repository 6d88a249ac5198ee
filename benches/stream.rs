//! `RStream` benchmarks: QD=1 ping-pong latency (64 B, 4 KiB, 64 KiB; p50/p99 of the round
//! trips from an HDR histogram) and streaming throughput (64 KiB and 1 MiB writes, copied and
//! zero-copy from registered memory with `write_region`).
//!
//! Needs an RDMA device: run through `scripts/bench` (Soft-RoCE in a guest where there is none).
//! The C rsockets and TCP comparison of the same exchange is `scripts/compare`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

mod common;

use common::RoundTrips;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rdma_async::stream::{RListener, RStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Mutex as AsyncMutex;

/// A connected client whose peer runs `serve` on the same runtime.
fn connect<F, Fut>(rt: &tokio::runtime::Runtime, serve: F) -> Arc<AsyncMutex<RStream>>
where
    F: FnOnce(RStream) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = ()> + Send + 'static,
{
    rt.block_on(async {
        let listener = RListener::bind(SocketAddr::new(common::addr(), 0))
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
    let client = connect(&rt, |mut server| async move {
        let mut buf = vec![0u8; 1 << 20];
        let mut pending = 0u64;
        loop {
            let mut len = [0u8; 8];
            if server.read_exact(&mut len).await.is_err() {
                break;
            }
            pending += u64::from_le_bytes(len);
            while pending > 0 {
                let want = pending.min(buf.len() as u64) as usize;
                match server.read(&mut buf[..want]).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => pending -= n as u64,
                }
            }
            if server.write_all(&[1]).await.is_err() {
                break;
            }
        }
    });
    let mut group = c.benchmark_group("rstream_streaming");
    group.measurement_time(Duration::from_secs(5));
    for size in [65536usize, 1 << 20] {
        group.throughput(Throughput::Bytes(size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                async move {
                    let mut stream = client.lock().await;
                    let msg = vec![9u8; size];
                    let start = Instant::now();
                    stream
                        .write_all(&(iters * size as u64).to_le_bytes())
                        .await
                        .expect("header");
                    for _ in 0..iters {
                        stream.write_all(&msg).await.expect("write");
                    }
                    let mut ack = [0u8; 1];
                    stream.read_exact(&mut ack).await.expect("ack");
                    start.elapsed()
                }
            });
        });
        // The same from registered memory, without a copy into the send ring.
        let id = BenchmarkId::new("zero_copy", size);
        group.bench_with_input(id, &size, |b, &size| {
            b.to_async(&rt).iter_custom(|iters| {
                let client = client.clone();
                async move {
                    let mut stream = client.lock().await;
                    let mut region = stream.context().reg_msgs(size).expect("register");
                    region.fill(9);
                    let start = Instant::now();
                    stream
                        .write_all(&(iters * size as u64).to_le_bytes())
                        .await
                        .expect("header");
                    for _ in 0..iters {
                        let (written, back) = stream.write_region(region, ..).await;
                        written.expect("write_region");
                        region = back.expect("the region comes back");
                    }
                    let mut ack = [0u8; 1];
                    stream.read_exact(&mut ack).await.expect("ack");
                    start.elapsed()
                }
            });
        });
    }
    group.finish();
}

criterion_group!(benches, ping_pong, streaming);
criterion_main!(benches);
