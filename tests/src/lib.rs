//! Helpers shared by the device tests.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use rdma_async::cm::CmListener;

/// Upper bound on any one test step: a hang guard, not a timing assertion.
pub const STEP: Duration = Duration::from_secs(60);

/// The address of the RDMA netdev, as `scripts/softroce` exports it.
pub fn test_ip() -> IpAddr {
    ip_from_env("RDMA_ASYNC_TEST_ADDR")
}

/// The IPv6 address of the RDMA netdev.
pub fn test_ip6() -> IpAddr {
    ip_from_env("RDMA_ASYNC_TEST_ADDR6")
}

fn ip_from_env(var: &str) -> IpAddr {
    let value = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the device tests through scripts/softroce")
    });
    value
        .parse()
        .unwrap_or_else(|e| panic!("{var}={value:?} is not an IP address: {e}"))
}

/// A listener on the test address with an ephemeral port.
pub async fn listener() -> CmListener {
    CmListener::bind(SocketAddr::new(test_ip(), 0))
        .await
        .expect("bind listener on the RDMA test address")
}

/// Runs `fut` with the hang guard.
pub async fn guard<T>(what: &str, fut: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(STEP, fut)
        .await
        .unwrap_or_else(|_| panic!("{what} did not finish within {STEP:?}"))
}

/// How many RDMA resources of `kind` (`cm_id`, `qp`, `cq`, `mr`, `pd`) this process owns, from
/// `rdma resource show`, which reads the kernel's own accounting. The kernel records the thread
/// that created each resource, so every thread of this process counts; count while the threads
/// that created resources (the runtime's workers) are still alive.
pub fn rdma_resources(kind: &str) -> io::Result<usize> {
    let out = std::process::Command::new("rdma")
        .args(["-j", "resource", "show", kind])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "rdma resource show {kind} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let ours: Vec<String> = std::fs::read_dir("/proc/self/task")?
        .filter_map(|t| t.ok()?.file_name().into_string().ok())
        .collect();
    let text = String::from_utf8_lossy(&out.stdout);
    let owned = text
        .split("\"pid\":")
        .skip(1)
        .filter(|rest| {
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            ours.contains(&pid)
        })
        .count();
    Ok(owned)
}

/// The `io::ErrorKind` of a result that must be an error.
pub fn err_kind<T: std::fmt::Debug>(r: io::Result<T>) -> (io::ErrorKind, String) {
    let e = r.expect_err("expected an error");
    (e.kind(), e.to_string())
}
