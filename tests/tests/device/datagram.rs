//! Unreliable datagrams (`RDatagram`) on a real RDMA device: echo, limits, attribution, drops.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_async::datagram::{RDatagram, RDatagramOptions};
use rdma_async_device_tests::data::cyclic;
use rdma_async_device_tests::{
    datagram, err_kind, guard, test_addr, test_addr6, test_ip, test_ip6,
};

/// Echoes every datagram back to its sender until it has echoed `count`.
async fn echo(server: Arc<RDatagram>, count: usize) -> io::Result<()> {
    let mut buf = vec![0u8; server.max_datagram()];
    for _ in 0..count {
        let (n, from) = server.recv_from(&mut buf).await?;
        server.send_to(&buf[..n], from).await?;
    }
    Ok(())
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn echo_of_many_sizes_up_to_the_maximum() {
    let server = Arc::new(datagram(test_ip()).await);
    let client = datagram(test_ip()).await;
    let max = client.max_datagram();
    assert!(max >= 256, "the port MTU is at least 256 bytes, got {max}");
    assert_eq!(server.local_addr().unwrap().ip(), test_ip());
    let sizes: Vec<usize> = [
        0,
        1,
        2,
        39,
        40,
        41,
        100,
        255,
        256,
        511,
        512,
        max / 2,
        max - 1,
        max,
    ]
    .into_iter()
    .filter(|&s| s <= max)
    .collect();
    let echoer = tokio::spawn(echo(server.clone(), sizes.len()));
    let server_addr = server.local_addr().unwrap();
    let mut buf = vec![0u8; max];
    for (i, &size) in sizes.iter().enumerate() {
        let msg = cyclic(i as u8, size);
        let sent = guard("send_to", client.send_to(&msg, server_addr))
            .await
            .unwrap();
        assert_eq!(sent, size);
        let (n, from) = guard("echo", client.recv_from(&mut buf)).await.unwrap();
        assert_eq!(
            from, server_addr,
            "the echo comes from the server's bound address"
        );
        assert_eq!(n, size, "echo length of a {size}-byte datagram");
        assert_eq!(
            &buf[..n],
            &msg[..],
            "echo content of a {size}-byte datagram"
        );
    }
    guard("echoer", echoer).await.unwrap().unwrap();
    let stats = client.stats();
    assert_eq!(stats.sent, sizes.len() as u64);
    assert_eq!(stats.received, sizes.len() as u64);
    assert_eq!((stats.dropped, stats.truncated, stats.malformed), (0, 0, 0));
    assert_eq!(server.stats().received, sizes.len() as u64);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversize_datagram_is_refused_before_sending() {
    let server = datagram(test_ip()).await;
    let client = datagram(test_ip()).await;
    let too_big = vec![7u8; client.max_datagram() + 1];
    let (kind, msg) = err_kind(client.send_to(&too_big, server.local_addr().unwrap()).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains(&client.max_datagram().to_string()), "{msg}");
    let (kind, _) = err_kind(client.try_send_to(&too_big, server.local_addr().unwrap()));
    assert_eq!(kind, io::ErrorKind::InvalidInput);
    assert_eq!(client.stats().sent, 0, "nothing was posted");
    // The socket still works afterwards.
    client
        .send_to(b"fits", server.local_addr().unwrap())
        .await
        .unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = guard("recv", server.recv_from(&mut buf)).await.unwrap();
    assert_eq!(
        (&buf[..n], from),
        (&b"fits"[..], client.local_addr().unwrap())
    );
    // max_datagram above the MTU is refused at bind time.
    let opts = RDatagramOptions::new().max_datagram(client.max_datagram() + 1);
    let (kind, msg) = err_kind(RDatagram::bind_with(test_addr(0), &opts).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncation_into_a_small_buffer_keeps_the_head() {
    let server = datagram(test_ip()).await;
    let client = datagram(test_ip()).await;
    let msg = cyclic(3, 300);
    client
        .send_to(&msg, server.local_addr().unwrap())
        .await
        .unwrap();
    client
        .send_to(b"next", server.local_addr().unwrap())
        .await
        .unwrap();
    let mut small = [0u8; 10];
    let (n, _) = guard("recv", server.recv_from(&mut small)).await.unwrap();
    assert_eq!((n, &small[..]), (10, &msg[..10]));
    let (n, _) = guard("recv", server.recv_from(&mut small)).await.unwrap();
    assert_eq!(
        &small[..n],
        b"next",
        "the rest of the long datagram was discarded"
    );
    assert_eq!(server.stats().truncated, 1);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbound_peer_is_refused_and_wildcard_bind_is_invalid() {
    let client = datagram(test_ip()).await;
    // Nothing is bound at this port (the socket that was is gone).
    let gone = datagram(test_ip()).await.local_addr().unwrap();
    let (kind, msg) = err_kind(guard("send_to", client.send_to(b"x", gone)).await);
    assert_eq!(kind, io::ErrorKind::ConnectionRefused, "{msg}");
    let (kind, msg) = err_kind(RDatagram::bind("0.0.0.0:0").await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    let (kind, msg) = err_kind(client.send_to(b"x", test_addr6(1)).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_send_recv_and_try_variants() {
    let a = datagram(test_ip()).await;
    let b = datagram(test_ip()).await;
    let stranger = datagram(test_ip()).await;
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    assert_eq!(err_kind(a.peer_addr()).0, io::ErrorKind::NotConnected);
    assert_eq!(err_kind(a.send(b"x").await).0, io::ErrorKind::NotConnected);
    // No route yet: try_send_to cannot resolve one.
    assert_eq!(
        err_kind(a.try_send_to(b"x", b_addr)).0,
        io::ErrorKind::NotConnected
    );
    guard("connect", a.connect(b_addr)).await.unwrap();
    guard("connect", b.connect(a_addr)).await.unwrap();
    assert_eq!(a.peer_addr().unwrap(), b_addr);
    // Nothing is waiting yet.
    let mut buf = [0u8; 64];
    assert_eq!(
        err_kind(b.try_recv_from(&mut buf)).0,
        io::ErrorKind::WouldBlock
    );
    // A stranger's datagram is filtered out by the connected socket.
    stranger.send_to(b"noise", b_addr).await.unwrap();
    a.send(b"hello").await.unwrap();
    let n = guard("recv", b.recv(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"hello");
    // The route is cached now: try_send_to goes at once.
    guard("writable", a.writable()).await.unwrap();
    assert_eq!(a.try_send_to(b"again", b_addr).unwrap(), 5);
    guard("readable", b.readable()).await.unwrap();
    let (n, from) = b.try_recv_from(&mut buf).unwrap();
    assert_eq!((&buf[..n], from), (&b"again"[..], a_addr));
    b.send(b"reply").await.unwrap();
    let n = guard("recv", a.recv(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"reply");
    assert!(b.stats().filtered <= 1);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_echo() {
    let server = Arc::new(datagram(test_ip6()).await);
    let client = datagram(test_ip6()).await;
    let echoer = tokio::spawn(echo(server.clone(), 2));
    let mut buf = vec![0u8; client.max_datagram()];
    for size in [1, client.max_datagram()] {
        let msg = cyclic(9, size);
        client
            .send_to(&msg, server.local_addr().unwrap())
            .await
            .unwrap();
        let (n, from) = guard("echo v6", client.recv_from(&mut buf)).await.unwrap();
        assert_eq!(from, server.local_addr().unwrap());
        assert_eq!(&buf[..n], &msg[..]);
    }
    guard("echoer", echoer).await.unwrap().unwrap();
}

/// The datagrams of one sender in the many-senders test: `[index, seq (4 bytes BE), pattern]`.
fn numbered(sender: u8, seq: u32, len: usize) -> Vec<u8> {
    let mut msg = cyclic(sender ^ seq as u8, len.max(5));
    msg[0] = sender;
    msg[1..5].copy_from_slice(&seq.to_be_bytes());
    msg
}

/// Sequence numbers from here on are end markers (`END + attempt`).
const END: u32 = 0x8000_0000;

/// Sends end markers to `to` until the receiver acknowledges the latest one (UD may drop a
/// marker or an acknowledgement too; the retransmission interval is only that: correctness
/// never depends on it). Once the latest marker is acknowledged, everything this sender sent
/// before it has been delivered or counted as dropped. Returns `sent` plus the markers.
async fn end_until_acked(
    socket: &RDatagram,
    index: u8,
    to: SocketAddr,
    sent: u64,
) -> io::Result<u64> {
    let mut sent = sent;
    let mut ack = [0u8; 8];
    for attempt in 0.. {
        socket
            .send_to(&numbered(index, END + attempt, 5), to)
            .await?;
        sent += 1;
        loop {
            let wait = tokio::time::timeout(Duration::from_millis(200), socket.recv_from(&mut ack));
            let Ok(got) = wait.await else { break };
            let (n, from) = got?;
            assert_eq!((n, from), (5, to), "only the receiver's acks come back");
            assert_eq!(ack[0], index);
            if u32::from_be_bytes([ack[1], ack[2], ack[3], ack[4]]) == END + attempt {
                return Ok(sent);
            }
        }
    }
    unreachable!("attempts are unbounded")
}

/// Sends `count` numbered datagrams of varying sizes to `to`, then the end marker. Returns how
/// many datagrams it sent in all.
async fn numbered_sender(
    socket: RDatagram,
    index: u8,
    count: u32,
    to: SocketAddr,
) -> io::Result<u64> {
    for seq in 0..count {
        let len = 5 + (seq as usize * 7 + usize::from(index) * 13) % 200;
        socket.send_to(&numbered(index, seq, len), to).await?;
    }
    end_until_acked(&socket, index, to, u64::from(count)).await
}

/// Receives numbered datagrams from `senders` senders until every one of them reported (on
/// `done`) that its end marker was acknowledged; checks each datagram and returns the count.
async fn numbered_receiver(
    socket: &RDatagram,
    senders: &[SocketAddr],
    mut done: tokio::sync::mpsc::Receiver<u64>,
) -> (u64, u64) {
    let mut buf = vec![0u8; socket.max_datagram()];
    let mut delivered = 0u64;
    let mut sent_total = 0u64;
    let mut reports = 0;
    let mut last_seq = vec![None::<u32>; senders.len()];
    while reports < senders.len() {
        tokio::select! {
            got = socket.recv_from(&mut buf) => {
                let (n, from) = got.unwrap();
                delivered += 1;
                assert!(n >= 5, "a numbered datagram has a header");
                let index = usize::from(buf[0]);
                assert_eq!(from, senders[index], "datagram attributed to its sender");
                let seq = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
                let expected = numbered(buf[0], seq, n);
                assert_eq!(&buf[..n], &expected[..], "datagram {seq} of sender {index} intact");
                if seq >= END {
                    socket.send_to(&buf[..5], from).await.unwrap();
                } else {
                    assert!(last_seq[index].is_none_or(|last| seq > last), "in order per sender");
                    last_seq[index] = Some(seq);
                }
            }
            Some(sent) = done.recv() => {
                sent_total += sent;
                reports += 1;
            }
        }
    }
    (delivered, sent_total)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_senders_thousand_datagrams_attributed_and_drops_counted() {
    const SENDERS: u8 = 4;
    const PER_SENDER: u32 = 250;
    let receiver = RDatagram::bind_with(test_addr(0), &RDatagramOptions::new().recv_depth(64))
        .await
        .unwrap();
    let to = receiver.local_addr().unwrap();
    let mut addrs = Vec::new();
    let (done_tx, done_rx) = tokio::sync::mpsc::channel(SENDERS as usize);
    let mut tasks = Vec::new();
    for index in 0..SENDERS {
        let socket = datagram(test_ip()).await;
        addrs.push(socket.local_addr().unwrap());
        let done = done_tx.clone();
        tasks.push(tokio::spawn(async move {
            let sent = numbered_sender(socket, index, PER_SENDER, to).await?;
            done.send(sent).await.map_err(io::Error::other)?;
            io::Result::Ok(())
        }));
    }
    let (delivered, sent) = guard(
        "receiving from 4 senders",
        numbered_receiver(&receiver, &addrs, done_rx),
    )
    .await;
    for task in tasks {
        task.await.unwrap().unwrap();
    }
    let stats = receiver.stats();
    assert!(sent >= u64::from(SENDERS) * u64::from(PER_SENDER + 1));
    assert_eq!(stats.received, delivered);
    assert_eq!(
        delivered + stats.dropped,
        sent,
        "delivered + counted drops = sent ({stats:?})"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn datagrams_beyond_the_receive_depth_are_dropped_and_counted() {
    const DEPTH: u32 = 8;
    const COUNT: u32 = 100;
    let receiver = RDatagram::bind_with(test_addr(0), &RDatagramOptions::new().recv_depth(DEPTH))
        .await
        .unwrap();
    let to = receiver.local_addr().unwrap();
    let sender = datagram(test_ip()).await;
    let from = sender.local_addr().unwrap();
    // Nobody reads while the sender sends: the ring keeps DEPTH datagrams, the device drops
    // the rest.
    for seq in 0..COUNT {
        sender.send_to(&numbered(0, seq, 64), to).await.unwrap();
    }
    let (done_tx, done_rx) = tokio::sync::mpsc::channel(1);
    let task = tokio::spawn(async move {
        let sent = end_until_acked(&sender, 0, to, u64::from(COUNT)).await?;
        done_tx.send(sent).await.map_err(io::Error::other)
    });
    let (delivered, sent) = guard("receive", numbered_receiver(&receiver, &[from], done_rx)).await;
    task.await.unwrap().unwrap();
    let stats = receiver.stats();
    assert!(
        stats.dropped > 0,
        "{COUNT} datagrams into {DEPTH} buffers drop some"
    );
    assert!(
        delivered >= u64::from(DEPTH),
        "the posted buffers kept their datagrams"
    );
    assert_eq!(delivered + stats.dropped, sent, "{stats:?}");
}

/// `try_send` and `try_recv` on connected sockets, each retried after its readiness wait until
/// it does not block; `peek_from` leaves the datagram for the next receive.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn connected_try_send_try_recv_and_peek_from() {
    let a = datagram(test_ip()).await;
    let b = datagram(test_ip()).await;
    let (a_addr, b_addr) = (a.local_addr().unwrap(), b.local_addr().unwrap());
    let mut buf = [0u8; 64];
    assert_eq!(err_kind(a.try_send(b"x")).0, io::ErrorKind::NotConnected);
    assert_eq!(
        err_kind(a.try_recv(&mut buf)).0,
        io::ErrorKind::NotConnected
    );
    guard("connect", a.connect(b_addr)).await.unwrap();
    guard("connect", b.connect(a_addr)).await.unwrap();
    assert_eq!(err_kind(b.try_recv(&mut buf)).0, io::ErrorKind::WouldBlock);

    let sent = guard("try_send", async {
        loop {
            a.writable().await?;
            match a.try_send(b"ping") {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                sent => return sent,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(sent, 4);
    let n = guard("try_recv", async {
        loop {
            b.readable().await?;
            match b.try_recv(&mut buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
                got => return got,
            }
        }
    })
    .await
    .unwrap();
    assert_eq!(&buf[..n], b"ping");

    // Peeked twice (once into a buffer too small for it), then received: the same datagram.
    b.send(b"peeked datagram").await.unwrap();
    let mut small = [0u8; 6];
    let (n, from) = guard("peek_from", a.peek_from(&mut small)).await.unwrap();
    assert_eq!((&small[..n], from), (&b"peeked"[..], b_addr));
    let (n, from) = guard("peek_from", a.peek_from(&mut buf)).await.unwrap();
    assert_eq!((&buf[..n], from), (&b"peeked datagram"[..], b_addr));
    let mut got = [0u8; 64];
    let (n, from) = guard("recv_from", a.recv_from(&mut got)).await.unwrap();
    assert_eq!((&got[..n], from), (&b"peeked datagram"[..], b_addr));
    assert_eq!(
        err_kind(a.try_recv(&mut got)).0,
        io::ErrorKind::WouldBlock,
        "the peeked datagram was received once"
    );
    assert_eq!(a.stats().truncated, 0, "a peek truncates nothing");
}
