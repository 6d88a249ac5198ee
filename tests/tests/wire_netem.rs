//! Integrity across a bad wire: `tc netem` on both nodes' NICs drops, reorders, duplicates or
//! corrupts RDMA packets (one impairment at a time, then all together) while an `RStream` echo
//! and `RdmaConnection` writes and reads run; every byte arrives once, in order, intact (both
//! ends hash it) and nothing hangs. Soft-RoCE recovers from loss slowly under emulation, so
//! the volumes are small. The connections are set up on a clean wire; only the transfers run
//! on the impaired one. One test at a time (`scripts/wire-tests` runs this binary with one
//! thread, and a lock keeps the wire to one test anyway).

use std::net::SocketAddr;
use std::time::Duration;

use rdma_async::stream::RStream;
use rdma_async_tests::wire::{
    Fnv, Netem, PeerJob, connect_retrying, echo_through, pattern, peer_ip, peer_program,
    rdma_client, rdma_write_read_check,
};

/// The wire is shared: one impairment at a time.
static WIRE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hang guard for a transfer on an impaired wire (a bound, not a timing assertion).
const IMPAIRED: Duration = Duration::from_secs(240);

const STREAM_BYTES: usize = 256 << 10;
const RDMA_BYTES: usize = 256 << 10;

async fn bounded<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(IMPAIRED, fut)
        .await
        .unwrap_or_else(|_| {
            panic!("{what} did not finish within {IMPAIRED:?} on the impaired wire")
        })
}

/// Sets up an RStream echo and an RdmaConnection with node 2, impairs the wire with `spec`,
/// moves the data, and checks it on both ends.
async fn across_impaired_wire(spec: &str, port: u16, seed: u64) {
    let Some(peer) = peer_ip() else { return };
    let _wire = WIRE.lock().await;
    let echo = PeerJob::start(
        "netem-echo",
        "ready",
        &[&peer_program(), "stream-echo", &port.to_string()],
    )
    .await;
    let rdma = PeerJob::start(
        "netem-rdma",
        "ready",
        &[
            &peer_program(),
            "rdma",
            &(port + 1).to_string(),
            &RDMA_BYTES.to_string(),
        ],
    )
    .await;
    let addr = SocketAddr::new(peer, port);
    let mut stream = connect_retrying(|| RStream::connect(addr)).await;
    let (conn, remote) = rdma_client(SocketAddr::new(peer, port + 1)).await;

    let netem = Netem::both(spec).await;
    let data = pattern(seed, STREAM_BYTES);
    bounded(
        &format!("RStream echo under netem {spec}"),
        echo_through(&mut stream, &data, 16 << 10),
    )
    .await;
    let block = pattern(seed + 1, RDMA_BYTES);
    bounded(
        &format!("RDMA writes and read under netem {spec}"),
        rdma_write_read_check(&conn, &remote, &block, 16 << 10),
    )
    .await;
    drop(netem);

    drop(stream);
    drop(conn);
    let text = echo.stop().await;
    let line = format!("{} bytes, fnv {:016x}, Ok(())", data.len(), Fnv::of(&data));
    assert!(text.contains(&line), "node 2 did not log {line:?}:\n{text}");
    rdma.stop().await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss() {
    across_impaired_wire("loss 1%", 7620, 1).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordering() {
    across_impaired_wire("delay 2ms reorder 25% 50%", 7622, 2).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplication() {
    across_impaired_wire("duplicate 5%", 7624, 3).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption() {
    across_impaired_wire("corrupt 1%", 7626, 4).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_reordering_duplication_and_corruption_together() {
    across_impaired_wire(
        "delay 2ms reorder 10% 50% loss 0.5% duplicate 2% corrupt 0.5%",
        7628,
        5,
    )
    .await;
}
