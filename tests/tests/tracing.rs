//! What a user with `tracing-subscriber` sees: spans per connection (peer, local address, queue
//! pair number) and events for listen, connect, accept, reject and disconnect.

use std::io::Write;
use std::sync::{Arc, Mutex};

use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::stream::RStream;
use rdma_async_device_tests::{guard, rlistener, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Everything the subscriber printed.
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<u8>>>);

impl Write for Capture {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Capture {
    fn lines(&self) -> Vec<String> {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn has_line(&self, parts: &[&str]) -> bool {
        self.lines()
            .iter()
            .any(|l| parts.iter().all(|p| l.contains(p)))
    }

    /// Asserts that one printed line contains every one of `parts`.
    fn assert_line(&self, parts: &[&str]) {
        assert!(
            self.has_line(parts),
            "no line with all of {parts:?} in:\n{}",
            self.lines().join("\n")
        );
    }

    /// Waits (under the hang guard) for a line that another task prints.
    async fn wait_for_line(&self, parts: &[&str]) {
        let what = format!("a line with all of {parts:?}");
        guard(&what, async {
            while !self.has_line(parts) {
                tokio::task::yield_now().await;
            }
        })
        .await;
    }
}

// One test per binary: the subscriber is the process's global default, as in an application.
#[rdma_async::test]
async fn connection_lifecycle_is_traced_in_spans() {
    let capture = Capture::default();
    let writer = capture.clone();
    tracing_subscriber::fmt()
        .with_max_level(tracing_subscriber::filter::LevelFilter::DEBUG)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .init();

    let listener = rlistener().await;
    let server_addr = listener.local_addr().unwrap();
    let (client, accepted) = guard("connect and accept", async {
        tokio::join!(RStream::connect(server_addr), listener.accept())
    })
    .await;
    let mut client = client.expect("connect");
    let (mut server, _) = accepted.expect("accept");
    let client_addr = client.local_addr().unwrap();
    client.write_all(b"ping").await.unwrap();
    let mut buf = [0; 4];
    guard("read", server.read_exact(&mut buf)).await.unwrap();
    drop(client);
    assert_eq!(guard("EOF", server.read(&mut buf)).await.unwrap(), 0);
    drop(server);

    // A peer that does not speak rsockets is rejected; the listener warns about it once an
    // accept call collects the failed handshake.
    let listener = Arc::new(listener);
    let acceptor = tokio::spawn({
        let listener = listener.clone();
        async move { listener.accept().await.map(|_| ()) }
    });
    let rejected = Endpoint::connect_with(server_addr, &EndpointOptions::new()).await;
    assert!(rejected.is_err(), "a non-rsockets peer was accepted");

    let server_span = format!("rdma_conn{{peer={client_addr} local={server_addr} qp=");
    let client_span = format!("rdma_conn{{peer={server_addr} local={client_addr} qp=");
    capture.assert_line(&[
        &format!("rdma_listener{{local={server_addr}}}"),
        "listening",
    ]);
    capture.assert_line(&["DEBUG", &client_span, "connected"]);
    capture.assert_line(&["DEBUG", &server_span, "accepted"]);
    capture.assert_line(&[
        "DEBUG",
        &format!("rdma_listener{{local={server_addr}}}"),
        "rejecting connection request",
    ]);
    capture.assert_line(&["DEBUG", &format!("dst={server_addr}"), "connect failed"]);
    capture
        .wait_for_line(&[
            "WARN",
            &format!("rdma_listener{{local={server_addr}}}"),
            &format!("peer={}", test_ip()),
            "rsocket handshake failed",
        ])
        .await;
    capture
        .wait_for_line(&["DEBUG", &client_span, "disconnecting"])
        .await;
    capture
        .wait_for_line(&["DEBUG", &client_span, "connection released"])
        .await;
    capture
        .wait_for_line(&["DEBUG", &server_span, "connection released"])
        .await;
    acceptor.abort();

    // A flood of bad requests does not flood the logs: what a peer causes is a warning only
    // within a budget (10 each 10 s), the rest goes to debug (before, every one was a warning).
    let peer_caused = [
        "rsocket handshake failed",
        "could not set up an incoming connection",
    ];
    let count = |level: Option<&str>| {
        capture
            .lines()
            .iter()
            .filter(|l| peer_caused.iter().any(|m| l.contains(m)))
            .filter(|l| level.is_none_or(|level| l.contains(level)))
            .count()
    };
    let before = count(None);
    let acceptor = tokio::spawn({
        let listener = listener.clone();
        async move { listener.accept().await.map(|_| ()) }
    });
    const FLOOD: usize = 30;
    for _ in 0..FLOOD {
        let rejected = guard(
            "a rejected request",
            Endpoint::connect_with(server_addr, &EndpointOptions::new()),
        )
        .await;
        assert!(rejected.is_err(), "a non-rsockets peer was accepted");
    }
    // Each rejected request is logged (as a failed handshake, and as a rejection with a
    // reason where the server set up anything); wait until the listener collected every one.
    let logged = guard("every rejected request logged", async {
        loop {
            let logged = count(None) - before;
            if logged >= FLOOD {
                return logged;
            }
            tokio::task::yield_now().await;
        }
    })
    .await;
    let warned = count(Some("WARN"));
    eprintln!("{FLOOD} rejected requests: {logged} lines, {warned} warnings in all");
    assert!(
        warned < count(None),
        "every one of {} peer-caused lines was a warning",
        count(None)
    );
    acceptor.abort();
    // Shown with --nocapture: what a user's subscriber prints.
    println!("{}", capture.lines().join("\n"));
}
