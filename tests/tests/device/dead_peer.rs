//! A peer that vanishes without a word (its end goes silent: no rdma_cm disconnect, no ACKs;
//! the test hooks' `vanish`). On one node this plays what a peer host that lost
//! power looks like; the wire tests do the same with a real NIC that drops everything.

use std::io;
use std::time::Duration;

use rdma_async::cm::IdOptions;
use rdma_async::endpoint::EndpointOptions;
use rdma_async::rdma::RdmaOptions;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async::{endpoint, rdma, stream};
use rdma_async_device_tests::streams::fill_until_blocked;
use rdma_async_device_tests::{completion_status, endpoint_pair, guard, rdma_pair, stream_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest};

/// `IBV_WC_RETRY_EXC_ERR`: the transport's retries ran out.
const RETRY_EXC_ERR: u32 = 12;

/// Small rings, so a writer runs out of credits after a few KiB, and a short ACK timeout
/// (2^14 × 4.096 µs ≈ 67 ms per transport retry), so a dead peer is noticed within seconds.
fn options() -> RStreamOptions {
    RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192)
        .id_options(IdOptions::new().ack_timeout(14))
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_blocked_on_credits_learns_that_the_peer_vanished() {
    let (server, mut client) = stream_pair(options()).await;
    // 4 KiB writes, half the peer's 8 KiB ring: each one is signaled.
    let written = guard("fill the peer's ring", fill_until_blocked(&client, 4096)).await;
    assert!(written >= 8192, "the peer's ring took only {written} bytes");
    let probes_before = client.stats().write_probes;

    stream::hooks::vanish(&server).unwrap();
    // The server never reads: without probes this write waits for credits for ever.
    let err = guard(
        "a blocked write to a vanished peer",
        client.write_all(&[0x5a; 64 * 1024]),
    )
    .await
    .expect_err("a write to a vanished peer must fail");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&server.local_addr().unwrap().to_string()),
        "the error names the peer: {text}"
    );
    assert!(
        text.contains("retry"),
        "the error names the transport cause: {text}"
    );
    assert!(
        client.stats().write_probes > probes_before,
        "the failure came from a probe"
    );
    // The failure is sticky: the next write reports it at once.
    let again = client
        .write(b"x")
        .await
        .expect_err("the stream stays failed");
    assert_eq!(again.kind(), io::ErrorKind::TimedOut, "{again}");
    drop(server);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_live_peer_that_does_not_read_is_probed_but_not_failed() {
    let (mut server, client) = stream_pair(options()).await;
    let written = guard("fill the peer's ring", fill_until_blocked(&client, 4096)).await;
    let before = client.stats().write_probes;
    let writable = client.writable();
    tokio::pin!(writable);
    guard("two probes of a live peer", async {
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        loop {
            tokio::select! {
                r = &mut writable => panic!("writable with nobody reading: {r:?}"),
                _ = tick.tick() => if client.stats().write_probes >= before + 2 { return; }
            }
        }
    })
    .await;
    // The peer answered every probe: once it reads, the writer goes on.
    let mut got = vec![0u8; written];
    guard("read what was written", server.read_exact(&mut got))
        .await
        .unwrap();
    assert!(got.iter().all(|&b| b == 0xa5));
    guard("writable again", writable).await.unwrap();
    client.try_write(b"more").unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_with_keepalive_learns_that_the_peer_vanished() {
    let (server, mut client) = stream_pair(options().keepalive(Duration::from_secs(1))).await;
    stream::hooks::vanish(&server).unwrap();
    let mut buf = [0u8; 16];
    // Nothing was written and nothing will be: only the keepalive can notice.
    let err = guard("a blocked read from a vanished peer", client.read(&mut buf))
        .await
        .expect_err("a read from a vanished peer must fail, not block or read EOF");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        err.to_string()
            .contains(&server.local_addr().unwrap().to_string()),
        "the error names the peer: {err}"
    );
    drop(server);
}

fn endpoint_options() -> EndpointOptions {
    EndpointOptions::new().id_options(IdOptions::new().ack_timeout(14))
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_receiver_with_keepalive_learns_that_the_peer_vanished() {
    let opts = endpoint_options().keepalive(Duration::from_secs(1));
    let (server, client) = endpoint_pair(&opts).await;
    endpoint::hooks::vanish(&server).unwrap();
    // Nothing is in flight: only the keepalive can notice.
    let err = guard("a blocked recv from a vanished peer", client.recv())
        .await
        .expect_err("a recv from a vanished peer must fail");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        err.to_string()
            .contains(&server.local_addr().unwrap().to_string()),
        "the error names the peer: {err}"
    );
    assert_eq!(completion_status(&err), RETRY_EXC_ERR, "{err}");
    // Every later receive reports it again.
    let again = client.recv().await.expect_err("the endpoint stays failed");
    assert_eq!(completion_status(&again), RETRY_EXC_ERR, "{again}");
    drop(server);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pending_endpoint_recv_ends_when_a_send_to_a_vanished_peer_fails() {
    let (server, client) = endpoint_pair(&endpoint_options()).await;
    endpoint::hooks::vanish(&server).unwrap();
    let recv = client.recv();
    let send = async {
        client.send(b"into the void").await?;
        // The send was only handed to the device: its failure shows on later calls.
        std::future::pending::<io::Result<()>>().await
    };
    let err = guard("a recv while a send times out", async {
        tokio::select! {
            r = recv => r.map(|_| ()),
            r = send => r,
        }
    })
    .await
    .expect_err("the recv must fail once the send timed out");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert_eq!(completion_status(&err), RETRY_EXC_ERR, "{err}");
    drop(server);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_receives_with_keepalive_learn_that_the_peer_vanished() {
    let opts = RdmaOptions::new()
        .keepalive(Duration::from_secs(1))
        .id_options(IdOptions::new().ack_timeout(14));
    let (server, client) = rdma_pair(&opts).await;
    rdma::hooks::vanish(&server).unwrap();
    // Nothing is in flight but the keepalive.
    let (got, _) = guard(
        "a pending RDMA recv from a vanished peer",
        client.recv(client.reg_msgs(64).unwrap(), ..),
    )
    .await;
    let err = got.expect_err("a recv from a vanished peer must fail");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(
        err.to_string()
            .contains(&server.local_addr().unwrap().to_string()),
        "the error names the peer: {err}"
    );
    assert_eq!(completion_status(&err), RETRY_EXC_ERR, "{err}");
    drop(server);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_keepalive_leaves_a_live_connection_working() {
    let opts = RdmaOptions::new().keepalive(Duration::from_millis(100));
    let (server, client) = rdma_pair(&opts).await;
    // Several keepalives go out while nothing else happens; the connection still works.
    let mut ticks = tokio::time::interval(Duration::from_millis(100));
    for _ in 0..5 {
        ticks.tick().await;
    }
    let mut msg = client.reg_msgs(32).unwrap();
    msg.copy_from_slice(&[7; 32]);
    let recv = server.recv(server.reg_msgs(32).unwrap(), ..);
    let send = client.send(msg, ..);
    let ((got, inbox), (sent, _)) =
        guard("send after keepalives", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(got.unwrap().len(), 32);
    assert_eq!(&inbox[..], &[7; 32][..]);
}

/// Makes `server` go away without closing (its queue pair fails, then it disconnects) and reads
/// `client` to the end: the read must fail with a `ConnectionReset` that says why. Returns what
/// the read got before it.
async fn read_after_peer_went_away(server: RStream, client: &mut RStream) -> Vec<u8> {
    stream::hooks::vanish(&server).unwrap();
    drop(server);
    let mut rest = Vec::new();
    let err = guard(
        "a read after the peer went away",
        client.read_to_end(&mut rest),
    )
    .await
    .expect_err("a peer that never closed must not read as end-of-stream");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    assert!(
        err.to_string().contains("without closing"),
        "the error does not say why: {err}"
    );
    rest
}

/// A peer that goes away without closing (here: its queue pair fails, so its DISCONNECT never
/// arrives, and then it disconnects): a reader gets every byte that arrived before the
/// disconnect, then `ConnectionReset`, never a clean end-of-stream (bytes the peer wrote after
/// those may be lost) and never a hang.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_disconnects_without_closing_reads_as_a_reset_after_its_data() {
    let (mut server, mut client) = stream_pair(options()).await;
    server.write_all(b"partial").await.unwrap();
    let mut got = [0u8; 7];
    guard(
        "the data before the disconnect",
        client.read_exact(&mut got),
    )
    .await
    .unwrap();
    assert_eq!(&got, b"partial");
    let rest = read_after_peer_went_away(server, &mut client).await;
    assert!(rest.is_empty(), "nothing more was sent: {rest:?}");
    // Writing after it fails the same way: the connection is gone.
    let err = client
        .write_all(b"late")
        .await
        .expect_err("a write after the peer disconnected must fail");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
}

/// A stream's failure is sticky: `take_error` reports it on every call (it does not clear it, as
/// `SO_ERROR` would be), and readiness says both directions are closed.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn take_error_reports_the_sticky_failure_on_every_call() {
    let (server, mut client) = stream_pair(options()).await;
    assert!(
        client.take_error().unwrap().is_none(),
        "a working stream has no error"
    );
    read_after_peer_went_away(server, &mut client).await;
    for call in 1..=2 {
        let taken = client
            .take_error()
            .unwrap()
            .unwrap_or_else(|| panic!("call {call}: the failure is not reported"));
        assert_eq!(taken.kind(), io::ErrorKind::ConnectionReset, "{taken}");
        assert!(
            taken.to_string().contains("without closing"),
            "call {call}: the error does not say why: {taken}"
        );
    }
    let ready = guard(
        "readiness of a failed stream",
        client.ready(Interest::READABLE | Interest::WRITABLE),
    )
    .await
    .unwrap();
    assert!(
        ready.is_read_closed() && ready.is_write_closed(),
        "both directions are closed: {ready:?}"
    );
}
