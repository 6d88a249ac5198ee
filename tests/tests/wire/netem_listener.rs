//! A listener whose remote clients' host vanishes: node 2 holds connections to an `RListener` on node 1, some established and some
//! parked mid-handshake, when `tc netem loss 100%` cuts the wire. The listener goes on serving a
//! client of its own node (rxe loops that traffic back inside node 1), the parked handshakes end
//! at the listener's `accept_timeout`, the established connections by their keepalive, and this
//! process's RDMA resources return to where they were. One test, alone in its process
//! (`scripts/wire-tests` runs each module in its own): it counts the process's resources.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::wire::{Netem, PeerJob, peer_ip, peer_program};
use rdma_async_device_tests::{guard_within, leak_counts, settled_counts, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

/// Hang guard (a bound for the test, not a timing assertion).
const BOUND: Duration = Duration::from_secs(120);

const OPEN: usize = 8;
const PARKED: usize = 20;

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listener_serves_its_own_node_while_its_remote_clients_vanish() {
    let Some(_peer) = peer_ip() else { return };
    let baseline = leak_counts();
    // Long enough that the parked requests are still pending when the wire goes.
    let accept_timeout = Duration::from_secs(20);
    let options = RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192)
        .accept_timeout(accept_timeout)
        .keepalive(Duration::from_secs(1));
    let listener = RListener::bind_with(SocketAddr::new(test_ip(), 0), &options)
        .await
        .expect("bind on node 1");
    let addr = listener.local_addr().unwrap();
    let with_listener = leak_counts();

    let served = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn({
        let served = served.clone();
        async move {
            let mut incoming = listener.into_incoming();
            while let Some(stream) = incoming.next().await {
                let mut stream = stream.expect("the listener failed");
                served.fetch_add(1, Ordering::Relaxed);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    while let Ok(n) = stream.read(&mut buf).await {
                        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        }
    });

    let clients = PeerJob::start(
        "listener-clients",
        "ready",
        &[
            &peer_program(),
            "park",
            &addr.to_string(),
            &PARKED.to_string(),
            &OPEN.to_string(),
        ],
    )
    .await;
    // Node 2 printed `ready` after its connections echoed.
    assert_eq!(served.load(Ordering::Relaxed), OPEN);

    let netem = Netem::both("loss 100%").await;
    let dead = Instant::now();
    let mut local = guard_within(
        BOUND,
        "a local connect",
        RStream::connect_with(addr, &options),
    )
    .await
    .expect("a client on node 1 is served while node 2 is gone");
    let msg = b"served while node 2 is gone";
    local.write_all(msg).await.unwrap();
    let mut back = vec![0u8; msg.len()];
    guard_within(BOUND, "the local echo", local.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(&back, msg);
    eprintln!(
        "a local client was served {:?} after the wire went dead",
        dead.elapsed()
    );
    drop(local);

    // The parked handshakes end at the deadline, the established connections at their
    // keepalive: everything but the listener is released.
    guard_within(
        BOUND,
        "RDMA resources back to the listener's own",
        settled_counts(&with_listener),
    )
    .await;
    eprintln!(
        "node 2's {PARKED} parked and {OPEN} established connections were released {:?} \
         after the wire went dead (accept timeout {accept_timeout:?}, keepalive 1 s)",
        dead.elapsed()
    );
    assert_eq!(served.load(Ordering::Relaxed), OPEN + 1);
    assert!(
        !server.is_finished(),
        "the listener's incoming stream ended"
    );
    server.abort();
    assert!(server.await.unwrap_err().is_cancelled());
    guard_within(
        BOUND,
        "RDMA resources back to the baseline",
        settled_counts(&baseline),
    )
    .await;
    drop(netem);
    clients.stop().await;
}
