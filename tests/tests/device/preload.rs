//! Unmodified C programs as peers: curl, socat and ncat, linked against libc sockets, run with
//! rdma-core's `librspreload.so` in `LD_PRELOAD`: curl, socat and ncat as clients of our
//! `RListener` servers, ncat also as the server our `RStream` connects to. Which programs work under
//! librspreload and why the others do not: `docs/preload.md`.
//!
//! Nothing here listens or connects over TCP: our servers are `RListener`s and our client an
//! `RStream`, so an exchange that works went over rsockets' protocol on RDMA.
//! `examples/http_server` comes from `RDMA_ASYNC_EXAMPLES` (see `examples.rs`).

use std::net::SocketAddr;

use rdma_async::stream::{RListener, RStream};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::ports;
use rdma_async_device_tests::preload::{finish_with_input, preloaded, run_on_files};
use rdma_async_device_tests::tools::http_server;
use rdma_async_device_tests::{argv, connect_when_listening, guard, rlistener, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Size of the body curl posts to `/echo`.
const POST_BODY: usize = 8 << 20;

/// Runs curl under librspreload with `args` and `input` on its stdin; returns its stdout.
async fn curl(args: Vec<String>, input: Vec<u8>) -> Vec<u8> {
    // --fail: an HTTP error is a failed run; -sS: quiet, but errors printed.
    let mut all = argv!["--fail", "-sS"];
    all.extend(args);
    finish_with_input(preloaded("curl", &all), "curl", input)
        .await
        .stdout
}

#[rdma_async::test]
async fn curl_gets_from_http_server() {
    let (_server, addr) = http_server(&[]).await;
    let body = curl(argv![format!("http://{addr}/from-curl")], Vec::new()).await;
    let body = String::from_utf8(body).expect("UTF-8 body");
    assert!(
        body.starts_with(&format!("hello {}:", test_ip()))
            && body.ends_with("you asked for /from-curl over RDMA\n"),
        "{body:?}"
    );
}

#[rdma_async::test]
async fn curl_speaks_http2_with_prior_knowledge() {
    let (_server, addr) = http_server(&[]).await;
    let out = curl(
        argv![
            "--http2-prior-knowledge",
            // After the body, a line with the protocol version of the response.
            "-w",
            "\nversion %{http_version}",
            format!("http://{addr}/h2")
        ],
        Vec::new(),
    )
    .await;
    let out = String::from_utf8(out).expect("UTF-8 output");
    let (body, version) = out.rsplit_once('\n').expect("a version line");
    assert_eq!(version, "version 2", "{out:?}");
    assert!(body.ends_with("you asked for /h2 over RDMA\n"), "{out:?}");
}

#[rdma_async::test]
async fn curl_posts_8_mib_and_gets_it_echoed() {
    let (_server, addr) = http_server(&[]).await;
    let sent = pattern(15, POST_BODY);
    // The body from stdin (`@-`), the answer to stdout.
    let echoed = curl(
        argv![
            "--data-binary",
            "@-",
            "-H",
            "content-type: application/octet-stream",
            format!("http://{addr}/echo")
        ],
        sent.clone(),
    )
    .await;
    assert_eq!(echoed.len(), sent.len(), "echoed body length");
    assert!(echoed == sent, "the echoed body differs from the one sent");
}

/// Size of the data socat and ncat carry each way.
const STREAM_DATA: usize = 1 << 20;

/// socat's options: wait up to 60 s (a hang guard, not a delay: socat ends as soon as both
/// directions are at EOF) for the other direction once one is at EOF.
fn socat_args(local: &str, remote: String) -> Vec<String> {
    // -d -d: socat says what it does on stderr, shown if it fails.
    argv!["-d", "-d", "-t", "60", local, remote]
}

/// Accepts one client on `listener`, reads everything until its EOF, then sends it back and
/// closes; returns how many bytes it echoed. Not a streaming echo: socat and ncat block in a
/// write until all of it is sent, and read nothing meanwhile, so an echo that stops reading
/// while its own writes wait could deadlock with them.
fn echo_once(listener: RListener, client: &'static str) -> tokio::task::JoinHandle<usize> {
    tokio::spawn(async move {
        let (mut stream, _peer) = listener.accept().await.expect("accept the client");
        let mut received = Vec::new();
        stream
            .read_to_end(&mut received)
            .await
            .unwrap_or_else(|e| panic!("read from {client}: {e}"));
        stream
            .write_all(&received)
            .await
            .unwrap_or_else(|e| panic!("echo to {client}: {e}"));
        stream.shutdown().await.expect("shutdown after echo");
        received.len()
    })
}

/// Runs `program` with `args` under librspreload as a client of an echo server on
/// `listener`: what it sent comes back byte for byte.
async fn client_through_our_echo_server(
    listener: RListener,
    program: &'static str,
    args: &[String],
    seed: u64,
) {
    let echo = echo_once(listener, program);
    let sent = pattern(seed, STREAM_DATA);
    let out = run_on_files(program, args, &sent).await;
    assert_eq!(
        guard("echo server", echo).await.unwrap(),
        STREAM_DATA,
        "bytes our server echoed to {program}"
    );
    assert_eq!(out.len(), sent.len(), "bytes {program} received");
    assert!(out == sent, "{program} received other bytes than it sent");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn socat_client_through_our_echo_server() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let args = socat_args("STDIO", format!("TCP4:{addr}"));
    client_through_our_echo_server(listener, "socat", &args, 16).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn ncat_client_through_our_echo_server() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    // ncat's default engine waits with epoll, which librspreload does not intercept; as a
    // client it works with `select`. At the end of its input it shuts down writing (our
    // server's EOF) and reads until we close.
    let args = argv![
        "--nsock-engine",
        "select",
        addr.ip().to_string(),
        addr.port()
    ];
    client_through_our_echo_server(listener, "ncat", &args, 17).await;
}

/// The port ncat listens on.
const NCAT_PORT: u16 = ports::NCAT_PRELOADED;

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_receives_from_ncat_server() {
    // A fixed port: our client must know it, and ncat does not print it.
    let addr = SocketAddr::new(test_ip(), NCAT_PORT);
    let from_ncat = pattern(19, STREAM_DATA);
    // ncat's default engine waits with epoll, which librspreload does not intercept; with
    // `poll` it serves. `--send-only`: send stdin, then close.
    let ncat_args = argv![
        "--nsock-engine",
        "poll",
        "--send-only",
        "-l",
        test_ip(),
        NCAT_PORT
    ];
    let (_, received) = tokio::join!(run_on_files("ncat", &ncat_args, &from_ncat), async {
        let mut stream = connect_when_listening(|| RStream::connect(addr)).await;
        let mut received = Vec::new();
        let mut buf = vec![0u8; 64 << 10];
        // ncat exits without closing its rsocket (no DISCONNECT reaches us, only rdma_cm's
        // disconnect), so the stream may end in a reset after the last byte: a reader cannot
        // tell that from a peer that died with bytes in flight.
        let end = guard("receive from ncat", async {
            loop {
                match stream.read(&mut buf).await {
                    Ok(0) => return Ok(()),
                    Ok(n) => received.extend_from_slice(&buf[..n]),
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        if let Err(e) = end {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
        }
        received
    });
    assert_eq!(received.len(), from_ncat.len(), "bytes we received");
    assert!(
        received == from_ncat,
        "we received other bytes than ncat sent"
    );
}
