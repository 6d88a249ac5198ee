//! Receiver not ready (RNR): a send that reaches a peer with no receive posted.
//!
//! With a finite RNR retry count the send fails with an error that says the peer had no receive
//! posted; with the default (7, which the verbs spec defines as "retry for ever") it waits and
//! completes once the peer posts one.

use std::io;
use std::time::Duration;

use rdma_async::cm::ConnParams;
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::{endpoint, rdma};
use rdma_async_device_tests::{guard, rdma_pair};

/// The RNR NAKs the port of `conn` has received so far (rxe's `rcvd_rnr_err` counter).
fn rnr_naks_received(conn: &RdmaConnection) -> u64 {
    let path = format!(
        "/sys/class/infiniband/{}/ports/{}/hw_counters/rcvd_rnr_err",
        conn.device_name(),
        conn.port_num()
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {path}: {e}"))
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("parsing {path}: {e}"))
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn finite_rnr_retry_fails_the_send_with_an_error_that_says_so() {
    // The RNR retry count of a connection's sends is what the handshake negotiates; set it on
    // both sides so it holds whichever side's parameters apply to the client's queue pair.
    let opts = RdmaOptions::new().conn_params(ConnParams::new().rnr_retry_count(1));
    let (server, client) = rdma_pair(&opts).await;
    let msg = client.reg_msgs(64).unwrap();
    // The server never posts a receive.
    let (sent, _msg) = guard("send to a peer without receives", client.send(msg, ..)).await;
    let err = sent.expect_err("a send nobody can receive must fail");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    let text = err.to_string();
    assert!(
        text.contains("RNR"),
        "the error names the RNR condition: {text}"
    );
    assert!(
        text.contains(&server.local_addr().unwrap().to_string()),
        "the error names the peer: {text}"
    );
    // The connection is now in the error state: the next operation reports it too.
    let (again, _) = guard(
        "send after RNR",
        client.send(client.reg_msgs(8).unwrap(), ..),
    )
    .await;
    assert!(again.is_err(), "a send after the failure must fail too");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_rnr_retry_waits_until_the_peer_posts_a_receive() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    // Both ends are on this node's one device, so the server's port counts the client's NAKs.
    let before = rnr_naks_received(&server);
    let mut msg = client.reg_msgs(64).unwrap();
    msg.copy_from_slice(&[0x5a; 64]);
    let send = tokio::spawn(async move { client.send(msg, ..).await.0 });

    // Wait until the device has really been told "not ready" at least once.
    guard("an RNR NAK", async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if rnr_naks_received(&server) > before {
                break;
            }
        }
    })
    .await;
    assert!(
        !send.is_finished(),
        "the send must still be waiting for a receive"
    );

    let (got, inbox) = guard("receive", server.recv(server.reg_msgs(64).unwrap(), ..)).await;
    assert_eq!(got.unwrap().len(), 64);
    assert_eq!(&inbox[..], &[0x5a; 64][..]);
    guard("send completes", send).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rnr_timer_is_set_on_both_queue_pairs() {
    // rdma_cm leaves it at 0 (655 ms between a receiver's "not ready" and the resend); the
    // default is perftest's 12 (0.64 ms), and ConnParams sets another.
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    assert_eq!(rdma::hooks::min_rnr_timer(&client).unwrap(), 12);
    assert_eq!(rdma::hooks::min_rnr_timer(&server).unwrap(), 12);
    let opts = RdmaOptions::new().conn_params(ConnParams::new().min_rnr_timer(3));
    let (server, client) = rdma_pair(&opts).await;
    assert_eq!(rdma::hooks::min_rnr_timer(&client).unwrap(), 3);
    assert_eq!(rdma::hooks::min_rnr_timer(&server).unwrap(), 3);
    let (server, client) = rdma_async_device_tests::endpoint_pair(
        &rdma_async::endpoint::EndpointOptions::new()
            .conn_params(ConnParams::new().min_rnr_timer(1)),
    )
    .await;
    assert_eq!(endpoint::hooks::min_rnr_timer(&client).unwrap(), 1);
    assert_eq!(endpoint::hooks::min_rnr_timer(&server).unwrap(), 1);
}
