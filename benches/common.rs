//! What the benchmarks share: the device address, the runtime, and round-trip histograms.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The address of the RDMA netdev, as `scripts/softroce` exports it. Without it there is no
/// device to measure: the benchmark says how to run it and exits (a benchmark is not a test,
/// so a missing device is not a failure here).
pub fn addr() -> std::net::IpAddr {
    let Ok(addr) = std::env::var("RDMA_ASYNC_TEST_ADDR") else {
        eprintln!(
            "The benchmarks need an RDMA device and the IP address on its port in \
             RDMA_ASYNC_TEST_ADDR.\nRun them through scripts/bench, which boots a Soft-RoCE \
             guest when the machine has no device (e.g. scripts/bench stream_ping_pong)."
        );
        std::process::exit(0);
    };
    addr.parse().unwrap_or_else(|e| {
        eprintln!("RDMA_ASYNC_TEST_ADDR={addr} is not an IP address: {e}");
        std::process::exit(2);
    })
}

/// The runtime both ends of a benchmark run on.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Round-trip times in nanoseconds, shared by the iterations of one benchmark.
#[derive(Clone)]
pub struct RoundTrips(Arc<Mutex<Histogram<u64>>>);

impl RoundTrips {
    pub fn new() -> Self {
        RoundTrips(Arc::new(Mutex::new(
            Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("histogram bounds"),
        )))
    }

    /// Records a batch (outside the timed loop, so the lock is not measured).
    pub fn record(&self, samples: &[u64]) {
        let mut h = self.0.lock().expect("histogram lock");
        for &s in samples {
            h.saturating_record(s);
        }
    }

    /// Times `iters` round trips of `round_trip`, records each, and returns the total (what
    /// criterion's `iter_custom` wants). Recording happens after the timed loop.
    pub async fn time(&self, iters: u64, mut round_trip: impl AsyncFnMut()) -> Duration {
        let mut samples = Vec::with_capacity(iters as usize);
        let mut total = Duration::ZERO;
        for _ in 0..iters {
            let start = Instant::now();
            round_trip().await;
            let took = start.elapsed();
            total += took;
            samples.push(took.as_nanos() as u64);
        }
        self.record(&samples);
        total
    }

    /// p50 and p99 in microseconds (`None` when the benchmark did not run).
    pub fn p50_p99_us(&self) -> Option<(f64, f64)> {
        let h = self.0.lock().expect("histogram lock");
        (!h.is_empty()).then(|| {
            (
                h.value_at_quantile(0.5) as f64 / 1e3,
                h.value_at_quantile(0.99) as f64 / 1e3,
            )
        })
    }

    /// Prints count, p50, p99 and max (nothing when the benchmark did not run).
    pub fn report(&self, name: &str) {
        let Some((p50, p99)) = self.p50_p99_us() else {
            return; // filtered out on the command line
        };
        let h = self.0.lock().expect("histogram lock");
        println!(
            "{name}: round trips={} p50={p50:.1}us p99={p99:.1}us max={:.1}us",
            h.len(),
            h.max() as f64 / 1e3
        );
    }
}
