//! The soak, short in CI, long through `scripts/soak`: an `RStream` across the
//! wire (node 2 runs `wire-peer soak`) and one within this node, each moving a volume each way
//! through split halves with random write and read sizes (1 B to 1 MiB) and random drops of
//! pending reads and writes on both ends, every byte hashed and checked on arrival; then
//! `RdmaConnection` random RDMA writes and reads (with dropped reads) on a region whose ends
//! are canaries, across the wire and within the node. At the end the hashes match, this
//! process's RDMA resource counts are back to where they started and its RSS grew less than
//! [`RSS_BOUND_KIB`].
//!
//! Volumes (bytes each way; `K`, `M`, `G` suffixes): `RDMA_ASYNC_SOAK_WIRE_BYTES` and
//! `RDMA_ASYNC_SOAK_LOCAL_BYTES`, both defaulting to `RDMA_ASYNC_SOAK_BYTES`, else the CI sizes
//! below; `RDMA_ASYNC_SOAK_RDMA_BYTES` (moved by the random RDMA operations of each
//! connection, default a quarter of the wire volume). `RDMA_ASYNC_SOAK_SEED` replays a seed.
//! The only test of its module, alone in its process (`scripts/wire-tests` and `scripts/soak` run
//! it so): resource counts are process-wide.

use std::net::SocketAddr;

use rdma_async::rdma::{RdmaOptions, RemoteAccess};
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::leaks::{LEAK_KINDS, leak_counts, settled_counts};
use rdma_async_device_tests::ports;
use rdma_async_device_tests::soak::{
    CANARY, MAX_OP, Progress, env_bytes, rss_kib, seed, soak_rdma, soak_stream,
};
use rdma_async_device_tests::wire::{
    Fnv, PeerJob, connect_retrying, peer_ip, peer_program, rdma_client, remote_hash,
};
use rdma_async_device_tests::{guard, rdma_pair, stream_pair};

/// CI volume across the wire, each way: 64 MiB in all, about 20 s under TCG (Soft-RoCE
/// moved about 3.5 MiB/s, both directions together, between two 1-CPU guests): 64 times the
/// largest write, so every drop and size mix recurs. The long runs are `scripts/soak`'s.
const CI_WIRE_BYTES: u64 = 32 << 20;
/// CI volume within the node, each way (about 5 s: both ends share node 1's CPU).
const CI_LOCAL_BYTES: u64 = 16 << 20;
/// Allowed RSS growth over the whole soak.
const RSS_BOUND_KIB: u64 = 64 << 10;
/// The RDMA region: canaries around room for the largest operation, twice.
const REGION: usize = 2 * CANARY + 2 * MAX_OP;

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn soak_streams_and_rdma_across_the_wire_and_within_the_node() {
    let Some(peer) = peer_ip() else { return };
    let all = env_bytes("RDMA_ASYNC_SOAK_BYTES", 0);
    let or_all = |d| if all > 0 { all } else { d };
    let wire_bytes = env_bytes("RDMA_ASYNC_SOAK_WIRE_BYTES", or_all(CI_WIRE_BYTES));
    let local_bytes = env_bytes("RDMA_ASYNC_SOAK_LOCAL_BYTES", or_all(CI_LOCAL_BYTES));
    let rdma_bytes = env_bytes("RDMA_ASYNC_SOAK_RDMA_BYTES", (wire_bytes / 4).max(1 << 20));
    let seed = seed();
    println!(
        "soak: seed {seed:#x} (replay with RDMA_ASYNC_SOAK_SEED={seed:#x}); {} MiB each way \
         across the wire, {} MiB each way within the node, {} MiB of RDMA operations per \
         connection",
        wire_bytes >> 20,
        local_bytes >> 20,
        rdma_bytes >> 20
    );
    let baseline = leak_counts();
    let rss_before = rss_kib();
    println!("soak: baseline {LEAK_KINDS:?} {baseline:?}, rss {rss_before} KiB");
    let (a, b) = (seed, seed.rotate_left(17) ^ 0xb0b);

    // 1. RStream across the wire.
    let job = PeerJob::start(
        "soak",
        "ready",
        &[
            &peer_program(),
            "soak",
            &ports::WIRE_SOAK.to_string(),
            &wire_bytes.to_string(),
            &b.to_string(),
            &a.to_string(),
        ],
    )
    .await;
    let addr = SocketAddr::new(peer, ports::WIRE_SOAK);
    let stream = connect_retrying(|| RStream::connect(addr)).await;
    let progress = Progress::new("RStream across the wire", 2 * wire_bytes);
    let (sent, received) = soak_stream(stream, wire_bytes, a, b, Some(progress.clone()))
        .await
        .expect("RStream soak across the wire");
    progress.end();
    println!("soak: node 1 sent {sent}; received {received}");
    let (ok, text) = job.wait().await;
    print!("soak: node 2: {text}");
    assert!(ok, "node 2's end of the soak failed:\n{text}");
    assert_eq!((sent.bytes, received.bytes), (wire_bytes, wire_bytes));
    for line in [
        format!("received {} bytes hash {:016x}", sent.bytes, sent.hash),
        format!("sent {} bytes hash {:016x}", received.bytes, received.hash),
    ] {
        assert!(text.contains(&line), "node 2 did not log {line:?}:\n{text}");
    }
    println!("soak: rss {} KiB", rss_kib());

    // 2. RdmaConnection across the wire.
    let job = PeerJob::start(
        "soak-rdma",
        "ready",
        &[
            &peer_program(),
            "rdma",
            &(ports::WIRE_SOAK + 1).to_string(),
            &REGION.to_string(),
        ],
    )
    .await;
    let (conn, remote) = rdma_client(SocketAddr::new(peer, ports::WIRE_SOAK + 1)).await;
    let progress = Progress::new("RDMA reads and writes across the wire", rdma_bytes);
    let (mirror, stats) = soak_rdma(&conn, &remote, rdma_bytes, a, &progress)
        .await
        .expect("RDMA soak across the wire");
    progress.end();
    println!("soak: {stats:?}");
    assert_eq!(
        remote_hash(&conn).await,
        Fnv::of(&mirror),
        "node 2's region (canaries included) after the soak"
    );
    drop(conn);
    job.stop().await;
    println!("soak: rss {} KiB", rss_kib());

    // 3. RStream within the node.
    let (server, client) = stream_pair(RStreamOptions::default()).await;
    let progress = Progress::new("RStream within the node", 2 * local_bytes);
    let (s, c) = tokio::join!(
        soak_stream(server, local_bytes, b, a, None),
        soak_stream(client, local_bytes, a, b, Some(progress.clone()))
    );
    progress.end();
    let ((s_sent, s_received), (c_sent, c_received)) =
        (s.expect("server end"), c.expect("client end"));
    println!("soak: client sent {c_sent}; received {c_received}");
    println!("soak: server sent {s_sent}; received {s_received}");
    assert_eq!((c_sent.bytes, s_sent.bytes), (local_bytes, local_bytes));
    assert_eq!(
        (c_sent.bytes, c_sent.hash),
        (s_received.bytes, s_received.hash)
    );
    assert_eq!(
        (s_sent.bytes, s_sent.hash),
        (c_received.bytes, c_received.hash)
    );
    println!("soak: rss {} KiB", rss_kib());

    // 4. RdmaConnection within the node: the region is this process's, so look at it directly.
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let region = server
        .reg_shared(REGION, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    let progress = Progress::new("RDMA reads and writes within the node", rdma_bytes);
    let (mirror, stats) = soak_rdma(&client, &region.remote(), rdma_bytes, b, &progress)
        .await
        .expect("RDMA soak within the node");
    progress.end();
    println!("soak: {stats:?}");
    assert!(
        region.to_vec() == mirror,
        "the region (canaries included) differs from what was written"
    );
    drop((region, server, client));

    // Everything dropped: the counts return to the baseline (a dropped stream lingers in a
    // task until its peer has all its data, so poll, bounded) and RSS stayed flat.
    let counts = guard("resources back to the baseline", settled_counts(&baseline)).await;
    let rss_after = rss_kib();
    println!(
        "soak: end {LEAK_KINDS:?} {counts:?} (baseline {baseline:?}); rss {rss_before} KiB \
         before, {rss_after} KiB after ({:+} KiB)",
        rss_after as i64 - rss_before as i64
    );
    assert!(
        rss_after < rss_before + RSS_BOUND_KIB,
        "RSS grew from {rss_before} KiB to {rss_after} KiB"
    );
}
