//! The node-2 side of the wire tests (`tests/tests/wire/`), started there through
//! `scripts/on-peer`. Each role serves until it is killed and prints `ready` once it listens.
//!
//! ```text
//! wire-peer stream-echo PORT      RStream echo: every connection's bytes back, then shutdown
//! wire-peer endpoint-echo PORT    Endpoint: every message back
//! wire-peer rdma PORT LEN         RdmaConnection: a LEN-byte region (read/write/atomic) that
//!                                 it advertises, then per message: "hash" -> FNV of the region,
//!                                 anything else echoed
//! wire-peer dgram-echo PORT       RDatagram: every datagram back to its sender
//! wire-peer mcast-echo GROUP      joins GROUP; every group datagram back to its sender by
//!                                 unicast, `send_to(from)` (a group datagram names its sender)
//! wire-peer park ADDR PARKED OPEN
//!                                 clients of the RStream listener at ADDR: OPEN connections
//!                                 that echo once and stay open, then PARKED connection
//!                                 requests that never complete their handshake; prints `ready`
//!                                 and holds them all until killed
//! wire-peer write-close ADDR BYTES SEED HOW
//!                                 connects to the RStream listener at ADDR, writes BYTES of
//!                                 `pattern(SEED)` with `write_all`, prints `written`, and then
//!                                 goes away as HOW says: `return-multi` / `return-current`
//!                                 (returns from a `#[tokio::main]`-like main of that flavor,
//!                                 dropping the stream and then the runtime), `no-runtime`
//!                                 (drops the runtime, then the stream outside any), `exit`
//!                                 (`process::exit` with the stream open), `kill` (sends
//!                                 itself SIGKILL)
//! wire-peer soak PORT BYTES SEED PEER_SEED
//!                                 the far end of the stream soak (rdma_async_device_tests::soak): one
//!                                 connection, BYTES each way; prints what it sent and received,
//!                                 its RSS, and its RDMA resource counts once all is dropped
//!                                 (which must be zero, and RSS grow less than 64 MiB), then exits
//! ```

use std::io;
use std::net::{IpAddr, SocketAddr};

use rdma_async::cm::{CmListener, ParkedConnect};
use rdma_async::datagram::RDatagram;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteAccess};
use rdma_async::stream::hooks;
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::leaks::{LEAK_KINDS, leak_counts, settled_counts};
use rdma_async_device_tests::soak::{rss_kib, soak_stream};
use rdma_async_device_tests::test_ip;
use rdma_async_device_tests::wire::Fnv;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn arg(args: &[String], i: usize) -> &str {
    args.get(i).map(String::as_str).unwrap_or_else(|| {
        eprintln!("usage: wire-peer ROLE ARGS (see the source)");
        std::process::exit(2)
    })
}

fn runtime(multi_thread: bool) -> tokio::runtime::Runtime {
    let mut builder = if multi_thread {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(2);
        builder
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().expect("a Tokio runtime")
}

fn main() -> io::Result<()> {
    // Warnings (a failed send, a protocol violation) go into the job's log, which a failed
    // test prints.
    tracing_subscriber::fmt()
        .with_writer(io::stderr)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let args: Vec<String> = std::env::args().collect();
    if arg(&args, 1) == "write-close" {
        return write_close(
            arg(&args, 2).parse().expect("ADDR"),
            arg(&args, 3).parse().expect("BYTES"),
            arg(&args, 4).parse().expect("SEED"),
            arg(&args, 5),
        );
    }
    runtime(true).block_on(serve(&args))
}

/// How often `write-close` tries to connect across the impaired wire.
const CONNECT_ATTEMPTS: u32 = 5;

/// How long `write-close`'s dropped stream waits for the reader to acknowledge its bytes. The
/// default 10 s is short for Soft-RoCE under emulation on a lossy wire: there the last ring of
/// a transfer can take longer than that to be retransmitted, and the test is about the close
/// waiting, not about how fast the emulator recovers. (Still a bound, below the reader's.)
const WRITE_CLOSE_LINGER: std::time::Duration = std::time::Duration::from_secs(120);

/// Writes `bytes` to `addr` and goes away as `how` says (see the module docs). The runtime is
/// built by hand: how it ends is what the test is about.
fn write_close(addr: SocketAddr, bytes: usize, seed: u64, how: &str) -> io::Result<()> {
    let data = pattern(seed, bytes);
    let rt = runtime(how != "return-current");
    let options = RStreamOptions::new().linger(WRITE_CLOSE_LINGER);
    let stream = rt.block_on(async {
        // The handshake crosses the lossy wire too and may fail (its messages run out of
        // retries); the test is about what follows it, so a failed connect is tried again.
        let mut attempt = 1;
        let mut stream = loop {
            match RStream::connect_with(addr, &options).await {
                Ok(stream) => break stream,
                Err(e) if attempt < CONNECT_ATTEMPTS => {
                    eprintln!("connect attempt {attempt} to {addr} failed: {e}");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        };
        eprintln!("connected to {addr}");
        stream.write_all(&data).await?;
        println!("written: {bytes} bytes");
        io::Result::Ok(stream)
    })?;
    match how {
        // What `#[tokio::main] async fn main` does at its end: the stream is dropped inside
        // the runtime (its close lingers in a task), then the runtime is dropped.
        "return-multi" | "return-current" => {
            rt.block_on(async move { drop(stream) });
            drop(rt);
        }
        "no-runtime" => {
            drop(rt);
            drop(stream);
        }
        "exit" => std::process::exit(0),
        "kill" => {
            let pid = std::process::id().to_string();
            let _ = std::process::Command::new("kill")
                .args(["-KILL", &pid])
                .status();
            loop {
                std::thread::park();
            }
        }
        other => {
            eprintln!("wire-peer write-close: unknown HOW {other}");
            std::process::exit(2)
        }
    }
    Ok(())
}

async fn serve(args: &[String]) -> io::Result<()> {
    let role = arg(args, 1).to_owned();
    match role.as_str() {
        "stream-echo" => stream_echo(port(arg(args, 2))).await,
        "endpoint-echo" => endpoint_echo(port(arg(args, 2))).await,
        "rdma" => rdma(port(arg(args, 2)), arg(args, 3).parse().expect("LEN")).await,
        "dgram-echo" => dgram_echo(port(arg(args, 2))).await,
        "park" => {
            park(
                arg(args, 2).parse().expect("ADDR"),
                arg(args, 3).parse().expect("PARKED"),
                arg(args, 4).parse().expect("OPEN"),
            )
            .await
        }
        "soak" => {
            soak(
                port(arg(args, 2)),
                arg(args, 3).parse().expect("BYTES"),
                arg(args, 4).parse().expect("SEED"),
                arg(args, 5).parse().expect("PEER_SEED"),
            )
            .await
        }
        "mcast-echo" => mcast_echo(arg(args, 2).parse().expect("GROUP")).await,
        other => {
            eprintln!("wire-peer: unknown role {other}");
            std::process::exit(2)
        }
    }
}

fn port(s: &str) -> u16 {
    s.parse().expect("PORT")
}

fn ready(what: impl std::fmt::Display) {
    println!("ready: {what}");
}

async fn stream_echo(port: u16) -> io::Result<()> {
    let listener = RListener::bind(SocketAddr::new(test_ip(), port)).await?;
    ready(listener.local_addr()?);
    loop {
        let (mut stream, peer) = listener.accept().await?;
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            let mut hash = Fnv::default();
            let mut total = 0u64;
            let result: io::Result<()> = async {
                loop {
                    let n = stream.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    hash.update(&buf[..n]);
                    total += n as u64;
                    stream.write_all(&buf[..n]).await?;
                }
                stream.shutdown().await
            }
            .await;
            println!(
                "stream from {peer}: {total} bytes, fnv {:016x}, {result:?}",
                hash.0
            );
        });
    }
}

async fn park(addr: SocketAddr, parked: usize, open: usize) -> io::Result<()> {
    let options = RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192);
    let mut streams = Vec::with_capacity(open);
    for _ in 0..open {
        let mut stream = RStream::connect_with(addr, &options).await?;
        stream.write_all(b"open").await?;
        let mut back = [0u8; 4];
        stream.read_exact(&mut back).await?;
        assert_eq!(&back, b"open");
        streams.push(stream);
    }
    let data = hooks::request_data(&options);
    let mut requests = Vec::with_capacity(parked);
    for _ in 0..parked {
        let request = ParkedConnect::resolve(addr).await?;
        request.send_request(&data)?;
        requests.push(request);
    }
    ready(format!("{open} open, {parked} parked"));
    std::future::pending::<io::Result<()>>().await
}

async fn endpoint_echo(port: u16) -> io::Result<()> {
    let listener = CmListener::bind(SocketAddr::new(test_ip(), port)).await?;
    ready(listener.local_addr().unwrap());
    loop {
        let request = listener.accept_request().await?;
        let ep = Endpoint::accept(request, &EndpointOptions::new()).await?;
        tokio::spawn(async move {
            let mut count = 0u64;
            let result: io::Result<()> = async {
                loop {
                    let msg = ep.recv().await?;
                    count += 1;
                    ep.send(&msg).await?;
                }
            }
            .await;
            println!(
                "endpoint from {}: {count} messages, {result:?}",
                ep.peer_addr().unwrap()
            );
        });
    }
}

async fn rdma(port: u16, len: usize) -> io::Result<()> {
    let listener = CmListener::bind(SocketAddr::new(test_ip(), port)).await?;
    ready(listener.local_addr().unwrap());
    loop {
        let request = listener.accept_request().await?;
        let conn = RdmaConnection::accept(request, &RdmaOptions::new()).await?;
        tokio::spawn(async move {
            let result = serve_rdma(&conn, len).await;
            println!("rdma from {}: {result:?}", conn.peer_addr().unwrap());
        });
    }
}

async fn serve_rdma(conn: &RdmaConnection, len: usize) -> io::Result<()> {
    let region = conn.reg_shared(
        len,
        RemoteAccess::READ | RemoteAccess::WRITE | RemoteAccess::ATOMIC,
    )?;
    let mut msg = conn.reg_msgs(16)?;
    msg.copy_from_slice(&region.remote().to_bytes());
    let (sent, _) = conn.send(msg, ..).await;
    sent?;
    let mut inbox = conn.reg_msgs(65536)?;
    loop {
        let (got, back) = conn.recv(inbox, ..).await;
        inbox = back;
        let n = got?.len();
        let mut reply = conn.reg_msgs(n.max(8))?;
        let reply_len = if &inbox[..n] == b"hash" {
            reply[..8].copy_from_slice(&Fnv::of(&region.to_vec()).to_le_bytes());
            8
        } else {
            reply[..n].copy_from_slice(&inbox[..n]);
            n
        };
        let (sent, _) = conn.send(reply, ..reply_len).await;
        sent?;
    }
}

async fn dgram_echo(port: u16) -> io::Result<()> {
    let socket = RDatagram::bind(SocketAddr::new(test_ip(), port)).await?;
    ready(socket.local_addr()?);
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = socket.recv_from(&mut buf).await?;
        socket.send_to(&buf[..n], from).await?;
    }
}

async fn mcast_echo(group: IpAddr) -> io::Result<()> {
    let socket = RDatagram::bind(SocketAddr::new(test_ip(), 0)).await?;
    socket.join_multicast(group).await?;
    ready(format!("joined {group}"));
    let mut buf = vec![0u8; 65536];
    loop {
        let (n, from) = socket.recv_from(&mut buf).await?;
        println!("group datagram of {n} bytes from {from}");
        socket.send_to(&buf[..n], from).await?;
    }
}

async fn soak(port: u16, bytes: u64, seed: u64, peer_seed: u64) -> io::Result<()> {
    let rss_before = rss_kib();
    let listener = RListener::bind(SocketAddr::new(test_ip(), port)).await?;
    ready(listener.local_addr()?);
    let (stream, peer) = listener.accept().await?;
    drop(listener);
    let (sent, received) = soak_stream(stream, bytes, seed, peer_seed, None).await?;
    println!("soak with {peer}: sent {sent}; received {received}");
    // Dropping the stream lingers in a task until the peer has everything: wait (bounded) for
    // the counts to reach zero.
    let none = vec![0; LEAK_KINDS.len()];
    let counts = tokio::time::timeout(std::time::Duration::from_secs(30), settled_counts(&none))
        .await
        .unwrap_or_else(|_| leak_counts());
    let rss_after = rss_kib();
    println!(
        "soak resources {LEAK_KINDS:?} {counts:?}; rss {rss_before} KiB before, {rss_after} KiB after"
    );
    if counts.iter().any(|&c| c != 0) {
        return Err(io::Error::other("RDMA resources left after the soak"));
    }
    if rss_after > rss_before + (64 << 10) {
        return Err(io::Error::other(
            "RSS grew by more than 64 MiB during the soak",
        ));
    }
    Ok(())
}
