//! Helpers shared by the device tests.

pub mod wire;

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

/// The resource kinds the leak tests count.
pub const LEAK_KINDS: [&str; 4] = ["cm_id", "qp", "mr", "cq"];

/// This process's count of each of [`LEAK_KINDS`] (see [`rdma_resources`]).
pub fn leak_counts() -> Vec<usize> {
    LEAK_KINDS
        .iter()
        .map(|k| rdma_resources(k).expect("rdma resource show"))
        .collect()
}

/// The `io::ErrorKind` of a result that must be an error.
pub fn err_kind<T: std::fmt::Debug>(r: io::Result<T>) -> (io::ErrorKind, String) {
    let e = r.expect_err("expected an error");
    (e.kind(), e.to_string())
}

/// Starts one of rdma-core's C tools (`ucmatose`, `rstream`, ...) with its output captured.
pub fn spawn_tool(program: &str, args: &[String]) -> tokio::process::Child {
    tokio::process::Command::new(program)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {program} (package rdmacm-utils): {e}"))
}

/// Waits for a C tool to exit successfully and returns what it printed.
pub async fn finish_tool(child: tokio::process::Child, program: &str) -> String {
    let out = guard(program, child.wait_with_output())
        .await
        .expect("tool output");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{program} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Connects with `connect`, retrying (boundedly) while refused: a C server just started may not
/// listen yet, and there is no event to wait for from another process.
pub async fn connect_when_listening<T, F, Fut>(mut connect: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    for _ in 0..500 {
        match connect().await {
            Ok(conn) => return conn,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tokio::task::yield_now().await
            }
            Err(e) => panic!("connect to the C server: {e}"),
        }
    }
    panic!("the C server never started listening");
}

/// A connected pair of [`rdma_async::rdma::RdmaConnection`]s (server, client) on the test address.
pub async fn rdma_pair(
    opts: &rdma_async::rdma::RdmaOptions,
) -> (
    rdma_async::rdma::RdmaConnection,
    rdma_async::rdma::RdmaConnection,
) {
    use rdma_async::rdma::RdmaConnection;
    let listener = listener().await;
    let addr = listener.local_addr();
    let server = async {
        let request = listener.accept_request().await?;
        RdmaConnection::accept(request, opts).await
    };
    let (server, client) = guard("RDMA connection", async {
        tokio::join!(server, RdmaConnection::connect(addr, opts))
    })
    .await;
    (server.expect("accept"), client.expect("connect"))
}
