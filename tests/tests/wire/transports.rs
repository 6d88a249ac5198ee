//! Every transport across a wire: node 1 (these tests) and node 2 (`wire-peer`, the examples
//! or librdmacm's C tools, started through `scripts/on-peer`) of a `scripts/softroce --pair`
//! boot, with Soft-RoCE on each end's NIC, so every packet crosses a real (virtual) Ethernet.
//! Each test starts its own peer program on its own port.

use std::io;
use std::net::SocketAddr;

use rdma_async::datagram::RDatagram;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::stream::{RListener, RStream};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::rstream_peer::{
    c_rstream_verify_args, rstream_exchange, serve_c_rstream_client,
};
use rdma_async_device_tests::tools::example;
use rdma_async_device_tests::wire::{
    Fnv, PeerJob, check_greeting_get, connect_retrying, echo_through, http_client, on_peer,
    peer_ip, peer_program, rdma_client, rdma_write_read_check, tonic_channel,
};
use rdma_async_device_tests::{guard, test_ip};
use tokio::io::AsyncWriteExt;
use tokio_stream::StreamExt;

use rdma_async_device_tests::greeter::HelloRequest;
use rdma_async_device_tests::greeter::greeter_client::GreeterClient;
use rdma_async_device_tests::ports;

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rstream_echo_full_duplex_and_half_close() {
    let Some(peer) = peer_ip() else { return };
    let port = &ports::WIRE_STREAM_ECHO.to_string();
    let server = PeerJob::start(
        "stream-echo",
        "ready",
        &[&peer_program(), "stream-echo", port],
    )
    .await;
    let addr = SocketAddr::new(peer, ports::WIRE_STREAM_ECHO);
    let mut stream = connect_retrying(|| RStream::connect(addr)).await;
    assert_eq!(stream.peer_addr().unwrap(), addr);
    assert_eq!(stream.local_addr().unwrap().ip(), test_ip());
    let data = pattern(1, 3 << 20);
    guard("echo of 3 MiB", echo_through(&mut stream, &data, 100_000)).await;
    let err = stream
        .write_all(b"x")
        .await
        .expect_err("write after shutdown");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
    drop(stream);
    // A second connection to the same server: small writes, one at a time.
    let mut stream = connect_retrying(|| RStream::connect(addr)).await;
    let small = pattern(2, 5000);
    guard("echo of small writes", echo_through(&mut stream, &small, 7)).await;
    drop(stream);
    let text = server.stop().await;
    // Node 2 hashed what it received: the same bytes.
    for (len, bytes) in [(data.len(), &data), (small.len(), &small)] {
        let line = format!("{len} bytes, fnv {:016x}, Ok(())", Fnv::of(bytes));
        assert!(text.contains(&line), "node 2 did not log {line:?}:\n{text}");
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_messages_echo() {
    let Some(peer) = peer_ip() else { return };
    let server = PeerJob::start(
        "endpoint-echo",
        "ready",
        &[
            &peer_program(),
            "endpoint-echo",
            &ports::WIRE_ENDPOINT_ECHO.to_string(),
        ],
    )
    .await;
    let addr = SocketAddr::new(peer, ports::WIRE_ENDPOINT_ECHO);
    let opts = EndpointOptions::new();
    let ep = connect_retrying(|| Endpoint::connect_with(addr, &opts)).await;
    assert_eq!(ep.peer_addr().unwrap(), addr);
    let max = ep.max_message_size();
    let sizes = [1usize, 2, 64, 1000, 1024, 1025, max - 1, max];
    for (i, &n) in sizes.iter().enumerate() {
        let msg = pattern(i as u64, n);
        guard("send", ep.send(&msg)).await.unwrap();
        let back = guard("recv", ep.recv()).await.unwrap();
        assert!(
            back[..] == msg[..],
            "message {i} ({n} bytes) came back different"
        );
    }
    // Several in flight before the first echo is read.
    for i in 0..20u8 {
        guard("send", ep.send(&[i; 300])).await.unwrap();
    }
    for i in 0..20u8 {
        assert_eq!(guard("recv", ep.recv()).await.unwrap()[..], [i; 300]);
    }
    drop(ep);
    let text = server.stop().await;
    assert!(
        text.contains(&format!("{} messages", sizes.len() + 20)),
        "{text}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_connection_send_recv_write_read_and_atomics() {
    let Some(peer) = peer_ip() else { return };
    const LEN: usize = 1 << 20;
    let server = PeerJob::start(
        "rdma",
        "ready",
        &[
            &peer_program(),
            "rdma",
            &ports::WIRE_RDMA.to_string(),
            &LEN.to_string(),
        ],
    )
    .await;
    let (conn, remote) = rdma_client(SocketAddr::new(peer, ports::WIRE_RDMA)).await;
    // send / recv: node 2 echoes each message.
    for (i, n) in [1usize, 100, 4096, 65_536].into_iter().enumerate() {
        let mut out = conn.reg_msgs(n).unwrap();
        out.copy_from_slice(&pattern(10 + i as u64, n));
        let recv = conn.recv(conn.reg_msgs(65_536).unwrap(), ..);
        let send = conn.send(out, ..);
        let ((got, inbox), (sent, out)) = guard("echo", async { tokio::join!(recv, send) }).await;
        sent.unwrap();
        assert_eq!(got.unwrap().len(), n);
        assert!(
            inbox[..n] == out[..],
            "message of {n} bytes came back different"
        );
    }
    // One-sided writes and reads over all of the region, twice with different data.
    guard(
        "write/read 1 MiB",
        rdma_write_read_check(&conn, &remote, &pattern(20, LEN), 65_536),
    )
    .await;
    guard(
        "write/read 1 MiB in odd chunks",
        rdma_write_read_check(&conn, &remote, &pattern(21, LEN), 9_999),
    )
    .await;
    // Atomics on the first word.
    let word = remote.slice(0, 8).unwrap();
    let mut buf = conn.reg_msgs(8).unwrap();
    buf.copy_from_slice(&100u64.to_ne_bytes());
    let (r, buf) = conn.write(buf, .., word).await;
    r.unwrap();
    if conn.supports_atomics() {
        let (old, buf) = conn.fetch_and_add(buf, 0, word, 5).await;
        assert_eq!(old.unwrap(), 100);
        let (old, buf) = conn.compare_and_swap(buf, 0, word, 1, 9).await;
        assert_eq!(old.unwrap(), 105, "a failed compare leaves the word");
        let (old, buf) = conn.compare_and_swap(buf, 0, word, 105, 7).await;
        assert_eq!(old.unwrap(), 105);
        let (r, buf) = conn.read(buf, .., word).await;
        r.unwrap();
        assert_eq!(u64::from_ne_bytes(buf[..8].try_into().unwrap()), 7);
    }
    drop(conn);
    server.stop().await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdatagram_echo_across_the_wire() {
    let Some(peer) = peer_ip() else { return };
    let server = PeerJob::start(
        "dgram-echo",
        "ready",
        &[
            &peer_program(),
            "dgram-echo",
            &ports::WIRE_DATAGRAM_ECHO.to_string(),
        ],
    )
    .await;
    let target = SocketAddr::new(peer, ports::WIRE_DATAGRAM_ECHO);
    let socket = RDatagram::bind(SocketAddr::new(test_ip(), 0))
        .await
        .unwrap();
    let max = socket.max_datagram();
    let mut buf = vec![0u8; max + 1];
    for (i, n) in [0usize, 1, 100, 1000, max].into_iter().enumerate() {
        let msg = pattern(30 + i as u64, n);
        // Datagrams may be lost (the first one resolves the route): resend until echoed.
        let (got, from) = guard("datagram echo", async {
            loop {
                socket.send_to(&msg, target).await.unwrap();
                let wait = tokio::time::timeout(
                    std::time::Duration::from_secs(5),
                    socket.recv_from(&mut buf),
                );
                if let Ok(r) = wait.await {
                    break r.unwrap();
                }
            }
        })
        .await;
        assert_eq!(from, target);
        assert!(
            buf[..got] == msg[..],
            "datagram of {n} bytes came back different"
        );
    }
    drop(socket);
    server.stop().await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn multicast_crosses_the_wire() {
    let Some(peer) = peer_ip() else { return };
    let group: std::net::IpAddr = "239.77.1.10".parse().unwrap();
    let local = SocketAddr::new(test_ip(), ports::WIRE_DATAGRAM_LOCAL);
    let socket = RDatagram::bind(local).await.unwrap();
    // Node 2 joins and answers what reaches it through the group with `send_to(from)`: it has
    // never heard of us otherwise, so the answer arrives only if the group datagram named our
    // bound address, port included.
    let member = PeerJob::start(
        "mcast-echo",
        "ready",
        &[&peer_program(), "mcast-echo", &group.to_string()],
    )
    .await;
    guard("join", socket.join_multicast(group)).await.unwrap();
    let mut buf = [0u8; 256];
    let from = guard("multicast echo", async {
        loop {
            socket.send_to(b"to the group", (group, 0)).await.unwrap();
            let wait = tokio::time::timeout(
                std::time::Duration::from_secs(5),
                socket.recv_from(&mut buf),
            );
            if let Ok(r) = wait.await {
                let (n, from) = r.unwrap();
                // Our own datagram may come back to us through the group: skip it.
                if from.ip() == peer {
                    assert_eq!(&buf[..n], b"to the group");
                    break from;
                }
            }
        }
    })
    .await;
    assert_eq!(from.ip(), peer);
    assert_ne!(from.port(), 0, "the answer names node 2's bound port");
    let text = member.stop().await;
    assert!(
        text.contains(&format!("group datagram of 12 bytes from {local}\n")),
        "node 2 names the group datagram's sender with its port: {text}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_http1_and_http2_across_the_wire() {
    let Some(peer) = peer_ip() else { return };
    let addr = SocketAddr::new(peer, ports::WIRE_HTTP);
    let server = PeerJob::start(
        "http-server",
        "listening on",
        &[&example("http_server"), &addr.to_string()],
    )
    .await;
    for http2 in [false, true] {
        let client = http_client(http2);
        for i in 0..5 {
            let path = format!("/wire/{i}");
            guard("request", check_greeting_get(&client, addr, &path, http2)).await;
        }
    }
    server.stop().await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_unary_and_streaming_across_the_wire() {
    let Some(peer) = peer_ip() else { return };
    let addr = SocketAddr::new(peer, ports::WIRE_GRPC);
    let server = PeerJob::start(
        "greeter",
        "greeter listening",
        &[&example("greeter_server"), &addr.to_string()],
    )
    .await;
    let channel = tonic_channel(addr).await;
    let mut client = GreeterClient::new(channel);
    let reply = guard(
        "unary",
        client.say_hello(HelloRequest {
            name: "wire".into(),
            ..Default::default()
        }),
    )
    .await
    .unwrap();
    assert_eq!(reply.into_inner().message, "Hello wire!");
    // Server streaming.
    let mut replies = guard(
        "server stream",
        client.say_hello_stream(HelloRequest {
            name: "wire".into(),
            count: 200,
            ..Default::default()
        }),
    )
    .await
    .unwrap()
    .into_inner();
    let mut n = 0;
    while let Some(r) = guard("stream item", replies.next()).await {
        let r = r.unwrap();
        assert_eq!(r.index, n);
        assert_eq!(r.message, format!("Hello wire, #{n}"));
        n += 1;
    }
    assert_eq!(n, 200);
    // Bidirectional streaming with payloads.
    let requests = tokio_stream::iter(0..100u32).map(|i| HelloRequest {
        name: format!("m{i}"),
        payload: pattern(u64::from(i), 1000 + i as usize),
        ..Default::default()
    });
    let mut replies = guard("chat", client.chat(requests))
        .await
        .unwrap()
        .into_inner();
    let mut n = 0u32;
    while let Some(r) = guard("chat item", replies.next()).await {
        let r = r.unwrap();
        assert_eq!(r.message, format!("Hello m{n}!"));
        assert_eq!(r.payload, pattern(u64::from(n), 1000 + n as usize));
        n += 1;
    }
    assert_eq!(n, 100);
    let text = server.stop().await;
    assert!(
        text.contains(&format!("greeting wire from Some({}:", test_ip())),
        "{text}"
    );
}

// ---- librdmacm's C tools on the other node ---------------------------------------------------

const RSTREAM_RUN: [(usize, usize, usize); 2] = [(64, 100, 4), (65_536, 20, 2)];

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_rstream_client_with_c_rstream_server_across_the_wire() {
    let Some(peer) = peer_ip() else { return };
    for (i, (size, xfers, iters)) in RSTREAM_RUN.into_iter().enumerate() {
        let port = ports::WIRE_C_RSTREAM + i as u16;
        let mut args = c_rstream_verify_args(size, xfers, iters);
        args.extend(["-b".into(), peer.to_string(), "-p".into(), port.to_string()]);
        let mut argv: Vec<&str> = vec!["rstream"];
        argv.extend(args.iter().map(String::as_str));
        let server = PeerJob::start("c-rstream-server", "", &argv).await;
        let addr = SocketAddr::new(peer, port);
        let mut stream = connect_retrying(|| RStream::connect(addr)).await;
        guard(
            "exchange with C rstream on node 2",
            rstream_exchange(&mut stream, true, size, xfers, iters),
        )
        .await;
        drop(stream);
        let (ok, text) = server.wait().await;
        assert!(
            ok && text.contains("Gb/sec"),
            "C rstream on node 2:\n{text}"
        );
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_rstream_client_across_the_wire_with_our_server() {
    let Some(_peer) = peer_ip() else { return };
    for (size, xfers, iters) in RSTREAM_RUN {
        let listener = RListener::bind(SocketAddr::new(test_ip(), 0))
            .await
            .unwrap();
        let addr = listener.local_addr().unwrap();
        let mut args = c_rstream_verify_args(size, xfers, iters);
        args.extend([
            "-s".into(),
            addr.ip().to_string(),
            "-p".into(),
            addr.port().to_string(),
        ]);
        let mut argv: Vec<&str> = vec!["rstream"];
        argv.extend(args.iter().map(String::as_str));
        let client = PeerJob::start("c-rstream-client", "", &argv).await;
        let (mut stream, from) = guard("accept C rstream", listener.accept()).await.unwrap();
        assert_eq!(from.ip(), _peer);
        serve_c_rstream_client(&mut stream, size, xfers, iters).await;
        drop(stream);
        let (ok, text) = client.wait().await;
        assert!(
            ok && text.contains("Gb/sec"),
            "C rstream on node 2:\n{text}"
        );
    }
}

#[path = "../../../examples/rping.rs"]
#[allow(dead_code)]
mod rping_example;

const PINGS: usize = 10;
const PING_SIZE: usize = 100;

fn rping_args(line: &str) -> rping_example::Args {
    match rping_example::parse_args(line.split_whitespace()) {
        Ok(rping_example::Command::Run(args)) => args,
        other => panic!("rping flags {line:?}: {other:?}"),
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_rping_client_across_the_wire_with_our_server() {
    let Some(_peer) = peer_ip() else { return };
    let listener = rdma_async_device_tests::listener().await;
    let addr = listener.local_addr().unwrap();
    let server_args = rping_args(&format!("-s -V -S {PING_SIZE}"));
    let server =
        tokio::spawn(async move { rping_example::serve_listener(&server_args, listener).await });
    let (ok, text) = on_peer(&[
        "rping",
        "-c",
        "-vV",
        "-a",
        &addr.ip().to_string(),
        "-p",
        &addr.port().to_string(),
        "-C",
        &PINGS.to_string(),
        "-S",
        &PING_SIZE.to_string(),
    ])
    .await;
    assert!(ok, "C rping on node 2:\n{text}");
    let pings: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("ping data: "))
        .collect();
    assert_eq!(pings.len(), PINGS, "{text}");
    assert!(pings[0].starts_with("rdma-ping-0: ABCDEFG"), "{text}");
    assert!(pings.iter().all(|p| p.len() == PING_SIZE - 1), "{text}");
    guard("our rping server", server)
        .await
        .unwrap()
        .expect("our rping server");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_rping_client_with_c_rping_server_across_the_wire() {
    let Some(peer) = peer_ip() else { return };
    let server = PeerJob::start(
        "c-rping-server",
        "",
        &[
            "rping",
            "-s",
            "-v",
            "-S",
            &PING_SIZE.to_string(),
            "-a",
            &peer.to_string(),
            "-p",
            &ports::WIRE_C_RPING.to_string(),
        ],
    )
    .await;
    let port = ports::WIRE_C_RPING;
    let client_args = rping_args(&format!(
        "-c -V -a {peer} -p {port} -C {PINGS} -S {PING_SIZE}"
    ));
    let mut result = Err(io::Error::other("not started"));
    for _ in 0..100 {
        result = guard("our rping client", rping_example::run_client(&client_args)).await;
        match &result {
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tokio::task::yield_now().await
            }
            _ => break,
        }
    }
    result.expect("our rping client (validating every echo)");
    let (ok, text) = server.wait().await;
    assert!(ok, "C rping server on node 2:\n{text}");
    let pings: Vec<&str> = text
        .lines()
        .filter_map(|l| l.strip_prefix("server ping data: "))
        .collect();
    assert_eq!(pings.len(), PINGS, "{text}");
    assert!(pings[0].starts_with("rdma-ping-0: ABCDEFG"), "{text}");
}
