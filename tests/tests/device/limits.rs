//! Limits that users hit: the locked-memory limit (`RLIMIT_MEMLOCK`) and a device out of queue
//! pairs, completion queues or memory regions. Each failure names the limit (and how to raise
//! it, or the device's own limit), a server that hits one while accepting rejects the client
//! with the reason, and the process goes on serving the connections it has.
//!
//! The guest runs as root, whose `CAP_IPC_LOCK` lifts the locked-memory limit, so the
//! low-limit side runs as a child process (`limits-peer`) under `prlimit --memlock` and
//! without that capability (`setpriv`), as an unprivileged process would. Rxe's device limits
//! (1,048,560 queue pairs, 1,048,576 completion queues, 524,287 memory regions) are out of reach in a test, so
//! exhaustion is injected through the test hooks (`--cfg rdma_async_hooks`): the next creation on this thread
//! fails with `ENOMEM`, as a device that ran out reports it.

use std::io;
use std::net::SocketAddr;

use rdma_async::__test_hooks::{Resource, fail_next};
use rdma_async::cm::{CmError, CmListener};
use rdma_async::error::cause;
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::streams::echo_once;
use rdma_async_device_tests::tools::{finish_tool, spawn_limits_peer, stdout_lines};
use rdma_async_device_tests::{guard, listener, rlistener};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;

/// The locked-memory limit of the child, in bytes: a 4 KiB region fits, a stream's 128 KiB
/// rings do not.
const MEMLOCK: u64 = 64 * 1024;

/// `ENOMEM`, what a device out of objects (or memory) returns.
const ENOMEM: i32 = 12;

/// `limits-peer ARGS` under a `MEMLOCK`-byte locked-memory limit and without `CAP_IPC_LOCK`.
fn spawn_limited(args: &[&str]) -> Child {
    spawn_limits_peer(MEMLOCK, args)
}

/// Runs `limits-peer ARGS` under the limit to its end; returns what it printed.
async fn run_limited(args: &[&str]) -> String {
    finish_tool(spawn_limited(args), "limits-peer").await
}

/// The line `NAME ...` that `limits-peer` printed.
fn outcome<'a>(text: &'a str, name: &str) -> &'a str {
    text.lines()
        .find(|l| l.split(' ').next() == Some(name))
        .unwrap_or_else(|| panic!("limits-peer printed no {name:?} line:\n{text}"))
}

/// Asserts that `line` is a registration failure that names the locked-memory limit, the size
/// asked and the ways to raise the limit.
fn assert_names_the_memlock_limit(line: &str, size: usize) {
    for part in [
        "error OutOfMemory:".to_owned(),
        format!("cannot register {size} bytes"),
        "RLIMIT_MEMLOCK".to_owned(),
        format!("is {MEMLOCK} bytes"),
        "ulimit -l".to_owned(),
        "LimitMEMLOCK=".to_owned(),
        "--ulimit memlock=-1".to_owned(),
    ] {
        assert!(line.contains(&part), "{part:?} missing from: {line}");
    }
}

/// Registrations beyond the limit (`RdmaConnection::reg_msgs` and `register`) fail with
/// `OutOfMemory` naming the limit, the size and the fixes; one within it succeeds.
#[rdma_async::test]
async fn registration_beyond_the_memlock_limit_names_the_limit_the_size_and_the_fix() {
    let text = run_limited(&["register"]).await;
    assert_eq!(outcome(&text, "setup"), "setup ok", "{text}");
    assert_eq!(
        outcome(&text, "reg_msgs-4KiB"),
        "reg_msgs-4KiB ok",
        "{text}"
    );
    assert_names_the_memlock_limit(outcome(&text, "reg_msgs-1MiB"), 1 << 20);
    assert_names_the_memlock_limit(outcome(&text, "register-1MiB"), 1 << 20);
}

/// A client whose stream rings do not fit under its limit fails to connect with the same
/// explanation (the 128 KiB send ring is the first registration).
#[rdma_async::test]
async fn a_stream_client_under_the_memlock_limit_is_told_why() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap().to_string();
    let text = run_limited(&["connect-stream", &addr]).await;
    assert_names_the_memlock_limit(outcome(&text, "connect-stream"), 128 * 1024);
}

/// An `RListener` under the limit cannot register a connection's rings: it logs why and rejects
/// the client with the reason, so the client's error says the server could not set up the
/// connection and why (not a bare refusal).
#[rdma_async::test]
async fn a_stream_server_under_the_memlock_limit_rejects_with_the_reason() {
    let mut child = spawn_limited(&["serve-stream"]);
    let mut lines = stdout_lines(&mut child);
    let mut seen = String::new();
    let addr: SocketAddr = guard("limits-peer listens", async {
        while let Some(line) = lines.next_line().await.expect("output") {
            seen.push_str(&line);
            seen.push('\n');
            if let Some(addr) = line.strip_prefix("listening ") {
                return addr.parse().expect("the listening address");
            }
        }
        panic!("limits-peer ended before listening:\n{seen}");
    })
    .await;

    let err = guard("connect", RStream::connect(addr))
        .await
        .expect_err("the server cannot set the connection up");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    let text = err.to_string();
    for part in [
        format!("the server at {addr} could not set up the connection"),
        "memory registration of 131072 bytes failed".to_owned(),
        format!("RLIMIT_MEMLOCK is {MEMLOCK} bytes"),
        "ulimit -l".to_owned(),
    ] {
        assert!(text.contains(&part), "{part:?} missing from: {text}");
    }
    let reason = cause::<CmError>(&err)
        .and_then(CmError::reject_reason)
        .expect("the reason travels in the reject's private data");
    assert!(reason.contains("131072 bytes"), "{reason}");

    // The server's log says it too, in full.
    let logged = guard("the server logs the failure", async {
        while let Some(line) = lines.next_line().await.expect("output") {
            seen.push_str(&line);
            seen.push('\n');
            if line.contains("WARN") && line.contains("RLIMIT_MEMLOCK") {
                return line;
            }
        }
        panic!("limits-peer ended without logging the failure:\n{seen}");
    })
    .await;
    assert!(logged.contains("LimitMEMLOCK="), "{logged}");
    child.kill().await.expect("stop limits-peer");
}

/// What each injected exhaustion must name: in the server's error (the object, the device's
/// limit) and in the reason the client gets.
fn names(resource: Resource) -> [&'static str; 3] {
    match resource {
        Resource::QueuePair => [
            "cannot create a queue pair",
            "queue pairs (max_qp)",
            "out of queue pairs or memory (max_qp ",
        ],
        Resource::CompletionQueue => [
            "cannot create a completion queue",
            "completion queues (max_cq)",
            "out of completion queues or memory (max_cq ",
        ],
        Resource::MemoryRegion => [
            "cannot register",
            "memory regions (max_mr)",
            "out of memory or memory regions (max_mr ",
        ],
    }
}

/// Serves one accepted stream: echoes until EOF.
fn spawn_echo(mut stream: RStream) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = vec![0; 4096];
        loop {
            let n = stream.read(&mut buf).await.expect("server read");
            if n == 0 {
                return;
            }
            stream.write_all(&buf[..n]).await.expect("server write");
        }
    })
}

/// Accepts the next request as a stream; with `exhausted`, the server's next creation of that
/// resource fails as a device out of it would. (The client's own queue pair and memory exist
/// by then: it sends its request only after creating them.)
async fn accept_stream(listener: &CmListener, exhausted: Option<Resource>) -> io::Result<RStream> {
    let request = listener.accept_request().await?;
    if let Some(resource) = exhausted {
        fail_next(resource, ENOMEM);
    }
    RStream::accept(request, &RStreamOptions::new()).await
}

/// A server out of queue pairs, completion queues or memory regions fails that one accept with
/// `OutOfMemory` naming the resource and the device's limit, rejects the client with the reason,
/// and goes on serving: an established stream keeps echoing and the next client is served.
#[rdma_async::test]
async fn a_server_out_of_a_resource_rejects_with_the_reason_and_keeps_serving() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let (server, client) = guard("connect", async {
        tokio::join!(accept_stream(&listener, None), RStream::connect(addr))
    })
    .await;
    let echo = spawn_echo(server.expect("accept"));
    let mut established = client.expect("connect");
    echo_once(&mut established, b"before").await.expect("echo");

    for resource in [
        Resource::QueuePair,
        Resource::CompletionQueue,
        Resource::MemoryRegion,
    ] {
        let (server, client) = guard("a refused connect", async {
            tokio::join!(
                accept_stream(&listener, Some(resource)),
                RStream::connect(addr)
            )
        })
        .await;
        let err = server.expect_err("the accept fails");
        assert_eq!(
            err.kind(),
            io::ErrorKind::OutOfMemory,
            "{resource:?}: {err}"
        );
        let text = err.to_string();
        let [object, limit, reason] = names(resource);
        for part in [object, limit] {
            assert!(
                text.contains(part),
                "{resource:?}: {part:?} missing from {text}"
            );
        }

        let err = client.expect_err("the client is rejected");
        assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
        let text = err.to_string();
        let said = format!("the server at {addr} could not set up the connection: ");
        assert!(text.contains(&said), "{resource:?}: {text}");
        assert!(
            text.contains(reason),
            "{resource:?}: {reason:?} missing from {text}"
        );

        // What the server has keeps working, and the next client is served.
        echo_once(&mut established, format!("after {resource:?}").as_bytes())
            .await
            .expect("echo");
        let (server, client) = guard("the next connect", async {
            tokio::join!(accept_stream(&listener, None), RStream::connect(addr))
        })
        .await;
        let next_echo = spawn_echo(server.expect("the next accept"));
        let mut next = client.expect("the next connect");
        echo_once(&mut next, b"next").await.expect("echo");
        next.shutdown().await.expect("shutdown");
        guard("the next echo ends", next_echo)
            .await
            .expect("echo task");
    }
    established.shutdown().await.expect("shutdown");
    guard("the echo ends", echo).await.expect("echo task");
}

/// The same on the verbs-level transport, whose server hands the error to the application:
/// `RdmaConnection::accept` out of queue pairs fails naming them, the client is told why.
#[rdma_async::test]
async fn an_rdma_server_out_of_queue_pairs_rejects_with_the_reason() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let opts = RdmaOptions::new();
    let server = async {
        let request = listener.accept_request().await?;
        fail_next(Resource::QueuePair, ENOMEM);
        RdmaConnection::accept(request, &opts).await
    };
    let (server, client) = guard("a refused connect", async {
        tokio::join!(server, RdmaConnection::connect_with(addr, &opts))
    })
    .await;
    let err = server.expect_err("the accept fails");
    assert_eq!(err.kind(), io::ErrorKind::OutOfMemory, "{err}");
    assert!(err.to_string().contains("queue pairs (max_qp)"), "{err}");
    let err = client.expect_err("the client is rejected");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    let reason = cause::<CmError>(&err)
        .and_then(CmError::reject_reason)
        .unwrap_or_else(|| panic!("no reason in {err}"));
    assert!(reason.contains("cannot create a queue pair"), "{reason}");
    assert!(reason.contains("max_qp"), "{reason}");
}

/// A client out of completion queues (or queue pairs) fails its connect naming the resource,
/// before anything is sent; the next connect works.
#[rdma_async::test]
async fn a_client_out_of_a_resource_is_told_which() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    for (resource, part) in [
        (Resource::CompletionQueue, "completion queues (max_cq)"),
        (Resource::QueuePair, "queue pairs (max_qp)"),
    ] {
        fail_next(resource, ENOMEM);
        let err = guard("connect", RStream::connect(addr))
            .await
            .expect_err("the client cannot set up");
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory, "{err}");
        assert!(
            err.to_string().contains(part),
            "{part:?} missing from {err}"
        );
    }
    let (accepted, connected) = guard("connect", async {
        tokio::join!(listener.accept(), RStream::connect(addr))
    })
    .await;
    let echo = spawn_echo(accepted.expect("accept").0);
    let mut stream = connected.expect("connect");
    echo_once(&mut stream, b"works again").await.expect("echo");
    stream.shutdown().await.expect("shutdown");
    guard("the echo ends", echo).await.expect("echo task");
}
