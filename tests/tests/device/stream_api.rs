//! The `TcpStream`-like API of `RStream` on a real RDMA device: halves, peek, try_*, readiness,
//! the incoming stream and `poll_accept`, full-duplex streaming.

use std::future::poll_fn;
use std::io;

use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::data::cyclic;
use rdma_async_device_tests::{guard, poll_once, rlistener, stream_pair, test_addr6};
use tokio::io::{AsyncReadExt, AsyncWriteExt, Interest, ReadBuf};

#[test]
fn streams_and_halves_fit_in_any_task() {
    fn check<T: Send + Sync + Unpin + 'static>() {}
    check::<RStream>();
    check::<RListener>();
    check::<rdma_async::stream::OwnedReadHalf>();
    check::<rdma_async::stream::OwnedWriteHalf>();
    fn check_stream<T: Send + Unpin + 'static>() {}
    check_stream::<rdma_async::stream::Incoming>();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_duplex_streaming_both_ways_at_once() {
    const BYTES: usize = 8 << 20;
    let options = RStreamOptions::new()
        .send_buffer_size(32768)
        .recv_buffer_size(32768);
    let (a, b) = stream_pair(options).await;
    let run = |stream: RStream, seed: u8, peer_seed: u8| async move {
        let (mut rd, mut wr) = stream.into_split();
        let writer = tokio::spawn(async move {
            wr.write_all(&cyclic(seed, BYTES)).await?;
            wr.shutdown().await
        });
        let mut got = Vec::with_capacity(BYTES);
        rd.read_to_end(&mut got).await?;
        writer.await.expect("writer task")?;
        assert!(
            got == cyclic(peer_seed, BYTES),
            "received {} bytes, not the peer's data",
            got.len()
        );
        io::Result::Ok(())
    };
    let (x, y) = guard("full duplex", async {
        tokio::join!(run(a, 1, 2), run(b, 2, 1))
    })
    .await;
    x.unwrap();
    y.unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_owned_write_half_shuts_down_writing() {
    let (server, client) = stream_pair(RStreamOptions::new()).await;
    let (mut rd, wr) = client.into_split();
    let mut server = server;
    let server_task = tokio::spawn(async move {
        let mut got = Vec::new();
        server.read_to_end(&mut got).await?; // EOF once the write half is dropped
        server.write_all(b"still talking").await?;
        server.shutdown().await?;
        io::Result::Ok(got)
    });
    let mut wr = wr;
    wr.write_all(b"bye").await.unwrap();
    drop(wr);
    let mut reply = Vec::new();
    guard("reply", rd.read_to_end(&mut reply)).await.unwrap();
    assert_eq!(reply, b"still talking");
    assert_eq!(guard("server", server_task).await.unwrap().unwrap(), b"bye");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn halves_reunite_and_forget() {
    let (_server, client) = stream_pair(RStreamOptions::new()).await;
    let (rd, wr) = client.into_split();
    let (_, other) = stream_pair(RStreamOptions::new()).await;
    let (_, other_wr) = other.into_split();
    let err = rd
        .reunite(other_wr)
        .expect_err("halves of different streams");
    let (rd, other_wr) = (err.0, err.1);
    other_wr.forget();
    let stream = rd.reunite(wr).expect("halves of the same stream");
    assert!(stream.peer_addr().is_ok());
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_try_read_try_write_and_readiness() {
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    let mut buf = [0u8; 64];
    let err = client.try_read(&mut buf).expect_err("nothing to read yet");
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);

    guard("writable", server.writable()).await.unwrap();
    let n = server.try_write(b"peekaboo").unwrap();
    assert_eq!(n, 8);
    guard("readable", client.readable()).await.unwrap();
    let n = guard("peek", client.peek(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"peekaboo", "peek sees the data");
    let n = client.try_read(&mut buf).unwrap();
    assert_eq!(&buf[..n], b"peekaboo", "peek did not consume it");
    assert_eq!(
        client.try_read(&mut buf).unwrap_err().kind(),
        io::ErrorKind::WouldBlock
    );

    let (mut rd, mut wr) = client.split();
    wr.write_all(b"via halves").await.unwrap();
    let mut echo = [0u8; 10];
    server.read_exact(&mut echo).await.unwrap();
    server.write_all(&echo).await.unwrap();
    let mut back = [0u8; 10];
    guard("read half", rd.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"via halves");
    assert!(rd.peer_addr().is_ok() && wr.local_addr().is_ok());
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn incoming_yields_connections() {
    use std::pin::Pin;

    use futures_core::Stream;

    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let mut incoming = listener.into_incoming();
    let clients = tokio::spawn(async move {
        for i in 0..3u8 {
            let mut s = RStream::connect(addr).await?;
            s.write_all(&[i]).await?;
            s.shutdown().await?;
        }
        io::Result::Ok(())
    });
    let mut seen = Vec::new();
    for _ in 0..3 {
        let next = guard(
            "next connection",
            poll_fn(|cx| Pin::new(&mut incoming).poll_next(cx)),
        )
        .await;
        let mut stream = next.expect("the stream goes on").expect("a connection");
        let mut byte = Vec::new();
        stream.read_to_end(&mut byte).await.unwrap();
        seen.extend(byte);
    }
    seen.sort_unstable();
    assert_eq!(seen, vec![0, 1, 2]);
    guard("clients", clients).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_over_ipv6() {
    let listener = RListener::bind(test_addr6(0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    assert!(addr.is_ipv6());
    let server = tokio::spawn(async move {
        let (mut stream, peer) = listener.accept().await?;
        assert!(peer.is_ipv6());
        let mut buf = [0u8; 4];
        stream.read_exact(&mut buf).await?;
        stream.write_all(&buf).await?;
        io::Result::Ok(())
    });
    let mut client = guard("connect over IPv6", RStream::connect(addr))
        .await
        .unwrap();
    client.write_all(b"six!").await.unwrap();
    let mut back = [0u8; 4];
    guard("echo", client.read_exact(&mut back)).await.unwrap();
    assert_eq!(&back, b"six!");
    guard("server", server).await.unwrap().unwrap();
}

/// A reader that busy-polls holds the stream's lock while it spins. The writing half, on
/// another worker, must not wait out the reader's window: the reader stops spinning once the
/// writer wants the lock (it sleeps until its completion instead). With a one-second window,
/// every write that finds the reader spinning ends a window early, and the count shows it.
///
/// Whether a write finds the reader spinning is a race the writer may lose many times: its
/// writes may all come while the reader sleeps (before its first window, or after a window
/// that ended empty, which makes the next waits skip spinning). So the server reads all along,
/// returning credits: the writer never runs out of them and waits for nothing, and every send
/// completion that wakes the reader gives it another window for a write to end.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spinning_reader_lets_the_writing_half_go_on() {
    const LAST: u8 = 8;
    let options = RStreamOptions::new().busy_poll(std::time::Duration::from_secs(1));
    let (mut server, client) = stream_pair(options).await;
    let (mut rd, mut wr) = client.into_split();
    // The server sends nothing until the end, so the reader waits, spinning, meanwhile.
    let reading = tokio::spawn(async move {
        let mut byte = [0u8; 1];
        rd.read_exact(&mut byte).await.map(|_| byte[0])
    });
    // Every byte but the last is a 7; the server counts them until the last.
    let counting = tokio::spawn(async move {
        let mut sevens = 0usize;
        let mut byte = [0u8; 1];
        loop {
            server.read_exact(&mut byte).await?;
            match byte[0] {
                7 => sevens += 1,
                LAST => return io::Result::Ok((sevens, server)),
                other => return Err(io::Error::other(format!("byte {other} arrived"))),
            }
        }
    });
    let written = guard("writes until one finds the reader spinning", async {
        let mut written = 0usize;
        while wr.stats().busy_polls_yielded == 0 {
            wr.write_all(&[7]).await?;
            written += 1;
        }
        wr.write_all(&[LAST]).await?;
        io::Result::Ok(written)
    })
    .await
    .unwrap();
    let (sevens, mut server) = guard("the server reads the writes", counting)
        .await
        .expect("server task")
        .unwrap();
    assert_eq!(sevens, written, "every write arrived intact");
    server.write_all(&[9]).await.unwrap();
    let byte = guard("the reader gets the server's byte", reading)
        .await
        .expect("reader task")
        .unwrap();
    assert_eq!(byte, 9);
}

/// A reader that finds nothing to read yields to the runtime's other tasks before it sleeps.
/// On this one-thread runtime the echo task runs only when the client's read lets it, so the
/// client's wait for the echo must yield, and the yields must not lose the echo. The second
/// reply is held back until the client's yields have run out (the task that releases it
/// yields far more often than a wait does, and touches no queue, so the client's yields see
/// no other connection at work and end at once): that wait then sleeps, and the completion
/// must still wake it.
#[rdma_async::test]
async fn a_waiting_reader_yields_to_other_tasks_and_still_wakes_after_sleeping() {
    let options = RStreamOptions::new().busy_poll(std::time::Duration::ZERO);
    let (mut server, mut client) = stream_pair(options).await;
    let (release, released) = tokio::sync::oneshot::channel::<()>();
    let echo = tokio::spawn(async move {
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await?;
        server.write_all(&buf).await?;
        released
            .await
            .map_err(|_| io::Error::other("the release was dropped"))?;
        server.write_all(b"late").await?;
        io::Result::Ok(server)
    });
    client.write_all(b"ping").await.unwrap();
    let mut back = [0u8; 4];
    guard("the echo", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(&back, b"ping");
    let yielded = client.stats().waits_yielded;
    assert!(yielded >= 1, "the wait for the echo yielded: {yielded}");

    let releaser = tokio::spawn(async move {
        for _ in 0..1000 {
            tokio::task::yield_now().await;
        }
        let _ = release.send(());
    });
    guard("the late reply", client.read_exact(&mut back))
        .await
        .unwrap();
    assert_eq!(&back, b"late");
    // A wait sleeps only after a yield that found no other connection at work (or skips
    // yielding after such waits), and the reply comes only after the releaser's 1000 yields,
    // long after the client's ran out: the reply found the wait asleep.
    let late_yields = client.stats().waits_yielded - yielded;
    assert!(
        late_yields <= 8,
        "the wait for the late reply yielded at most 8 times before it slept: {late_yields}"
    );
    releaser.await.unwrap();
    let _server = guard("server", echo).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn peek_leaves_the_bytes_for_the_read_and_poll_peek_fills_a_read_buf() {
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    server.write_all(b"first").await.unwrap();
    // `peek` takes `&self`: two peeks at once, through the same shared stream.
    let (mut a, mut b) = ([0u8; 16], [0u8; 16]);
    let (na, nb) = guard("two peeks", async {
        tokio::join!(client.peek(&mut a), client.peek(&mut b))
    })
    .await;
    let (na, nb) = (na.unwrap(), nb.unwrap());
    assert_eq!((&a[..na], &b[..nb]), (&b"first"[..], &b"first"[..]));
    let mut got = [0u8; 5];
    guard("read", client.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"first", "the read returns what was peeked");

    // poll_peek appends to the ReadBuf after what it holds, and reports what it added.
    server.write_all(b"second").await.unwrap();
    let mut storage = [0u8; 16];
    let mut buf = ReadBuf::new(&mut storage);
    buf.put_slice(b">");
    let n = guard("poll_peek", poll_fn(|cx| client.poll_peek(cx, &mut buf)))
        .await
        .unwrap();
    assert_eq!((n, buf.filled()), (6, &b">second"[..]));
    let mut got = [0u8; 6];
    guard("read", client.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"second");

    // The same on a read half.
    let (mut rd, _wr) = client.split();
    server.write_all(b"third").await.unwrap();
    let mut storage = [0u8; 16];
    let mut buf = ReadBuf::new(&mut storage);
    let n = guard("half's poll_peek", poll_fn(|cx| rd.poll_peek(cx, &mut buf)))
        .await
        .unwrap();
    assert_eq!(buf.filled()[..n], b"third"[..]);
    let n = guard("half's peek", rd.peek(&mut a)).await.unwrap();
    assert_eq!(&a[..n], b"third");
    let mut got = [0u8; 5];
    guard("half's read", rd.read_exact(&mut got)).await.unwrap();
    assert_eq!(&got, b"third");

    // At EOF a peek returns 0.
    server.shutdown().await.unwrap();
    assert_eq!(guard("peek at EOF", client.peek(&mut a)).await.unwrap(), 0);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn ready_reports_readable_writable_and_read_closed() {
    let (mut server, client) = stream_pair(RStreamOptions::new()).await;
    let ready = guard("writable", client.ready(Interest::WRITABLE))
        .await
        .unwrap();
    assert!(
        ready.is_writable() && !ready.is_write_closed() && !ready.is_readable(),
        "a fresh stream is writable, and only that was asked: {ready:?}"
    );

    // Nothing was written: READABLE waits until the peer writes.
    let mut readable = std::pin::pin!(client.ready(Interest::READABLE));
    assert!(
        poll_once(readable.as_mut()).await.is_pending(),
        "readable before the peer wrote"
    );
    server.write_all(b"data").await.unwrap();
    let ready = guard("readable", readable).await.unwrap();
    assert!(ready.is_readable() && !ready.is_read_closed(), "{ready:?}");
    let ready = guard(
        "both",
        client.ready(Interest::READABLE | Interest::WRITABLE),
    )
    .await
    .unwrap();
    assert!(ready.is_readable() && ready.is_writable(), "{ready:?}");
    let mut buf = [0u8; 8];
    assert_eq!(client.try_read(&mut buf).unwrap(), 4);

    // The peer shuts down writing: no more data will come.
    server.shutdown().await.unwrap();
    let ready = guard("read closed", client.ready(Interest::READABLE))
        .await
        .unwrap();
    assert!(ready.is_read_closed(), "{ready:?}");
    assert_eq!(client.try_read(&mut buf).unwrap(), 0, "EOF");
    // Our side may still write: the peer reads on.
    let ready = guard("still writable", client.ready(Interest::WRITABLE))
        .await
        .unwrap();
    assert!(ready.is_writable() && !ready.is_write_closed(), "{ready:?}");
    assert_eq!(client.try_write(b"back").unwrap(), 4);
    guard("the peer reads", server.read_exact(&mut buf[..4]))
        .await
        .unwrap();
    assert_eq!(&buf[..4], b"back");

    // A stream has no other readiness to wait for.
    let err = client
        .ready(Interest::ERROR)
        .await
        .expect_err("ERROR alone is not waited for");
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn poll_accept_accepts_and_an_abandoned_poll_loses_no_connection() {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let (accepted, client) = guard("poll_accept", async {
        tokio::join!(
            poll_fn(|cx| listener.poll_accept(cx)),
            RStream::connect(addr)
        )
    })
    .await;
    let (mut server, peer) = accepted.unwrap();
    let mut client = client.unwrap();
    assert_eq!(peer, server.peer_addr().unwrap());
    client.write_all(b"1").await.unwrap();
    let mut byte = [0u8; 1];
    guard("read", server.read_exact(&mut byte)).await.unwrap();
    assert_eq!(&byte, b"1");

    // A poll_accept polled until the client's connect completes (its handshake has then
    // finished on the listener's side) and then dropped: the connection waits for `accept`.
    let mut connect = std::pin::pin!(RStream::connect(addr));
    let mut abandoned = std::pin::pin!(poll_fn(|cx| listener.poll_accept(cx)));
    let (client, early) = guard("connect while poll_accept is polled", async {
        tokio::select! {
            biased;
            client = &mut connect => (client.unwrap(), None),
            accepted = &mut abandoned => (connect.await.unwrap(), Some(accepted.unwrap())),
        }
    })
    .await;
    let mut client = client;
    let (mut server, _) = match early {
        Some(accepted) => accepted,
        None => guard("accept after the abandoned poll", listener.accept())
            .await
            .unwrap(),
    };
    client.write_all(b"2").await.unwrap();
    guard("read", server.read_exact(&mut byte)).await.unwrap();
    assert_eq!(&byte, b"2", "the accepted stream is the client's");

    // A poll_accept left pending does not hold up a later accept.
    assert!(
        poll_once(abandoned.as_mut()).await.is_pending(),
        "no client is connecting"
    );
    let (accepted, client) = guard("accept after a pending poll_accept", async {
        tokio::join!(listener.accept(), RStream::connect(addr))
    })
    .await;
    let (mut server, _) = accepted.unwrap();
    client.unwrap().write_all(b"3").await.unwrap();
    guard("read", server.read_exact(&mut byte)).await.unwrap();
    assert_eq!(&byte, b"3");
}
