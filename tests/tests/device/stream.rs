//! `RStream` / `RListener` on a real RDMA device, with each other and with C rsockets.

use std::io;

use rdma_async::stream::hooks;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::pairs::stream_pair_on;
use rdma_async_device_tests::ports;
use rdma_async_device_tests::rstream_peer::{
    Counter, c_rstream_verify_args, recv, rstream_exchange, send, serve_c_rstream_client,
};
use rdma_async_device_tests::tools::finish_tool_printing;
use rdma_async_device_tests::{
    argv, connect_when_listening, guard, rlistener, rlistener_with, spawn_tool, stream_pair,
    test_addr, test_ip,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Vectored writes of pieces of odd sizes through 8 KiB rings: the chunks cut across the
/// pieces (a call's buffers are one run of bytes) and across the rings' ends, and every byte
/// arrives in order.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_writes_cut_across_pieces_and_ring_ends_in_order() {
    let options = RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192);
    let (mut reader, mut writer) = stream_pair(options).await;
    let data = pattern(17, 300_000);
    let pieces = [1usize, 63, 2, 700, 13, 3000, 64, 5000, 9];
    let writing = async {
        let mut rest = &data[..];
        let mut calls = 0u32;
        while !rest.is_empty() {
            // The next pieces of the pattern, in `pieces`' sizes, turn by turn.
            let mut slices = Vec::new();
            let mut at = 0;
            for &len in pieces
                .iter()
                .cycle()
                .skip(calls as usize % pieces.len())
                .take(4)
            {
                let len = len.min(rest.len() - at);
                slices.push(io::IoSlice::new(&rest[at..at + len]));
                at += len;
            }
            let n = writer.write_vectored(&slices).await?;
            assert!(n > 0 && n <= at, "wrote {n} of {at} bytes offered");
            rest = &rest[n..];
            calls += 1;
        }
        writer.shutdown().await?;
        io::Result::Ok(calls)
    };
    let reading = async {
        let mut got = Vec::with_capacity(data.len());
        reader.read_to_end(&mut got).await?;
        io::Result::Ok(got)
    };
    let (calls, got) = guard("vectored writes", async { tokio::join!(writing, reading) }).await;
    let calls = calls.unwrap();
    let got = got.unwrap();
    assert_eq!(
        got.len(),
        data.len(),
        "bytes received ({calls} write calls)"
    );
    assert!(got == data, "the bytes arrived changed or out of order");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_of_many_sizes_wraps_the_rings() {
    // Small rings: every large message wraps both rings many times.
    let options = RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192);
    let listener = rlistener_with(options.clone()).await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buf = vec![0u8; 65536];
        loop {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            stream.write_all(&buf[..n]).await?;
        }
        stream.shutdown().await?;
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect_with(addr, &options))
        .await
        .unwrap();
    assert_eq!(client.peer_addr().unwrap(), addr);
    let (mut rd, mut wr) = tokio::io::split(&mut client);
    let sizes = [
        1usize,
        7,
        64,
        65,
        2047,
        2048,
        4096,
        8191,
        8192,
        8193,
        65536,
        100_000,
        1 << 20,
        4 << 20,
    ];
    let all: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(i as u64, n))
        .collect();
    let expected: Vec<u8> = all.concat();
    let writer = async {
        for msg in &all {
            wr.write_all(msg).await?;
        }
        wr.shutdown().await
    };
    let reader = async {
        let mut got = Vec::with_capacity(expected.len());
        rd.read_to_end(&mut got).await?;
        io::Result::Ok(got)
    };
    let (w, r) = guard("echo", async { tokio::join!(writer, reader) }).await;
    w.unwrap();
    let got = r.unwrap();
    assert_eq!(got.len(), expected.len(), "bytes echoed");
    assert!(got == expected, "echoed bytes differ from what was sent");
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_close_both_ways() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut request = Vec::new();
        stream.read_to_end(&mut request).await?; // the client shut down writing
        assert_eq!(request, b"request, then EOF");
        stream.write_all(b"reply after the peer's EOF").await?;
        stream.shutdown().await?;
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect(addr)).await.unwrap();
    client.write_all(b"request, then EOF").await.unwrap();
    client.shutdown().await.unwrap();
    let mut reply = Vec::new();
    guard("reply", client.read_to_end(&mut reply))
        .await
        .unwrap();
    assert_eq!(reply, b"reply after the peer's EOF");
    guard("server", server).await.unwrap().unwrap();
    let err = client
        .write_all(b"x")
        .await
        .expect_err("writing after shutdown fails");
    assert_eq!(err.kind(), io::ErrorKind::BrokenPipe, "{err}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_peer_reads_as_eof_after_its_data() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        stream.write_all(&pattern(9, 300_000)).await?;
        drop(stream); // DISCONNECT after the data, like close(2)
        io::Result::Ok(())
    });
    let mut client = guard("connect", RStream::connect(addr)).await.unwrap();
    let mut got = Vec::new();
    guard("read to EOF", client.read_to_end(&mut got))
        .await
        .unwrap();
    assert!(got == pattern(9, 300_000), "got {} bytes", got.len());
    guard("server", server).await.unwrap().unwrap();
}

// ---- interop with librdmacm's C rstream ------------------------------------------------------

/// Runs C rstream with `-T b -T v` (blocking, verified data), `-S size -C xfers -I iters`, then
/// `extra`, then `end` (where it listens or connects).
fn c_rstream(
    size: usize,
    xfers: usize,
    iters: usize,
    extra: &[&str],
    end: &[String],
) -> tokio::process::Child {
    let mut args = c_rstream_verify_args(size, xfers, iters);
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend_from_slice(end);
    spawn_tool("rstream", &args)
}

/// Waits for C rstream to exit successfully after printing its result line.
async fn finish(child: tokio::process::Child) {
    finish_tool_printing(child, "rstream", &["Gb/sec"]).await;
}

#[rdma_async::test]
async fn our_client_with_c_rstream_server() {
    let first = ports::C_RSTREAM_SERVERS;
    for (port, size, xfers, iters, extra) in [
        (first, 64usize, 100usize, 10usize, &[][..]),
        (first + 1, 65536, 20, 5, &[][..]),
        (first + 2, 4096, 50, 4, &["-B", "4096"][..]),
        (first + 4, 1 << 20, 4, 2, &[][..]),
        // Non-blocking C side (busy-polling MSG_DONTWAIT calls; the last of -T b/n wins).
        (first + 5, 4096, 100, 2, &["-T", "n"][..]),
    ] {
        let child = c_rstream(
            size,
            xfers,
            iters,
            extra,
            &argv!["-b", test_ip(), "-p", port],
        );
        let addr = test_addr(port);
        let mut stream = connect_when_listening(|| RStream::connect(addr)).await;
        guard(
            "exchange with C rstream",
            rstream_exchange(&mut stream, true, size, xfers, iters),
        )
        .await;
        drop(stream);
        finish(child).await;
    }
}

#[rdma_async::test]
async fn c_rstream_client_with_our_server() {
    for (size, xfers, iters, extra) in [
        (64usize, 100usize, 10usize, &[][..]),
        (65536, 20, 5, &[][..]),
        (4096, 50, 4, &["-B", "4096"][..]),
        (1 << 20, 4, 2, &[][..]),
        (4096, 100, 2, &["-T", "n"][..]),
    ] {
        let listener = rlistener().await;
        let addr = listener.local_addr().unwrap();
        let end = argv!["-s", addr.ip(), "-p", addr.port()];
        let child = c_rstream(size, xfers, iters, extra, &end);
        let (mut stream, _) = guard("accept from C rstream", listener.accept())
            .await
            .unwrap();
        serve_c_rstream_client(&mut stream, size, xfers, iters).await;
        drop(stream);
        finish(child).await;
    }
}

// ---- robustness ----------------------------------------------------------------------------

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_connection_data_is_rejected_and_the_listener_goes_on() {
    use rdma_async::cm::ConnParams;
    use rdma_async::endpoint::{Endpoint, EndpointOptions};

    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let mut buf = [0u8; 5];
        stream.read_exact(&mut buf).await?;
        io::Result::Ok(buf)
    });
    // A wrong version, then too little data: both refused, not fatal to the listener.
    let mut wrong_version = [0u8; 40];
    wrong_version[0] = 2;
    for (what, data) in [
        ("version 2", wrong_version.to_vec()),
        ("no data", Vec::new()),
    ] {
        let opts = EndpointOptions::new().conn_params(ConnParams::new().private_data(data));
        let err = guard("bad connect", Endpoint::connect_with(addr, &opts))
            .await
            .expect_err(what);
        assert_eq!(
            err.kind(),
            io::ErrorKind::ConnectionRefused,
            "{what}: {err}"
        );
    }
    let mut good = guard("good connect", RStream::connect(addr)).await.unwrap();
    good.write_all(b"hello").await.unwrap();
    assert_eq!(&guard("server", server).await.unwrap().unwrap(), b"hello");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_concurrent_connections_each_moving_data() {
    const N: usize = 50;
    const BYTES: usize = 64 * 1024;
    // Small rings and queues keep 50 connections within the guest's memory.
    let options = RStreamOptions::new()
        .send_buffer_size(16384)
        .recv_buffer_size(16384)
        .sq_size(32)
        .rq_size(32);
    let listener = rlistener_with(options.clone()).await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut sessions = tokio::task::JoinSet::new();
        for _ in 0..N {
            let (mut stream, _) = listener.accept().await?;
            sessions.spawn(async move {
                let mut data = Vec::new();
                stream.read_to_end(&mut data).await?;
                stream.write_all(&data).await?;
                stream.shutdown().await
            });
        }
        while let Some(done) = sessions.join_next().await {
            done.expect("session task")?;
        }
        io::Result::Ok(())
    });
    let mut clients = tokio::task::JoinSet::new();
    for i in 0..N {
        let options = options.clone();
        clients.spawn(async move {
            let mut stream = RStream::connect_with(addr, &options).await?;
            let data = pattern(i as u64, BYTES);
            stream.write_all(&data).await?;
            stream.shutdown().await?;
            let mut back = Vec::new();
            stream.read_to_end(&mut back).await?;
            assert!(
                back == data,
                "connection {i} echoed {} bytes, not its own data",
                back.len()
            );
            io::Result::Ok(())
        });
    }
    while let Some(done) = guard("clients", clients.join_next()).await {
        done.expect("client task").unwrap();
    }
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_read_and_write_futures_lose_nothing() {
    use std::time::Duration;

    const TOTAL: usize = 2 << 20;
    let options = RStreamOptions::new()
        .send_buffer_size(16384)
        .recv_buffer_size(16384);
    let listener = rlistener_with(options.clone()).await;
    let addr = listener.local_addr().unwrap();
    let data = pattern(42, TOTAL);
    let expected = data.clone();
    // The server writes with futures that are cut off at random points and retried, once the
    // client has dropped a read that was certainly pending (nothing was written yet).
    let (start_tx, start_rx) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(async move {
        let (mut stream, _) = listener.accept().await?;
        let _ = start_rx.await;
        let (mut sent, mut round) = (0usize, 0u64);
        while sent < TOTAL {
            round += 1;
            let cut = Duration::from_micros(round * 7919 % 3000);
            let end = (sent + 1 + (round as usize * 104_729) % 200_000).min(TOTAL);
            if let Ok(n) = tokio::time::timeout(cut, stream.write(&data[sent..end])).await {
                sent += n?;
            }
        }
        stream.shutdown().await?;
        io::Result::Ok(round)
    });
    let mut stream = guard("connect", RStream::connect_with(addr, &options))
        .await
        .unwrap();
    let (mut got, mut round, mut cuts) = (Vec::with_capacity(TOTAL), 0u64, 0u64);
    let mut buf = vec![0u8; 100_000];
    // A zero timeout polls the read once and drops it: pending, since the server waits.
    let first = tokio::time::timeout(Duration::ZERO, stream.read(&mut buf)).await;
    assert!(
        first.is_err(),
        "a read before any write must be pending: {first:?}"
    );
    cuts += 1;
    start_tx.send(()).unwrap();
    loop {
        round += 1;
        let cut = Duration::from_micros(round * 6007 % 3000);
        let want = 1 + (round as usize * 3_571) % buf.len();
        match tokio::time::timeout(cut, stream.read(&mut buf[..want])).await {
            Ok(Ok(0)) => break,
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Ok(Err(e)) => panic!("read failed: {e}"),
            Err(_) => cuts += 1,
        }
        assert!(round < 1_000_000, "the transfer made no progress");
    }
    let server_rounds = guard("server", server).await.unwrap().unwrap();
    assert_eq!(got.len(), expected.len(), "bytes received");
    assert!(
        got == expected,
        "received bytes differ: lost, duplicated or misplaced data"
    );
    assert!(
        cuts > 0,
        "some read futures were dropped while pending ({round} rounds)"
    );
    assert!(server_rounds > 1, "the writer was cut off and retried");
}

#[rdma_async::test]
async fn killed_peer_ends_reads_and_writes_without_hanging() {
    // A C rstream server in a long run; we kill it mid-transfer.
    let port = ports::C_RSTREAM_SERVERS + 3;
    let mut child = c_rstream(65536, 1000, 1000, &[], &argv!["-b", test_ip(), "-p", port]);
    let addr = test_addr(port);
    let mut stream = connect_when_listening(|| RStream::connect(addr)).await;
    let (mut tx, mut rx) = (Counter::default(), Counter::default());
    let mut buf = vec![0u8; 65536];
    send(&mut stream, &mut tx, &mut buf[..16]).await;
    recv(&mut stream, &mut rx, &mut buf[..16]).await;
    send(&mut stream, &mut tx, &mut buf).await; // the transfer is under way
    child.start_kill().expect("kill C rstream");
    child.wait().await.expect("reap C rstream");
    // Reads end with an error, never a clean EOF (the peer never closed); writes then fail.
    // Neither may hang.
    let read = guard("read after the peer died", async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(_) => continue,
                Err(e) => return Err(e),
            }
        }
    })
    .await;
    let e = read.expect_err("a killed peer read as a clean end-of-stream");
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::TimedOut
        ),
        "{e}"
    );
    let write_err = guard("write after the peer died", async {
        loop {
            if let Err(e) = stream.write_all(&buf).await {
                return e;
            }
        }
    })
    .await;
    assert!(
        matches!(
            write_err.kind(),
            io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset | io::ErrorKind::TimedOut
        ),
        "{write_err}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_violating_immediates_end_the_connection_with_an_error() {
    // RS_OP_CTRL (op 7) with an unknown code; RS_OP_DATA claiming bytes that never arrived.
    for (what, imm) in [
        ("unknown control code", (7u32 << 29) | 99),
        ("data that did not land", 4096u32),
    ] {
        let (bad_peer, mut victim) = stream_pair(RStreamOptions::new()).await;
        hooks::send_raw_immediate(&bad_peer, imm).unwrap();
        let mut buf = [0u8; 64];
        let err = guard(
            "read from a peer that broke the protocol",
            victim.read(&mut buf),
        )
        .await
        .expect_err(what);
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{what}: {err}");
        let err = victim
            .write_all(b"after")
            .await
            .expect_err("writes fail too");
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::InvalidData | io::ErrorKind::BrokenPipe
            ),
            "{what}: {err}"
        );
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn keepalives_go_out_and_the_peer_ignores_them() {
    use std::time::Duration;

    let options = RStreamOptions::new().keepalive(Duration::from_millis(20));
    let (mut server, mut client) = stream_pair_on(&rlistener().await, &options).await;
    let before = client.stats().control_writes;
    // Wait for the keepalives themselves (bounded by the guard), not for a fixed time.
    guard("keepalives", async {
        while client.stats().control_writes < before + 3 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The peer never sees them: data still flows both ways.
    client.write_all(b"after keepalives").await.unwrap();
    let mut buf = [0u8; 16];
    guard("read", server.read_exact(&mut buf)).await.unwrap();
    assert_eq!(&buf, b"after keepalives");
    server.write_all(b"ok").await.unwrap();
    let mut ok = [0u8; 2];
    guard("read back", client.read_exact(&mut ok))
        .await
        .unwrap();
    assert_eq!(&ok, b"ok");
}
