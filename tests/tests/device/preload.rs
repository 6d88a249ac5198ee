//! Unmodified C programs as peers: curl (and socat) linked against libc sockets, run with
//! rdma-core's `librspreload.so` in `LD_PRELOAD`, against our `RListener` servers, and our
//! `RStream` against such a program as the server.
//!
//! Nothing here listens or connects over TCP: our servers are `RListener`s and our client an
//! `RStream`, so an exchange that works went over rsockets' protocol on RDMA.
//! `examples/http_server` comes from `RDMA_ASYNC_EXAMPLES` (see `examples.rs`).

use std::net::SocketAddr;

use rdma_async_tests::data::pattern;
use rdma_async_tests::preload::{finish_with_input, preloaded};
use rdma_async_tests::tools::{Tool, example};
use rdma_async_tests::{argv, test_ip};

/// Size of the body curl posts to `/echo`.
const POST_BODY: usize = 8 << 20;

/// Starts `examples/http_server` on an ephemeral port; returns it and its address.
async fn http_server() -> (Tool, SocketAddr) {
    let mut server = Tool::spawn(&example("http_server"), &[format!("{}:0", test_ip())]);
    let line = server.wait_for("listening on http://").await;
    let addr = line
        .rsplit("http://")
        .next()
        .and_then(|a| a.trim().parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (server, addr)
}

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
    let (_server, addr) = http_server().await;
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
    let (_server, addr) = http_server().await;
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
    let (_server, addr) = http_server().await;
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
