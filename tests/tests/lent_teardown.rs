//! A deregistration that fails is never trusted: the lending ring's first half is deregistered
//! when it is first lent, and a test hook makes that `ibv_dereg_mr` fail. The read fails with
//! that cause; the registration stays (the peer may still use its key), so dropping the stream
//! deregisters it before the ring is freed and this process's memory regions come back to
//! where they were. Before, the failed registration was forgotten: it was never deregistered,
//! and the ring's memory was freed under a key the peer still held. One test in its own binary:
//! it counts this process's memory regions.

use std::io;

use rdma_async::__test_hooks::{Teardown, fail_next_teardown};
use rdma_async::stream::RStreamOptions;
use rdma_async::stream::hooks;
use rdma_async_device_tests::{guard, leak_counts, settled_counts, stream_pair};
use tokio::io::AsyncWriteExt;

/// `EBUSY`, as a provider refusing to deregister memory still in use answers.
const EBUSY: i32 = 16;

/// The receive ring: two halves of 32 KiB.
const HALF: usize = 32 << 10;

// A current-thread runtime: the hook is per thread, and the lend runs on this one.
#[rdma_async::test]
async fn a_failed_deregistration_keeps_the_memory_registered_until_it_can_go() {
    let baseline = leak_counts();
    let options = RStreamOptions::new()
        .recv_buffer_size(2 * HALF as u32)
        .zero_copy_reads(true);
    let (mut server, mut client) = stream_pair(options).await;
    guard("fill the first half", client.write_all(&[7; HALF]))
        .await
        .unwrap();
    guard("the first half arrives", async {
        while hooks::readable_len(&server).unwrap() < HALF {
            server.readable().await.unwrap();
            tokio::task::yield_now().await;
        }
    })
    .await;
    fail_next_teardown(Teardown::DeregisterMemory, EBUSY);
    let err = guard("lend the first half", server.read_lent(HALF))
        .await
        .map(|bytes| bytes.len())
        .expect_err("the half's deregistration failed");
    assert!(
        err.to_string().contains("ibv_dereg_mr"),
        "the read does not name the failed deregistration: {err}"
    );
    assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
    drop(server);
    drop(client);
    // Dropped streams linger until their DISCONNECT is out; then every registration, the one
    // whose deregistration failed included, is gone.
    guard(
        "memory regions back to the baseline",
        settled_counts(&baseline),
    )
    .await;
}
