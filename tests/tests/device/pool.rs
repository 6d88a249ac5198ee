//! The registered buffer pool: buffers carry RDMA operations, come back on drop, are carved
//! from slabs (one registration per slab), and the bound holds (refuse, or wait for a return).

use std::io;
use std::pin::pin;
use std::task::Poll;

use rdma_async::device::{PoolOptions, PoolStats};
use rdma_async::rdma::{RdmaOptions, RemoteAccess};
use rdma_async_tests::{err_kind, guard, rdma_pair};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn pool_buffers_carry_sends_and_writes_and_come_back_when_dropped() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let options = PoolOptions::new()
        .size_classes([4096, 64])
        .slab_bytes(4 * 4096)
        .max_bytes(1 << 20);
    let pool = client.context().buffer_pool(&options).unwrap();
    assert_eq!(pool.size_classes(), &[64, 4096]);
    let inbox_pool = server.context().buffer_pool(&options).unwrap();

    // Four 4 KiB buffers and one small one: one slab per class, not one registration each.
    let mut bufs: Vec<_> = (0..4).map(|_| pool.try_get(3000).unwrap()).collect();
    let small = pool.try_get(10).unwrap();
    assert_eq!(small.len(), 64, "the smallest class that fits");
    assert!(bufs.iter().all(|b| b.len() == 4096));
    let stats = pool.stats();
    assert_eq!(stats.slabs, 2, "{stats:?}");
    assert_eq!(stats.registered_bytes, 4 * 4096 + 4 * 4096 / 64 * 64);
    assert_eq!(stats.in_use, 5);

    // Each buffer is its own memory: distinct contents survive a send each.
    for (i, buf) in bufs.iter_mut().enumerate() {
        buf.fill(i as u8 + 1);
    }
    for (i, buf) in bufs.drain(..).enumerate() {
        let inbox = inbox_pool.get(4096).await.unwrap();
        let ((got, inbox), (sent, buf)) = guard("send a pool buffer", async {
            tokio::join!(server.recv(inbox, ..), client.send(buf, ..3000))
        })
        .await;
        sent.unwrap();
        assert_eq!(got.unwrap().len(), 3000);
        assert!(
            inbox[..3000].iter().all(|&b| b == i as u8 + 1),
            "buffer {i}"
        );
        assert!(buf.iter().all(|&b| b == i as u8 + 1), "buffer {i} itself");
    }
    // An RDMA write from a pool buffer into the peer's memory.
    let target = server.reg_shared(64, RemoteAccess::WRITE).unwrap();
    let mut small = small;
    small.copy_from_slice(&[0xab; 64]);
    let (wrote, small) = client.write(small, .., target.remote().whole()).await;
    wrote.unwrap();
    assert_eq!(target.to_vec(), vec![0xab; 64]);
    drop(small);

    let stats = pool.stats();
    assert_eq!(stats.in_use, 0, "every buffer came back: {stats:?}");
    assert_eq!(stats.handed_out, 5);
    assert_eq!(stats.returned, 5);
    // Reuse takes returned buffers: no new slab.
    let again: Vec<_> = (0..4).map(|_| pool.try_get(4096).unwrap()).collect();
    assert_eq!(pool.stats().slabs, 2);
    drop(again);
    let inbox_stats = inbox_pool.stats();
    assert_eq!(inbox_stats.in_use, 0, "{inbox_stats:?}");
    assert_eq!(inbox_stats.slabs, 1, "one 4 KiB buffer reused four times");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_pool_refuses_or_waits_until_a_buffer_is_returned() {
    let (_server, client) = rdma_pair(&RdmaOptions::new()).await;
    let options = PoolOptions::new()
        .size_classes([4096])
        .slab_bytes(4096)
        .max_bytes(2 * 4096);
    let pool = client.context().buffer_pool(&options).unwrap();
    let mut first = pool.try_get(4096).unwrap();
    let _second = pool.try_get(1).unwrap();
    let (kind, msg) = err_kind(pool.try_get(100));
    assert_eq!(kind, io::ErrorKind::WouldBlock, "{msg}");
    assert!(msg.contains("exhausted"), "{msg}");
    assert_eq!(pool.stats().exhausted, 1);
    assert_eq!(pool.stats().slabs, 2, "bounded at two slabs");

    first.fill(7);
    let mut waiting = pin!(pool.get(4096));
    let polled = std::future::poll_fn(|cx| Poll::Ready(waiting.as_mut().poll(cx))).await;
    assert!(polled.is_pending(), "get waits while the pool is full");
    drop(first);
    let reused = guard("get after a return", waiting).await.unwrap();
    assert_eq!(reused.len(), 4096);
    assert!(
        reused.iter().all(|&b| b == 7),
        "the returned buffer is the one handed out again (not zeroed)"
    );
    assert_eq!(pool.stats().slabs, 2);

    // Requests no class fits, and options that make no pool.
    for len in [0, 4097] {
        let (kind, msg) = err_kind(pool.try_get(len));
        assert_eq!(kind, io::ErrorKind::InvalidInput, "{len}: {msg}");
    }
    let ctx = client.context();
    for bad in [
        PoolOptions::new().size_classes([]),
        PoolOptions::new().size_classes([0, 64]),
        PoolOptions::new().size_classes([1 << 20]).max_bytes(4096),
    ] {
        let (kind, msg) = err_kind(ctx.buffer_pool(&bad));
        assert_eq!(kind, io::ErrorKind::InvalidInput, "{bad:?}: {msg}");
    }
    assert_ne!(pool.stats(), PoolStats::default());
}
