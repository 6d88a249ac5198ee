//! A peer host that vanishes without a word: `tc netem loss 100%` on both nodes' NICs after the
//! connections are set up, with the crate's default options (no ACK timeout set, 6 transport
//! retries). A writer blocked on credits (nothing in flight: only its probes can notice), a
//! reader with keepalive, `Endpoint` and `RdmaConnection` receivers with keepalive and an RDMA
//! write each end with `TimedOut` naming the peer; once the wire is back, the process connects
//! again and moves data, and its RDMA resources return to where they were. One test, alone in its
//! process (`scripts/wire-tests` runs each module in its own): it counts the process's resources.
//!
//! Bound: a probe (or keepalive) within 1 s, then the transport's retries: on Soft-RoCE with
//! rdma_cm's default ACK timeout (exponent 19, about 2.1 s a try) about 7 × 2.1 s ≈ 15 s.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::ports;
use rdma_async_device_tests::streams::fill_until_blocked;
use rdma_async_device_tests::wire::{
    Netem, PeerJob, connect_after_outage, connect_retrying, echo_through, peer_ip, peer_program,
    rdma_client,
};
use rdma_async_device_tests::{guard_within, leak_counts, settled_counts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Hang guard (a bound for the test, not a timing assertion).
const VANISHED: Duration = Duration::from_secs(120);

fn assert_timed_out(err: &std::io::Error, peer: SocketAddr, what: &str, since: Instant) {
    eprintln!(
        "{what}: {:?} after the wire went dead: {err}",
        since.elapsed()
    );
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{what}: {err}");
    assert!(
        err.to_string().contains(&peer.ip().to_string()),
        "{what}: the error names the peer: {err}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vanished_host_fails_writers_keepalive_readers_and_receivers_and_rdma_writes() {
    let Some(peer) = peer_ip() else { return };
    let baseline = leak_counts();
    let port = ports::WIRE_VANISH;
    let echo = PeerJob::start(
        "vanish-echo",
        "ready",
        &[&peer_program(), "stream-echo", &port.to_string()],
    )
    .await;
    let rdma_peer = PeerJob::start(
        "vanish-rdma",
        "ready",
        &[&peer_program(), "rdma", &(port + 1).to_string(), "4096"],
    )
    .await;
    let addr = SocketAddr::new(peer, port);
    let mut writer = connect_retrying(|| RStream::connect(addr)).await;
    let keepalive = RStreamOptions::new().keepalive(Duration::from_secs(1));
    let mut reader = connect_retrying(|| RStream::connect_with(addr, &keepalive)).await;
    let (conn, remote) = rdma_client(SocketAddr::new(peer, port + 1)).await;
    // A second connection to the region server, idle but for its keepalive.
    let rdma_ka = RdmaOptions::new().keepalive(Duration::from_secs(1));
    let idle = connect_retrying(|| {
        RdmaConnection::connect_with(SocketAddr::new(peer, port + 1), &rdma_ka)
    })
    .await;
    // The server's region descriptor, so nothing more is due on this connection.
    let (descriptor, _) = guard_within(
        VANISHED,
        "region descriptor",
        idle.recv(idle.reg_msgs(64).unwrap(), ..),
    )
    .await;
    descriptor.unwrap();
    let ep_peer = PeerJob::start(
        "vanish-endpoint",
        "ready",
        &[&peer_program(), "endpoint-echo", &(port + 2).to_string()],
    )
    .await;
    let ep_addr = SocketAddr::new(peer, port + 2);
    let ep_opts = EndpointOptions::new().keepalive(Duration::from_secs(1));
    let endpoint = connect_retrying(|| Endpoint::connect_with(ep_addr, &ep_opts)).await;
    // 64 KiB writes, half the 128 KiB ring: each one is signaled. The echo peer stops reading
    // once nobody reads its echo.
    guard_within(
        VANISHED,
        "filling the peer's ring",
        fill_until_blocked(&writer, 64 << 10),
    )
    .await;

    let netem = Netem::both("loss 100%").await;
    let dead = Instant::now();
    let mut buf = [0u8; 64];
    let src = conn.reg_msgs(4096).unwrap();
    let idle_recv = idle.recv(idle.reg_msgs(64).unwrap(), ..);
    let (written, read, (rdma, _), received, (idle_got, _)) =
        guard_within(VANISHED, "operations on a vanished host", async {
            tokio::join!(
                // Keeps writing: what fits in credits already granted is posted; then it blocks.
                async {
                    loop {
                        writer.write_all(&[0x5a; 64 << 10]).await?;
                    }
                },
                reader.read(&mut buf),
                conn.write(src, .., remote.whole()),
                endpoint.recv(),
                idle_recv,
            )
        })
        .await;
    let written: std::io::Result<()> = written;
    assert_timed_out(
        &written.expect_err("a blocked write to a vanished host"),
        addr,
        "blocked writer",
        dead,
    );
    assert_timed_out(
        &read.expect_err("a keepalive reader of a vanished host"),
        addr,
        "keepalive reader",
        dead,
    );
    assert_timed_out(
        &rdma.expect_err("an RDMA write to a vanished host"),
        addr,
        "RDMA write",
        dead,
    );
    assert_timed_out(
        &received.expect_err("a keepalive Endpoint receiver of a vanished host"),
        ep_addr,
        "Endpoint receiver",
        dead,
    );
    assert_timed_out(
        &idle_got.expect_err("a keepalive RDMA receiver of a vanished host"),
        SocketAddr::new(peer, port + 1),
        "RDMA receiver",
        dead,
    );
    assert!(writer.stats().write_probes > 0, "the writer probed");
    drop((writer, reader, conn, endpoint, idle));
    drop(netem);

    // The wire is back: the same process connects again (a timed-out first address resolution
    // is tried again: `connect_after_outage`) and moves data intact.
    let mut again = connect_after_outage(|| RStream::connect(addr)).await;
    let data = pattern(40, 64 << 10);
    guard_within(
        VANISHED,
        "echo after the wire came back",
        echo_through(&mut again, &data, 16 << 10),
    )
    .await;
    drop(again);
    // Everything of the dead connections is released (dropped streams linger until their
    // DISCONNECT is out or failed): the counts return to where they started.
    guard_within(
        VANISHED,
        "RDMA resources back to the baseline",
        settled_counts(&baseline),
    )
    .await;
    echo.stop().await;
    rdma_peer.stop().await;
    ep_peer.stop().await;
}
