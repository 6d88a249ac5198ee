//! An `RdmaConnection` whose completion task can no longer poll its completion queue (a test
//! hook makes the next poll fail) ends for good: every pending operation (send, receive, RDMA
//! read and write) ends with that cause and gets its buffer back untouched, later operations are
//! refused with it, the queue pair is destroyed at once (before any buffer comes back), and the
//! process's RDMA resources return to zero. One test in its own binary: it counts every RDMA
//! resource of this process.

use rdma_async::rdma::hooks;
use rdma_async::rdma::{RdmaOptions, RemoteAccess};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{
    LEAK_KINDS, assert_no_rdma_resources, guard, poll_once, rdma_pair, rdma_resources,
    settled_counts,
};

/// What the injected failure says, and so every error it causes.
const CAUSE: &str = "injected by a test hook";

#[track_caller]
fn assert_caused(what: &str, err: &std::io::Error) {
    assert!(
        err.to_string().contains(CAUSE) && err.to_string().contains("polling the completion queue"),
        "{what} ended with another error: {err}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_completion_poll_ends_every_operation_with_its_cause() {
    assert_no_rdma_resources("the test starts with no RDMA resources");
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let target = server
        .reg_shared(4096, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    let remote = target.remote().slice(0, 4096).unwrap();

    let mut recv_a = client.reg_msgs(64).unwrap();
    recv_a.fill(0xa1);
    let mut recv_b = client.reg_msgs(64).unwrap();
    recv_b.fill(0xb2);
    let sent = pattern(1, 256);
    let send_buf = client.register(sent.clone()).unwrap();
    let mut read_buf = client.reg_msgs(4096).unwrap();
    read_buf.fill(0xc3);
    let written = pattern(2, 4096);
    let write_buf = client.register(written.clone()).unwrap();

    {
        // Two receives; a send the server has no receive for, which the device retries (receiver
        // not ready) for as long as it takes; and a read and a write queued behind that send.
        let mut recv_a = std::pin::pin!(client.recv(recv_a, ..));
        let mut recv_b = std::pin::pin!(client.recv(recv_b, ..));
        let mut send = std::pin::pin!(client.send(send_buf, ..));
        let mut read = std::pin::pin!(client.read(read_buf, .., remote));
        let mut write = std::pin::pin!(client.write(write_buf, .., remote));
        assert!(poll_once(recv_a.as_mut()).await.is_pending());
        assert!(poll_once(recv_b.as_mut()).await.is_pending());
        assert!(
            poll_once(send.as_mut()).await.is_pending(),
            "the server posted no receive"
        );
        assert!(poll_once(read.as_mut()).await.is_pending());
        assert!(poll_once(write.as_mut()).await.is_pending());

        hooks::fail_next_poll(&client);
        // The server's message completes the first receive, which wakes the completion task into
        // the failure.
        let trigger = server.register(b"trigger".to_vec()).unwrap();
        let (sent_trigger, _) = guard("the server's send", server.send(trigger, ..)).await;
        // The client's failure closes its connection at once, which may overtake the
        // acknowledgement of this message: the server's send then ends with the close. What
        // the client received is checked below either way.
        if let Err(e) = sent_trigger {
            assert_eq!(
                e.kind(),
                std::io::ErrorKind::BrokenPipe,
                "the server's send failed otherwise than by the client's close: {e}"
            );
        }

        // The first receive's completion was in the queue when the poll failed; it is handed over
        // as usual if the queue can still be polled (here it can: the hook fails one poll).
        let (a, recv_a) = guard("the first receive", recv_a).await;
        match a {
            Ok(got) => assert_eq!(&recv_a[..got.len()], b"trigger"),
            Err(e) => assert_caused("the first receive", &e),
        }
        let (b, recv_b) = guard("the second receive", recv_b).await;
        assert_caused(
            "the second receive",
            &b.expect_err("nothing was sent for it"),
        );
        assert!(
            recv_b.iter().all(|&x| x == 0xb2),
            "the receive buffer changed"
        );
        let (s, send_buf) = guard("the send", send).await;
        assert_caused(
            "the send",
            &s.expect_err("the server never posted a receive"),
        );
        assert_eq!(&send_buf[..], &sent[..], "the send buffer changed");
        let (r, read_buf) = guard("the read", read).await;
        assert_caused("the read", &r.expect_err("queued behind the send"));
        assert!(
            read_buf.iter().all(|&x| x == 0xc3),
            "the read buffer changed"
        );
        let (w, write_buf) = guard("the write", write).await;
        assert_caused("the write", &w.expect_err("queued behind the send"));
        assert_eq!(&write_buf[..], &written[..], "the write buffer changed");
        assert!(
            target.to_vec().iter().all(|&x| x == 0),
            "the write reached the server"
        );

        // Later operations are refused with the same cause.
        let (later, _) = guard("a later send", client.send(send_buf, ..)).await;
        assert_caused("a later send", &later.expect_err("the connection ended"));
        let (later, _) = guard("a later receive", client.recv(recv_b, ..)).await;
        assert_caused("a later receive", &later.expect_err("the connection ended"));
    }

    // The client's queue pair is gone while the client still exists: only the server's is left.
    assert_eq!(
        rdma_resources("qp").unwrap(),
        1,
        "the client's queue pair was not destroyed"
    );
    drop(target);
    drop(client);
    drop(server);
    let counts = guard(
        "the RDMA resources to be released",
        settled_counts(&[0; LEAK_KINDS.len()]),
    )
    .await;
    assert_eq!(counts, vec![0; LEAK_KINDS.len()], "{LEAK_KINDS:?}");
}
