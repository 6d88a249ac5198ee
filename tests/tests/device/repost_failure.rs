//! A receive that cannot be posted again while a batch of completions is handled (a test hook
//! makes the next `ibv_post_recv` fail) ends the connection with that cause, for good; what
//! arrived before it is still delivered. Before, the stream returned the error once, dropped the
//! rest of the batch and carried on one receive short.

use std::io;

use rdma_async::endpoint::EndpointOptions;
use rdma_async::stream::RStreamOptions;
use rdma_async::{endpoint, stream};
use rdma_async_device_tests::{endpoint_pair, guard, stream_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[track_caller]
fn assert_repost_cause(what: &str, err: &io::Error) {
    assert!(
        err.to_string().contains("ibv_post_recv"),
        "{what} ended with another error than the failed receive post: {err}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_receive_repost_ends_the_stream_with_its_cause() {
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    stream::hooks::fail_next_post_recv(&server);
    // Each write reaches the server as a write with immediate, whose receive is posted again
    // with others, in a chain of 8: twelve writes make at least one such post.
    let sent: Vec<u8> = (0..12u8).flat_map(|i| [i; 100]).collect();
    for chunk in sent.chunks(100) {
        guard("a write", client.write_all(chunk)).await.unwrap();
    }
    // Receives are posted again once the batch that brought them to 8 is handled: what was
    // delivered up to then is read, in order, then the failure.
    let mut received = Vec::new();
    let mut buf = [0u8; 400];
    let first = loop {
        match guard("the server's read", server.read(&mut buf)).await {
            Ok(0) => panic!("EOF, not the failed repost, after {} bytes", received.len()),
            Ok(n) => received.extend_from_slice(&buf[..n]),
            Err(e) => break e,
        }
    };
    // At least the message whose receive could not be posted again was in that batch.
    assert!(
        !received.is_empty(),
        "the message whose receive failed to be posted again was lost"
    );
    assert!(
        sent.starts_with(&received),
        "the bytes read before the failure are not what was sent, in order"
    );
    assert_repost_cause("the read", &first);
    // For good: the next read and a write report the same cause (before, the stream went on).
    let again = guard("a second read", server.read(&mut buf))
        .await
        .expect_err("the stream stays failed");
    assert_repost_cause("the second read", &again);
    let write = guard("a write", server.write_all(b"x"))
        .await
        .expect_err("the stream stays failed");
    assert_repost_cause("the write", &write);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_receive_repost_ends_the_endpoint_with_its_cause() {
    let (server, client) = endpoint_pair(&EndpointOptions::new()).await;
    endpoint::hooks::fail_next_post_recv(&server);
    for i in 0..4u8 {
        guard("a send", client.send(&[i; 100])).await.unwrap();
    }
    // What arrived is delivered in order, then the failure.
    let mut next = 0u8;
    let err = loop {
        match guard("a receive", server.recv()).await {
            Ok(msg) => {
                assert_eq!(&msg[..], &[next; 100], "message {next}");
                next += 1;
            }
            Err(e) => break e,
        }
    };
    assert!(
        next >= 1,
        "the message whose receive failed to be posted again was lost"
    );
    assert_repost_cause("the receive", &err);
    // The whole connection ended: sends fail too (before, they went on).
    let send = guard("a send", server.send(b"x"))
        .await
        .expect_err("the connection ended");
    assert_repost_cause("the send", &send);
}
