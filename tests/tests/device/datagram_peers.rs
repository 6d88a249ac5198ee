//! A datagram socket's peer tables stay bounded (`RDatagramOptions::max_peers`) however many
//! senders it hears from, and the peers it forgot can still reach it.
//!
//! A SIDR request names the sender's bound port and queue pair in its private data, which the
//! sender chooses: one socket that introduces itself under a new port before each datagram
//! (the test hooks' `datagram::hooks::introduce_as`) is a new peer each time, to the server's route
//! table and address handles as to its sender table.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use rdma_async::datagram::hooks;
use rdma_async::datagram::{RDatagram, RDatagramOptions};
use rdma_async_device_tests::{datagram, guard, test_ip};

/// `RDatagramOptions::max_peers`'s documented default.
const DEFAULT_MAX_PEERS: usize = 1024;
/// `RDatagramOptions::send_depth`'s default: sends that may still hold a forgotten route's
/// address handle.
const SEND_DEPTH: usize = 64;

/// Echoes every datagram to its sender with `send_to(from)`, until aborted.
async fn echo_forever(server: Arc<RDatagram>) -> io::Result<()> {
    let mut buf = vec![0u8; server.max_datagram()];
    loop {
        let (n, from) = server.recv_from(&mut buf).await?;
        server.send_to(&buf[..n], from).await?;
    }
}

/// Sends `msg` to `server` and checks that the echo comes back from it.
async fn round_trip(client: &RDatagram, server: SocketAddr, msg: &[u8]) {
    guard("send", client.send_to(msg, server)).await.unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = guard("echo", client.recv_from(&mut buf)).await.unwrap();
    assert_eq!((&buf[..n], from), (msg, server), "the echo of {msg:?}");
}

/// One socket plays `count` senders, ports `first_port..`: before each datagram it introduces
/// itself to `server` under the next port, so the server attributes the datagram to a new
/// peer, learns a route (an address handle) back to it, and echoes through that route.
/// Returns the socket, still known to the server as its last port.
async fn many_senders(
    client: RDatagram,
    server: SocketAddr,
    first_port: u16,
    count: u16,
) -> io::Result<RDatagram> {
    for port in first_port..first_port + count {
        hooks::introduce_as(&client, server, port, client.qp_num()).await?;
        round_trip(&client, server, &port.to_be_bytes()).await;
    }
    Ok(client)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_senders_stay_within_max_peers() {
    const SENDERS: u16 = 5000;
    const CLIENTS: u16 = 25;
    let server = Arc::new(
        RDatagram::bind_with(SocketAddr::new(test_ip(), 0), &RDatagramOptions::new())
            .await
            .unwrap(),
    );
    let server_addr = server.local_addr().unwrap();
    let echo = tokio::spawn(echo_forever(server.clone()));
    // A peer heard from before the flood, whose route the flood makes the server forget.
    let early = datagram(test_ip()).await;
    round_trip(&early, server_addr, b"early").await;

    let started = std::time::Instant::now();
    let per_client = SENDERS / CLIENTS;
    let mut tasks = Vec::new();
    for k in 0..CLIENTS {
        let client = datagram(test_ip()).await;
        tasks.push(tokio::spawn(many_senders(
            client,
            server_addr,
            20_000 + k * per_client,
            per_client,
        )));
    }
    let mut clients = Vec::new();
    for task in tasks {
        clients.push(task.await.unwrap().unwrap());
    }
    println!(
        "{SENDERS} senders in {:.1} s",
        started.elapsed().as_secs_f64()
    );

    // Each of the 5000 (the newest ones last) got its echo through a route of its own; the
    // server remembers the most recent max_peers of them.
    let tables = hooks::peer_tables(&server);
    println!("after {SENDERS} senders: {tables:?}");
    assert_eq!(
        tables.routes, DEFAULT_MAX_PEERS,
        "the route table stays at max_peers: {tables:?}"
    );
    assert!(
        tables.senders <= DEFAULT_MAX_PEERS,
        "the sender table stays within max_peers: {tables:?}"
    );
    assert!(
        (DEFAULT_MAX_PEERS..=DEFAULT_MAX_PEERS + SEND_DEPTH).contains(&tables.address_handles),
        "one address handle per route, plus at most the sends in flight: {tables:?}"
    );

    // The newest senders are still remembered: their next datagrams go out and come back
    // through the routes the server keeps (no new route, no new address handle).
    for client in &clients {
        round_trip(client, server_addr, b"newest again").await;
    }
    let after = hooks::peer_tables(&server);
    assert_eq!(
        (after.routes, after.senders),
        (tables.routes, tables.senders),
        "the newest peers' routes were kept: {after:?}"
    );
    assert!(
        after.address_handles <= tables.address_handles,
        "no new address handle: {after:?}"
    );

    // The early peer's route was forgotten; its next datagram teaches the server a new one, and
    // the echo reaches it, named by its bound address.
    round_trip(&early, server_addr, b"early again").await;
    let tables = hooks::peer_tables(&server);
    assert_eq!(tables.routes, DEFAULT_MAX_PEERS, "{tables:?}");
    assert!(
        tables.address_handles <= DEFAULT_MAX_PEERS + SEND_DEPTH,
        "{tables:?}"
    );
    echo.abort();
}
