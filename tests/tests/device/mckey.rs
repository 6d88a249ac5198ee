//! Multicast: several receivers, join/leave, IPv6 groups, and interoperation with librdmacm's
//! `mckey` (rdmacm-utils) both ways.
//!
//! mckey's exchange: both sides join the group (`-m`); after the join the sender (`-s`) sends
//! `-C` datagrams of `-S` bytes to the group; the receiver, whose receives were posted before it
//! joined, waits for that many.

use std::net::{IpAddr, SocketAddr};

use rdma_async::datagram::RDatagram;
use rdma_async_device_tests::tools::{EXCHANGE_DONE, Tool};
use rdma_async_device_tests::{argv, datagram, err_kind, guard, test_ip, test_ip6};

const COUNT: usize = 10;
const SIZE: usize = 100;

fn group(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// Receives `n` datagrams and checks they are `expected`, from `from`.
async fn receive_all(socket: &RDatagram, n: usize, expected: &[u8], from: IpAddr) {
    let mut buf = vec![0u8; socket.max_datagram()];
    for i in 0..n {
        let (len, sender) = guard("multicast datagram", socket.recv_from(&mut buf))
            .await
            .unwrap();
        assert_eq!(&buf[..len], expected, "datagram {i}");
        assert_eq!(sender.ip(), from);
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_receivers_and_a_join_leave_cycle() {
    let g = group("239.77.0.1");
    let sender = datagram(test_ip()).await;
    let receivers = [
        datagram(test_ip()).await,
        datagram(test_ip()).await,
        datagram(test_ip()).await,
    ];
    let (kind, _) = err_kind(sender.send_to(b"x", (g, 0)).await);
    assert_eq!(
        kind,
        std::io::ErrorKind::NotConnected,
        "sending needs a join"
    );
    guard("join", sender.join_multicast(g)).await.unwrap();
    for r in &receivers {
        guard("join", r.join_multicast(g)).await.unwrap();
    }
    assert_eq!(
        err_kind(receivers[0].join_multicast(g).await).0,
        std::io::ErrorKind::AddrInUse
    );
    let first = b"to all three".to_vec();
    for _ in 0..COUNT {
        sender.send_to(&first, (g, 0)).await.unwrap();
    }
    for r in &receivers {
        receive_all(r, COUNT, &first, test_ip()).await;
    }
    // The third leaves; what is sent next reaches only the other two.
    receivers[2].leave_multicast(g).unwrap();
    assert_eq!(
        err_kind(receivers[2].leave_multicast(g)).0,
        std::io::ErrorKind::AddrNotAvailable
    );
    let second = b"to the two left".to_vec();
    for _ in 0..COUNT {
        sender.send_to(&second, (g, 0)).await.unwrap();
    }
    for r in &receivers[..2] {
        receive_all(r, COUNT, &second, test_ip()).await;
    }
    // Datagrams from one queue pair arrive in order: if the unicast sent after the group's
    // datagrams is the next thing the third receiver gets, none of them reached it.
    let fence = b"unicast after the group".to_vec();
    sender
        .send_to(&fence, receivers[2].local_addr().unwrap())
        .await
        .unwrap();
    receive_all(&receivers[2], 1, &fence, test_ip()).await;
    let mut buf = [0u8; 64];
    assert_eq!(
        err_kind(receivers[2].try_recv_from(&mut buf)).0,
        std::io::ErrorKind::WouldBlock
    );
    assert_eq!(receivers[2].stats().received, COUNT as u64 + 1);
    // Joining again works.
    guard("rejoin", receivers[2].join_multicast(g))
        .await
        .unwrap();
    sender.send_to(b"again", (g, 0)).await.unwrap();
    receive_all(&receivers[2], 1, b"again", test_ip()).await;
}

/// IPv6 groups: the kernel's rdma_cm joins them on InfiniBand and RoCE v1, but refuses them on
/// RoCE v2 (`cma_iboe_join_multicast` returns ENOTSUPP), which is all Soft-RoCE speaks. The
/// join must then fail with `Unsupported` and a message that says why, leaving the socket
/// usable; where the join works, the group must deliver.
/// A group datagram names its sender's bound address, port included, so a member can answer it
/// with `send_to(from)`, although the two sockets never exchanged anything before.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_datagram_names_its_sender_who_can_be_answered() {
    let g = group("239.77.0.9");
    let sender = datagram(test_ip()).await;
    let member = datagram(test_ip()).await;
    let sender_addr = sender.local_addr().unwrap();
    guard("join", sender.join_multicast(g)).await.unwrap();
    guard("join", member.join_multicast(g)).await.unwrap();
    guard("to the group", sender.send_to(b"who is there", (g, 0)))
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    let (n, from) = guard("group datagram", member.recv_from(&mut buf))
        .await
        .unwrap();
    assert_eq!(&buf[..n], b"who is there");
    assert_eq!(
        from, sender_addr,
        "the sender's bound address, port included"
    );
    guard("answer", member.send_to(b"a member", from))
        .await
        .unwrap();
    // The sender receives its own group datagram too (loopback): the answer follows it.
    let answer = guard("answer", async {
        loop {
            let (n, from) = sender.recv_from(&mut buf).await.unwrap();
            if from != sender_addr {
                break (buf[..n].to_vec(), from);
            }
        }
    })
    .await;
    assert_eq!(answer, (b"a member".to_vec(), member.local_addr().unwrap()));
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_group() {
    let g = group("ff0e::77:1");
    let sender = datagram(test_ip6()).await;
    let receiver = datagram(test_ip6()).await;
    match guard("join v6", receiver.join_multicast(g)).await {
        Ok(()) => {
            guard("join v6", sender.join_multicast(g)).await.unwrap();
            let msg = vec![6u8; sender.max_datagram()];
            sender.send_to(&msg, SocketAddr::new(g, 0)).await.unwrap();
            receive_all(&receiver, 1, &msg, test_ip6()).await;
        }
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::Unsupported, "{e}");
            assert!(e.to_string().contains("RoCE v2"), "{e}");
            // Not joined, and still a working socket.
            assert_eq!(
                err_kind(receiver.leave_multicast(g)).0,
                std::io::ErrorKind::AddrNotAvailable
            );
            sender
                .send_to(b"unicast", receiver.local_addr().unwrap())
                .await
                .unwrap();
            receive_all(&receiver, 1, b"unicast", test_ip6()).await;
        }
    }
    assert_eq!(
        err_kind(receiver.join_multicast(group("239.77.0.2")).await).0,
        std::io::ErrorKind::InvalidInput,
        "an IPv4 group on an IPv6 socket"
    );
    assert_eq!(
        err_kind(receiver.join_multicast(test_ip6()).await).0,
        std::io::ErrorKind::InvalidInput,
        "not a multicast address"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_sender_with_c_receiver() {
    let g = "239.77.0.3";
    let mut c_receiver = Tool::spawn(
        "mckey",
        &argv!["-m", g, "-b", test_ip(), "-C", COUNT, "-S", SIZE],
    );
    // Send only once the receiver has joined (its receives are posted before the join).
    c_receiver.wait_for("joined").await;
    let sender = datagram(test_ip()).await;
    guard("join", sender.join_multicast(group(g)))
        .await
        .unwrap();
    for _ in 0..COUNT {
        sender
            .send_to(&[0x3cu8; SIZE], (group(g), 0))
            .await
            .unwrap();
    }
    c_receiver.expect_success(&EXCHANGE_DONE).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_sender_with_our_receiver() {
    let g = "239.77.0.4";
    let receiver = datagram(test_ip()).await;
    guard("join", receiver.join_multicast(group(g)))
        .await
        .unwrap();
    let c_sender = Tool::spawn(
        "mckey",
        &argv!["-m", g, "-b", test_ip(), "-s", "-C", COUNT, "-S", SIZE],
    );
    let mut buf = [0u8; 2 * SIZE];
    for _ in 0..COUNT {
        let (n, from) = guard("datagram from mckey", receiver.recv_from(&mut buf))
            .await
            .unwrap();
        assert_eq!(n, SIZE);
        assert_eq!(from.ip(), test_ip());
    }
    c_sender.expect_success(&EXCHANGE_DONE).await;
}
