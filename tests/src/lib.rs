//! Helpers shared by the device tests, one concept a module: addresses ([`addr`]), test data
//! ([`data`]), bound sockets ([`sockets`]) and connected pairs ([`pairs`]), what tests do to a
//! connected stream ([`streams`]), librdmacm's C tools and other programs ([`tools`]), unmodified
//! programs over rsockets ([`preload`]), the greeter's gRPC code ([`greeter`]), RDMA resource
//! counts for the leak tests ([`leaks`]) and the fixed ports tests listen on ([`ports`]). The
//! common ones are re-exported here, with the hang guard and the checks of an error that every
//! test binary uses.
//!
//! The tests play misbehaving peers through rdma-async's test hooks, which exist only under
//! `--cfg rdma_async_hooks`: the workspace's `.cargo/config.toml` sets it (a `RUSTFLAGS`
//! variable replaces it; rustc then says that the hooks are configured out).

pub mod wire;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::Poll;
use std::time::Duration;

use rdma_async::error::{CompletionError, cause};

pub mod addr;
pub mod data;
pub mod greeter;
pub mod leaks;
pub mod pairs;
pub mod ports;
pub mod preload;
pub mod rstream_peer;
pub mod soak;
pub mod sockets;
pub mod streams;
pub mod tls;
pub mod tools;

pub use addr::{test_addr, test_addr6, test_ip, test_ip6};
pub use leaks::{
    LEAK_KINDS, assert_no_rdma_resources, leak_counts, rdma_resources, settled_counts,
};
pub use pairs::{endpoint_pair, rdma_pair, stream_pair};
pub use sockets::{datagram, listener, rlistener, rlistener_with};
pub use tools::{connect_when_listening, finish_tool, spawn_tool};

/// Upper bound on any one test step: a hang guard, not a timing assertion.
pub const STEP: Duration = Duration::from_secs(60);

/// Runs `fut` with the hang guard.
pub async fn guard<T>(what: &str, fut: impl Future<Output = T>) -> T {
    guard_within(STEP, what, fut).await
}

/// Runs `fut` with a hang guard of `bound` instead of [`STEP`]: for steps on an impaired or dead
/// wire, which take longer (still a bound, not a timing assertion).
pub async fn guard_within<T>(bound: Duration, what: &str, fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(bound, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {bound:?}"))
}

/// Polls `fut` once and returns what that poll returned: an operation's work request is posted
/// by then, and a test can act while it is pending.
pub async fn poll_once<F: Future>(fut: Pin<&mut F>) -> Poll<F::Output> {
    let mut fut = Some(fut);
    std::future::poll_fn(|cx| Poll::Ready(fut.take().map(|f| f.poll(cx))))
        .await
        .expect("polled once")
}

/// The `io::ErrorKind` of a result that must be an error.
pub fn err_kind<T: std::fmt::Debug>(r: io::Result<T>) -> (io::ErrorKind, String) {
    let e = r.expect_err("expected an error");
    (e.kind(), e.to_string())
}

/// The work-completion status behind `err`, checking it is a real failure (not success, not a
/// flush, which only follows the failure that matters).
pub fn completion_status(err: &io::Error) -> u32 {
    let wc = cause::<CompletionError>(err)
        .unwrap_or_else(|| panic!("no CompletionError behind {err:?}"));
    assert_ne!(wc.status(), 0, "{err}");
    assert_ne!(wc.status(), 5, "the cause is not the flush: {err}");
    wc.status()
}
