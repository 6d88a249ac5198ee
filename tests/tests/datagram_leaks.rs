//! Datagram sockets leak no rdma_cm id, queue pair, completion queue or memory region: not
//! when dropped with routes cached and groups joined, and not when peer resolution or a join
//! is cut off part-way. One test in its own binary: it counts every RDMA resource this process
//! owns.

use std::net::IpAddr;
use std::time::Duration;

use rdma_async_device_tests::{assert_no_rdma_resources, datagram, guard, rdma_resources, test_ip};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_sockets_and_cut_resolutions_leak_nothing() {
    assert_no_rdma_resources("the test starts with none");
    let group: IpAddr = "239.77.1.1".parse().unwrap();
    let a = datagram(test_ip()).await;
    let b = datagram(test_ip()).await;
    let b_addr = b.local_addr().unwrap();
    // Cut resolutions of new peers and joins off at many points.
    for round in 0..30u64 {
        let cut = Duration::from_micros(round * round * 40);
        let peer = datagram(test_ip()).await;
        let to = peer.local_addr().unwrap();
        let _ = tokio::time::timeout(cut, a.send_to(b"cut", to)).await;
        let _ = tokio::time::timeout(cut, peer.join_multicast(group)).await;
    }
    // Everything still works: a route, a group, an exchange both ways.
    guard("send", a.send_to(b"hello", b_addr)).await.unwrap();
    let mut buf = [0u8; 16];
    let (n, from) = guard("recv", b.recv_from(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"hello");
    guard("reply", b.send_to(b"back", from)).await.unwrap();
    guard("recv", a.recv_from(&mut buf)).await.unwrap();
    guard("join", a.join_multicast(group)).await.unwrap();
    guard("join", b.join_multicast(group)).await.unwrap();
    guard("to group", a.send_to(b"all", (group, 0)))
        .await
        .unwrap();
    let (n, _) = guard("recv group", b.recv_from(&mut buf)).await.unwrap();
    assert_eq!(&buf[..n], b"all");
    assert!(
        rdma_resources("qp").unwrap() >= 2,
        "the counter sees the queue pairs"
    );
    drop((a, b));
    assert_no_rdma_resources("every resource is gone");
}
