//! Integrity across a bad wire: `tc netem` on both nodes' NICs drops, reorders, duplicates or
//! corrupts RDMA packets (one impairment at a time, then all together) while an `RStream` echo
//! and `RdmaConnection` writes and reads run; every byte arrives once, in order, intact (both
//! ends hash it) and nothing hangs; hyper (HTTP/1.1 and HTTP/2) and tonic (unary, server and
//! bidirectional streaming) keep working on the impaired wire too. Soft-RoCE recovers from loss slowly under emulation, so
//! the volumes are small. The connections are set up on a clean wire; only the transfers run
//! on the impaired one. One test at a time (`scripts/wire-tests` runs this module with one
//! thread, and a lock keeps the wire to one test anyway).

use std::net::SocketAddr;

use rdma_async::stream::RStream;
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::guard_within;
use rdma_async_device_tests::tools::example;
use rdma_async_device_tests::wire::{
    Fnv, IMPAIRED, Netem, PeerJob, WIRE, check_greeting_get, connect_retrying, http_client,
    log_warnings, peer_ip, peer_program, rdma_client, rdma_write_read_check, tonic_channel,
    transport_counters, try_echo_through,
};
use tokio_stream::StreamExt;

use rdma_async_device_tests::greeter::HelloRequest;
use rdma_async_device_tests::greeter::greeter_client::GreeterClient;
use rdma_async_device_tests::ports;

const STREAM_BYTES: usize = 256 << 10;
const RDMA_BYTES: usize = 256 << 10;

/// Sets up an RStream echo and an RdmaConnection with node 2, impairs the wire with `spec`,
/// moves the data, and checks it on both ends.
async fn across_impaired_wire(spec: &str, port: u16, seed: u64) {
    let Some(peer) = peer_ip() else { return };
    log_warnings();
    let _wire = WIRE.lock().await;
    let echo = PeerJob::start(
        "netem-echo",
        "ready",
        &[&peer_program(), "stream-echo", &port.to_string()],
    )
    .await;
    let rdma = PeerJob::start(
        "netem-rdma",
        "ready",
        &[
            &peer_program(),
            "rdma",
            &(port + 1).to_string(),
            &RDMA_BYTES.to_string(),
        ],
    )
    .await;
    let addr = SocketAddr::new(peer, port);
    let mut stream = connect_retrying(|| RStream::connect(addr)).await;
    let (conn, remote) = rdma_client(SocketAddr::new(peer, port + 1)).await;

    let netem = Netem::both(spec).await;
    let data = pattern(seed, STREAM_BYTES);
    let echoed = guard_within(
        IMPAIRED,
        &format!("RStream echo under netem {spec}"),
        try_echo_through(&mut stream, &data, 16 << 10),
    )
    .await;
    if let Err(e) = echoed {
        drop(netem);
        drop(stream);
        panic!(
            "RStream echo under netem {spec}: {e}; node 2 logged:\n{}\ntransport counters:\n{}",
            echo.stop().await,
            transport_counters().await
        );
    }
    let block = pattern(seed + 1, RDMA_BYTES);
    guard_within(
        IMPAIRED,
        &format!("RDMA writes and read under netem {spec}"),
        rdma_write_read_check(&conn, &remote, &block, 16 << 10),
    )
    .await;
    drop(netem);

    drop(stream);
    drop(conn);
    let text = echo.stop().await;
    let line = format!("{} bytes, fnv {:016x}, Ok(())", data.len(), Fnv::of(&data));
    assert!(text.contains(&line), "node 2 did not log {line:?}:\n{text}");
    rdma.stop().await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss() {
    across_impaired_wire("loss 1%", ports::WIRE_NETEM, 1).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordering() {
    // 10 %, not 25 %: Soft-RoCE counts each out-of-sequence NAK against the transport retry
    // count until a whole 64 KiB write is acknowledged, and at 25 % it ran out once in CI
    // ("transport retry counter exceeded"): the emulator's limit, not the stream's.
    across_impaired_wire("delay 2ms reorder 10% 50%", ports::WIRE_NETEM + 2, 2).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplication() {
    across_impaired_wire("duplicate 5%", ports::WIRE_NETEM + 4, 3).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn corruption() {
    across_impaired_wire("corrupt 1%", ports::WIRE_NETEM + 6, 4).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn loss_reordering_duplication_and_corruption_together() {
    across_impaired_wire(
        "delay 2ms reorder 10% 50% loss 0.5% duplicate 2% corrupt 0.5%",
        ports::WIRE_NETEM + 8,
        5,
    )
    .await;
}

fn hello(name: String) -> HelloRequest {
    HelloRequest {
        name,
        ..Default::default()
    }
}

/// The combined impairment of the last test, for the HTTP and gRPC stacks.
const COMBINED: &str = "delay 2ms reorder 10% 50% loss 0.5% duplicate 2% corrupt 0.5%";

/// hyper over `RStream` on an impaired wire: connections opened on the clean wire carry
/// HTTP/1.1 and HTTP/2 requests while packets are lost, reordered, duplicated and corrupted;
/// every response is the right one, on the right protocol version.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_http1_and_http2_under_loss_reordering_duplication_and_corruption() {
    let Some(peer) = peer_ip() else { return };
    let _wire = WIRE.lock().await;
    let addr = SocketAddr::new(peer, ports::WIRE_NETEM_HTTP);
    let server = PeerJob::start(
        "netem-http",
        "listening on",
        &[&example("http_server"), &addr.to_string()],
    )
    .await;
    let clients = [false, true].map(http_client);
    // Open (and prove) each client's connection on the clean wire (the server is listening:
    // PeerJob::start waited for it to say so).
    for (client, http2) in clients.iter().zip([false, true]) {
        guard_within(
            IMPAIRED,
            "a request on the clean wire",
            check_greeting_get(client, addr, "/clean", http2),
        )
        .await;
    }
    let netem = Netem::both(COMBINED).await;
    guard_within(
        IMPAIRED,
        &format!("HTTP requests under netem {COMBINED}"),
        async {
            for i in 0..20 {
                for (client, http2) in clients.iter().zip([false, true]) {
                    check_greeting_get(client, addr, &format!("/impaired/{i}/{http2}"), http2)
                        .await;
                }
            }
        },
    )
    .await;
    drop(netem);
    drop(clients);
    server.stop().await;
}

/// tonic over `RStream` on an impaired wire: unary calls, a server stream and a bidirectional
/// stream carrying 256 KiB of payload; every reply arrives once, in order, intact.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_unary_and_streaming_under_loss_reordering_duplication_and_corruption() {
    let Some(peer) = peer_ip() else { return };
    let _wire = WIRE.lock().await;
    let addr = SocketAddr::new(peer, ports::WIRE_NETEM_GRPC);
    let server = PeerJob::start(
        "netem-greeter",
        "greeter listening",
        &[&example("greeter_server"), &addr.to_string()],
    )
    .await;
    let channel = tonic_channel(addr).await;
    let mut client = GreeterClient::new(channel);
    // The connection is proven on the clean wire first.
    let reply = client.say_hello(hello("clean".into())).await.unwrap();
    assert_eq!(reply.into_inner().message, "Hello clean!");

    let netem = Netem::both(COMBINED).await;
    guard_within(
        IMPAIRED,
        &format!("gRPC calls under netem {COMBINED}"),
        async {
            for i in 0..10 {
                let reply = client.say_hello(hello(format!("u{i}"))).await.unwrap();
                assert_eq!(reply.into_inner().message, format!("Hello u{i}!"));
            }
            let mut replies = client
                .say_hello_stream(HelloRequest {
                    count: 100,
                    ..hello("impaired".into())
                })
                .await
                .unwrap()
                .into_inner();
            let mut n = 0;
            while let Some(r) = replies.next().await {
                let r = r.unwrap();
                assert_eq!((r.index, r.message), (n, format!("Hello impaired, #{n}")));
                n += 1;
            }
            assert_eq!(n, 100);
            let requests = tokio_stream::iter(0..64u32).map(|i| HelloRequest {
                payload: pattern(u64::from(i) + 100, 4096),
                ..hello(format!("m{i}"))
            });
            let mut replies = client.chat(requests).await.unwrap().into_inner();
            let mut n = 0u32;
            while let Some(r) = replies.next().await {
                let r = r.unwrap();
                assert_eq!(r.message, format!("Hello m{n}!"));
                assert!(
                    r.payload == pattern(u64::from(n) + 100, 4096),
                    "chat payload {n} came back altered"
                );
                n += 1;
            }
            assert_eq!(n, 64);
        },
    )
    .await;
    drop(netem);
    drop(client);
    server.stop().await;
}
