//! Datagrams from senders new to a socket cannot stall its runtime: the address handle that
//! answers a sender (`ibv_create_ah_from_wc`, which on RoCE can resolve the sender's neighbour
//! synchronously) is made when a reply is first sent, on a blocking thread, never while
//! `recv_from` runs. A test hook holds every such creation until the test releases it; on a
//! current-thread runtime, receiving from new senders and another task's ticks must go on
//! meanwhile. One test in its own binary: the hold is process-wide.

use std::sync::Arc;
use std::time::Duration;

use rdma_async::datagram::hooks;
use rdma_async_device_tests::{datagram, guard, test_ip};

/// Senders new to the server, each a socket of its own (so a source of its own).
const SENDERS: usize = 3;

/// Ticks of another task that must happen while creations are held.
const TICKS: usize = 5;

/// Ticks a 10 ms interval `n` times: this task makes progress only if the runtime's one
/// thread is free.
async fn ticks(n: usize) {
    let mut interval = tokio::time::interval(Duration::from_millis(10));
    for _ in 0..n {
        interval.tick().await;
    }
}

#[rdma_async::test(flavor = "current_thread")]
async fn new_senders_do_not_block_the_runtime_while_reply_handles_are_made() {
    let mut hold = hooks::hold_reply_handles();
    let server = Arc::new(datagram(test_ip()).await);
    let server_addr = server.local_addr().unwrap();
    let mut senders = Vec::new();
    for i in 0..SENDERS {
        let sender = datagram(test_ip()).await;
        guard("send", sender.send_to(&[i as u8], server_addr))
            .await
            .unwrap();
        senders.push(sender);
    }

    // Every datagram is received, and another task ticks, while address handles are held.
    let ticker = tokio::spawn(ticks(TICKS));
    let mut buf = [0u8; 16];
    let mut sources = Vec::new();
    for _ in 0..SENDERS {
        let (n, from) = guard("recv", server.recv_from(&mut buf)).await.unwrap();
        assert_eq!(n, 1);
        sources.push((buf[0] as usize, from));
    }
    guard("ticker", ticker).await.unwrap();
    assert!(
        !hold.gave_up(),
        "an address-handle creation waited on the runtime's thread until the hold gave up"
    );
    assert_eq!(hold.held(), 0, "receiving made no address handle");
    sources.sort();
    let expected: Vec<_> = senders
        .iter()
        .enumerate()
        .map(|(i, s)| (i, s.local_addr().unwrap()))
        .collect();
    assert_eq!(sources, expected, "each datagram named its sender");

    // A reply makes the handle on a blocking thread: the runtime goes on while it is held.
    let to = expected[0].1;
    let replying = server.clone();
    let reply = tokio::spawn(async move { replying.send_to(b"reply 0", to).await });
    guard("the reply's handle is being made", hold.wait_held(1)).await;
    guard("ticker", ticks(TICKS)).await;
    assert!(
        !reply.is_finished(),
        "the reply waits for its address handle"
    );
    assert!(!hold.gave_up());
    hold.release();
    guard("reply", reply).await.unwrap().unwrap();

    // Each sender gets its reply through the route its datagram gave.
    for (i, (sender, (_, to))) in senders.iter().zip(&expected).enumerate() {
        let msg = format!("reply {i}");
        if i > 0 {
            guard("reply", server.send_to(msg.as_bytes(), *to))
                .await
                .unwrap();
        }
        let (n, from) = guard("recv reply", sender.recv_from(&mut buf))
            .await
            .unwrap();
        assert_eq!((&buf[..n], from), (msg.as_bytes(), server_addr));
    }
    let tables = hooks::peer_tables(&server);
    assert_eq!(
        (tables.routes, tables.address_handles),
        (SENDERS, SENDERS),
        "one route and one address handle per sender: {tables:?}"
    );
}
