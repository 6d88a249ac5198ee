//! A memory window whose deallocation fails is never trusted to have been revoked: a test hook
//! makes the next `ibv_dealloc_mw` fail. When the window's key was not revoked (its
//! invalidation could not run: the connection was closed first), the window may still be
//! bound, so its region does not come back and the error says the window could not be revoked;
//! when the invalidation completed, the key is revoked and the region comes back with the
//! deallocation's error. Before, the failure was only logged and the region came back in both
//! cases, reusable under a key the peer might still hold. In a binary of its own: the regions
//! and windows these tests leak on purpose would upset the resource counts of the others.

use std::io;

use rdma_async::__test_hooks::{Teardown, fail_next_teardown};
use rdma_async::rdma::{BoundWindow, RdmaConnection, RdmaOptions, RemoteAccess};
use rdma_async_device_tests::{guard, rdma_pair};

/// `EBUSY`, as a provider refusing to deallocate a window in use answers.
const EBUSY: i32 = 16;

/// A window over the whole of a new 4 KiB region of `conn`.
async fn bound_window(conn: &RdmaConnection) -> BoundWindow {
    let region = conn.reg_bindable(4096).unwrap();
    guard("bind", conn.bind_window(region, .., RemoteAccess::WRITE))
        .await
        .unwrap()
}

// Current-thread runtimes: the hook is per thread, and the deallocation runs in the
// invalidation's future, on this one.
#[rdma_async::test]
async fn a_window_that_could_not_be_revoked_never_gives_its_region_back() {
    let (server, _client) = rdma_pair(&RdmaOptions::new()).await;
    let window = bound_window(&server).await;
    // Closed: the invalidation is refused before it is posted, so the key is not revoked.
    server.disconnect().await.unwrap();
    fail_next_teardown(Teardown::DeallocWindow, EBUSY);
    let err = guard("invalidate", server.invalidate_window(window))
        .await
        .expect_err("the invalidation cannot run on a closed connection");
    assert!(
        err.region().is_none(),
        "the region of a window that may still be bound came back: {err}"
    );
    let message = err.to_string();
    assert!(
        message.contains("could not be revoked") && message.contains("ibv_dealloc_mw"),
        "the error does not say the window could not be revoked: {message}"
    );
    // The invalidation's own error still gives the kind.
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
}

#[rdma_async::test]
async fn a_revoked_windows_region_comes_back_though_its_deallocation_failed() {
    let (server, _client) = rdma_pair(&RdmaOptions::new()).await;
    let window = bound_window(&server).await;
    fail_next_teardown(Teardown::DeallocWindow, EBUSY);
    let err = guard("invalidate", server.invalidate_window(window))
        .await
        .expect_err("the window's deallocation failed");
    let message = err.to_string();
    assert!(
        message.contains("key was revoked") && message.contains("ibv_dealloc_mw"),
        "the error does not name the failed deallocation: {message}"
    );
    assert_eq!(err.kind(), io::ErrorKind::ResourceBusy, "{err}");
    let region = err
        .into_region()
        .expect("the invalidation completed: the key is revoked and the region comes back");
    assert_eq!(region.len(), 4096);
}
