//! QD=1 ping-pong latency of `Endpoint` messages: the client sends one message and waits for
//! the echo before sending the next. Criterion reports the round-trip time; p50/p99 of the
//! individual round trips come from an HDR histogram.
//!
//! Needs an RDMA device: run through `scripts/bench` (Soft-RoCE in a guest where there is none).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use hdrhistogram::Histogram;
use rdma_async::cm::CmListener;
use rdma_async::endpoint::{Endpoint, EndpointOptions};

const SIZES: [usize; 2] = [64, 4096];

fn addr() -> std::net::IpAddr {
    std::env::var("RDMA_ASYNC_TEST_ADDR")
        .expect("RDMA_ASYNC_TEST_ADDR: run through scripts/bench")
        .parse()
        .expect("RDMA_ASYNC_TEST_ADDR is an IP address")
}

fn ping_pong(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let opts = EndpointOptions::new().max_message_size(4096);
    let client = rt.block_on(async {
        let listener = CmListener::bind((addr(), 0)).await.expect("bind");
        let target = listener.local_addr();
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
        Arc::new(Endpoint::connect(target, &opts).await.expect("connect"))
    });

    let mut group = c.benchmark_group("endpoint_ping_pong");
    group.measurement_time(Duration::from_secs(5));
    for size in SIZES {
        let hist = Arc::new(Mutex::new(
            Histogram::<u64>::new_with_bounds(1, 60_000_000_000, 3).unwrap(),
        ));
        group.throughput(Throughput::Bytes(2 * size as u64));
        group.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &size| {
            b.to_async(&rt).iter_custom(|iters| {
                let (client, hist) = (client.clone(), hist.clone());
                async move {
                    let msg = vec![7u8; size];
                    let mut total = Duration::ZERO;
                    let mut samples = Vec::with_capacity(iters as usize);
                    for _ in 0..iters {
                        let start = Instant::now();
                        client.send(&msg).await.expect("send");
                        let back = client.recv().await.expect("recv");
                        let took = start.elapsed();
                        assert_eq!(back.len(), size);
                        total += took;
                        samples.push(took.as_nanos() as u64);
                    }
                    let mut h = hist.lock().unwrap();
                    for s in samples {
                        h.saturating_record(s);
                    }
                    total
                }
            });
        });
        let h = hist.lock().unwrap();
        println!(
            "endpoint_ping_pong/{size}: round trips={} p50={:.1}us p99={:.1}us max={:.1}us",
            h.len(),
            h.value_at_quantile(0.5) as f64 / 1e3,
            h.value_at_quantile(0.99) as f64 / 1e3,
            h.max() as f64 / 1e3
        );
    }
    group.finish();
}

criterion_group!(benches, ping_pong);
criterion_main!(benches);
