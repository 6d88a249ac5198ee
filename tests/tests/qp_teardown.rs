//! A queue pair whose destruction fails is never trusted to be gone: a test hook makes the next
//! `ibv_destroy_qp` fail. An `RdmaConnection` whose completion task fails (a test hook makes
//! its next poll fail) destroys its queue pair before handing the buffers of pending operations
//! back; when that destruction fails, the device may still write into those buffers, so only
//! those whose completion the device reported come back: the other pending operations stay
//! pending (each has no buffer to return with its result) and may be dropped, and the queue
//! pair is kept (leaked) with its buffers. Before, the result of the destruction was ignored,
//! the queue pair was gone from the device's count, and every buffer came back. In a binary
//! of its own: the queue pair and buffers it leaks on purpose would upset the resource counts
//! of the others.

use rdma_async::__test_hooks::{Teardown, fail_next_teardown};
use rdma_async::rdma::{RdmaOptions, hooks};
use rdma_async_device_tests::{guard, poll_once, rdma_pair, rdma_resources};

/// `EBUSY`, as a provider refusing to destroy a queue pair in use answers.
const EBUSY: i32 = 16;

// A current-thread runtime: the hook is per thread, and the destruction runs in the completion
// task, on this one.
#[rdma_async::test]
async fn a_queue_pair_that_could_not_be_destroyed_keeps_the_buffers_of_pending_operations() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let qps_before = rdma_resources("qp").unwrap();
    {
        let first_buf = client.reg_msgs(64).unwrap();
        let kept_buf = client.reg_msgs(64).unwrap();
        let mut first = std::pin::pin!(client.recv(first_buf, ..));
        let mut kept = std::pin::pin!(client.recv(kept_buf, ..));
        assert!(poll_once(first.as_mut()).await.is_pending());
        assert!(poll_once(kept.as_mut()).await.is_pending());

        hooks::fail_next_poll(&client);
        fail_next_teardown(Teardown::DestroyQueuePair, EBUSY);
        // The server's message completes the first receive, which wakes the completion task into
        // the failure: it fails the connection, whose queue pair then cannot be destroyed.
        let trigger = server.register(b"trigger".to_vec()).unwrap();
        let (sent, _) = guard("the server's send", server.send(trigger, ..)).await;
        sent.unwrap();
        // Completed before the failure: handed over as usual (a polled completion says the device
        // is done with the request), with its data or with the cause.
        let (_, first_buf) = guard("the first receive", first).await;
        assert_eq!(first_buf.len(), 64);

        // The connection failed: later operations are refused.
        let later = client.reg_msgs(64).unwrap();
        let (later, _) = guard("a later receive", client.recv(later, ..)).await;
        let err = later.expect_err("the connection failed");
        assert!(
            err.to_string().contains("injected by a test hook"),
            "a later receive ended with another error: {err}"
        );
        // The pending receive's buffer comes back only with a completion the device reported
        // (the queue pair, still there, is in the error state and may flush it at once);
        // otherwise the device may still write into it, and it stays with the queue pair.
        match poll_once(kept.as_mut()).await {
            std::task::Poll::Pending => {}
            std::task::Poll::Ready((result, _)) => {
                let err = result.expect_err("nothing was sent for the pending receive");
                assert!(err.to_string().contains("flushed"), "{err}");
            }
        }
        assert_eq!(
            rdma_resources("qp").unwrap(),
            qps_before,
            "the client's queue pair is gone: it was destroyed after all, or forgotten"
        );
        // Dropping the operation leaves its buffer with the queue pair.
    }
    // Dropping the connections leaks what the queue pair may use, and nothing more happens.
    drop(client);
    drop(server);
}
