//! A connection's first failure, reported again to later operations, still leads to its cause:
//! the work completion's status (`rdma_async::error::CompletionError`). The `RdmaConnection`
//! case is `rdma_ops::access_outside_the_remote_region_is_a_remote_access_error`.

use std::io;
use std::time::Duration;

use rdma_async::endpoint::hooks;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::error::EarlierFailure;
use rdma_async_device_tests::{completion_status as status_of, guard, listener};

/// A server endpoint with 64-byte receive slots, running `serve`, and a client connected to it
/// that has posted a 1024-byte message to it, which fails both queue pairs.
async fn oversized_message<T, F>(
    serve: impl FnOnce(Endpoint) -> F + Send + 'static,
) -> (Endpoint, tokio::task::JoinHandle<io::Result<T>>)
where
    F: Future<Output = io::Result<T>> + Send + 'static,
    T: Send + 'static,
{
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let request = listener.accept_request().await?;
        let opts = EndpointOptions::new().max_message_size(64);
        serve(Endpoint::accept(request, &opts).await?).await
    });
    let opts = EndpointOptions::new().max_message_size(4096);
    let client = guard("connect", Endpoint::connect_with(addr, &opts))
        .await
        .unwrap();
    // Posted: the failure shows in a later send, once its completion arrived.
    client.send(&[7; 1024]).await.unwrap();
    (client, server)
}

/// A message longer than the peer's receive slots fails the sender's transport; every later send
/// reports that failure with its status, and so do the peer's receives.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_reports_a_failed_send_again_with_its_status() {
    let (client, server) = oversized_message(|ep| async move {
        let first = ep
            .recv()
            .await
            .expect_err("an oversized message fails the receive");
        let again = ep.recv().await.expect_err("the receive side stays failed");
        Ok((first, again))
    })
    .await;
    // Each send reaps the completions before it: poll until the failed one has arrived.
    let first = guard("the failure to show", async {
        let mut tick = tokio::time::interval(Duration::from_millis(20));
        loop {
            tick.tick().await;
            if let Err(e) = client.send(b"next").await {
                return e;
            }
        }
    })
    .await;
    let status = status_of(&first);
    assert!(
        first
            .to_string()
            .contains(&format!("work completion status {status}")),
        "{first}"
    );
    let again = guard("a second send", client.send(b"again"))
        .await
        .expect_err("the connection stays failed");
    assert_eq!(again.kind(), first.kind(), "{again}");
    assert_eq!(again.to_string(), first.to_string());
    assert_eq!(
        status_of(&again),
        status,
        "the second report has the same status"
    );
    let earlier = again
        .get_ref()
        .and_then(|e| e.downcast_ref::<EarlierFailure>())
        .expect("a report of the earlier failure");
    assert_eq!(earlier.first().kind(), first.kind());

    let (recv_first, recv_again) = guard("server", server).await.unwrap().unwrap();
    let recv_status = status_of(&recv_first);
    assert_eq!(status_of(&recv_again), recv_status, "{recv_again}");
    assert_eq!(recv_again.kind(), recv_first.kind());
}

/// The handshake sets the RNR timer just after the connection is up, when the peer may already
/// have sent a message that failed the queue pair: setting it on a failed queue pair succeeds
/// (the data path reports the failure with its status), so the accept does not fail with a
/// refused `ibv_modify_qp` instead.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rnr_timer_can_be_set_after_the_peer_failed_the_queue_pair() {
    let (_client, server) = oversized_message(|ep| async move {
        hooks::set_min_rnr_timer(&ep, 5)?;
        let failure = ep
            .recv()
            .await
            .expect_err("an oversized message fails the receive");
        hooks::set_min_rnr_timer(&ep, 6)?;
        Ok(failure)
    })
    .await;
    let failure = guard("server", server).await.unwrap().unwrap();
    // The receive failed with the device's status, not with a refused modification.
    status_of(&failure);
}
