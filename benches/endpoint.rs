//! QD=1 ping-pong latency of `Endpoint` messages: the client sends one message and waits for
//! the echo before sending the next. Criterion reports the round-trip time; p50/p99 of the
//! individual round trips come from an HDR histogram.
//!
//! `endpoint_ping_pong` copies (`send(&[u8])`, `recv` copying out of the receive buffer);
//! `endpoint_ping_pong_pooled` is the same client with registered buffers of a `BufferPool`:
//! `send_region` sends from a pool buffer and `recv_pool` hands the echo out as pool-backed
//! `Bytes`, no copy either way. The echo server is the same copying one for both.
//!
//! Needs an RDMA device: run through `scripts/bench` (Soft-RoCE in a guest where there is none).

use std::sync::Arc;
use std::time::Duration;

mod common;

use common::RoundTrips;
use criterion::{Bencher, BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use rdma_async::cm::CmListener;
use rdma_async::device::{BufferPool, DeviceContext, PoolOptions};
use rdma_async::endpoint::{Endpoint, EndpointOptions};

const SIZES: [usize; 2] = [64, 4096];

/// A client connected to a copying echo server; the client's receives use `pool` if given.
fn connect(rt: &tokio::runtime::Runtime, pool: Option<&BufferPool>) -> Arc<Endpoint> {
    let opts = EndpointOptions::new().max_message_size(4096);
    let client_opts = match pool {
        Some(pool) => opts.clone().recv_pool(pool.clone()),
        None => opts.clone(),
    };
    rt.block_on(async {
        let listener = CmListener::bind((common::addr(), 0)).await.expect("bind");
        let target = listener.local_addr().unwrap();
        let server_opts = opts.clone();
        tokio::spawn(async move {
            let request = listener.accept_request().await.expect("connection request");
            let server = Endpoint::accept(request, &server_opts)
                .await
                .expect("accept");
            // Echo until the client goes away.
            while let Ok(msg) = server.recv().await {
                if server.send(&msg).await.is_err() {
                    break;
                }
            }
        });
        Arc::new(
            Endpoint::connect_with(target, &client_opts)
                .await
                .expect("connect"),
        )
    })
}

/// One benchmark per size in `SIZES`, each followed by its round trips' percentiles.
fn per_size(
    c: &mut Criterion,
    name: &str,
    mut bench: impl FnMut(&mut Bencher<'_>, usize, &RoundTrips),
) {
    let mut group = c.benchmark_group(name);
    group.measurement_time(Duration::from_secs(5));
    for size in SIZES {
        let hist = RoundTrips::new();
        group.throughput(Throughput::Bytes(2 * size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            bench(b, size, &hist)
        });
        hist.report(&format!("{name}/{size}"));
    }
    group.finish();
}

fn ping_pong(c: &mut Criterion) {
    let rt = common::runtime();
    let client = connect(&rt, None);
    per_size(c, "endpoint_ping_pong", |b, size, hist| {
        b.to_async(&rt).iter_custom(|iters| {
            let (client, hist) = (client.clone(), hist.clone());
            async move {
                let msg = vec![7u8; size];
                hist.time(iters, async || {
                    client.send(&msg).await.expect("send");
                    let back = client.recv().await.expect("recv");
                    assert_eq!(back.len(), size);
                })
                .await
            }
        });
    });
}

fn ping_pong_pooled(c: &mut Criterion) {
    let rt = common::runtime();
    let pool = DeviceContext::for_local_addr(common::addr())
        .expect("device context")
        .buffer_pool(&PoolOptions::new().size_classes([4096]))
        .expect("pool");
    let client = connect(&rt, Some(&pool));
    per_size(c, "endpoint_ping_pong_pooled", |b, size, hist| {
        b.to_async(&rt).iter_custom(|iters| {
            let (client, hist, pool) = (client.clone(), hist.clone(), pool.clone());
            async move {
                let mut region = Some(pool.get(size).await.expect("pool buffer"));
                hist.time(iters, async || {
                    let buffer = region.take().expect("the buffer came back");
                    let (sent, back) = client.send_region(buffer, ..size).await;
                    sent.expect("send");
                    region = back;
                    let echo = client.recv().await.expect("recv");
                    assert_eq!(echo.len(), size);
                })
                .await
            }
        });
    });
}

criterion_group!(benches, ping_pong, ping_pong_pooled);
criterion_main!(benches);
