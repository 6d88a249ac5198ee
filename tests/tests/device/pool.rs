//! The registered buffer pool: buffers carry RDMA operations, come back on drop, are carved
//! from slabs (one registration per slab), and the bound holds (refuse, or wait for a return).

use std::io;
use std::pin::pin;
use std::task::Poll;

use rdma_async::device::{PoolOptions, PoolStats};
use rdma_async::rdma::{RdmaOptions, RemoteAccess};
use rdma_async_device_tests::{err_kind, guard, rdma_pair};

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

/// A pair of endpoints: the server's receives come from `pool`, the client is plain.
async fn endpoint_pair_with_pool(
    pool: &rdma_async::device::BufferPool,
) -> (
    rdma_async::endpoint::Endpoint,
    rdma_async::endpoint::Endpoint,
) {
    use rdma_async::endpoint::{Endpoint, EndpointOptions};
    let listener = rdma_async_device_tests::listener().await;
    let addr = listener.local_addr().unwrap();
    let plain = EndpointOptions::new().recv_depth(4).max_message_size(4096);
    let pooled = plain.clone().recv_pool(pool.clone());
    let server = async {
        let request = listener.accept_request().await?;
        Endpoint::accept(request, &pooled).await
    };
    let (server, client) = guard("connect endpoints", async {
        tokio::join!(server, Endpoint::connect_with(addr, &plain))
    })
    .await;
    (server.unwrap(), client.unwrap())
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_receives_land_in_pool_buffers_handed_out_as_bytes() {
    let ctx = rdma_async::device::DeviceContext::for_local_addr(rdma_async_device_tests::test_ip())
        .unwrap();
    let pool = ctx
        .buffer_pool(
            &PoolOptions::new()
                .size_classes([4096])
                .slab_bytes(8 * 4096)
                .max_bytes(8 * 4096),
        )
        .unwrap();
    let (server, client) = endpoint_pair_with_pool(&pool).await;
    assert_eq!(
        pool.stats().in_use,
        4,
        "every receive is posted in a pool buffer"
    );

    // Eight messages held at once: four posted buffers plus four held fill the pool; the
    // rest land in the endpoint's own memory and are copied. All arrive intact.
    let mut held = Vec::new();
    for i in 0..8u8 {
        let msg = vec![i + 1; 100 + usize::from(i) * 400];
        client.send(&msg).await.unwrap();
        let got = guard("receive", server.recv()).await.unwrap();
        assert!(got[..] == msg[..], "message {i}");
        held.push(got);
        assert!(pool.stats().in_use <= 8, "the pool's bound holds");
    }
    assert_eq!(
        pool.stats().in_use,
        8,
        "the pool ran full: {:?}",
        pool.stats()
    );
    drop(held);
    let stats = pool.stats();
    assert!(
        stats.returned >= 6,
        "dropped Bytes return their buffers: {stats:?}"
    );
    assert!(stats.in_use <= 4, "{stats:?}");

    // And it keeps going once buffers are back.
    for i in 0..6u8 {
        client.send(&[i; 4096]).await.unwrap();
        assert_eq!(
            guard("receive", server.recv()).await.unwrap()[..],
            [i; 4096]
        );
    }
    assert_eq!(
        pool.stats().in_use,
        4,
        "receives posted in pool buffers again"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_sends_go_straight_from_pool_buffers() {
    use rdma_async::endpoint::EndpointOptions;
    let (server, client) = rdma_async_device_tests::pairs::endpoint_pair(
        &EndpointOptions::new().max_message_size(4096),
    )
    .await;
    let ctx = rdma_async::device::DeviceContext::for_local_addr(rdma_async_device_tests::test_ip())
        .unwrap();
    let pool = ctx
        .buffer_pool(&PoolOptions::new().size_classes([8192]).max_bytes(4 * 8192))
        .unwrap();
    let mut region = pool.try_get(8192).unwrap();
    for (i, b) in region.iter_mut().enumerate() {
        *b = (i % 249) as u8;
    }
    // Two messages from two ranges of one buffer.
    let (sent, region) = client.send_region(region, 100..4196).await;
    sent.unwrap();
    let region = region.expect("the region comes back");
    let (sent, region) = client.send_region(region, 8000..).await;
    sent.unwrap();
    let region = region.unwrap();
    let first = guard("receive", server.recv()).await.unwrap();
    let second = guard("receive", server.recv()).await.unwrap();
    assert!(first[..] == region[100..4196], "first message");
    assert!(second[..] == region[8000..], "second message");

    // Refused: a range past the end, a message over max_message_size, another context's region.
    let (result, region) = client.send_region(region, 8000..8193).await;
    assert_eq!(err_kind(result).0, io::ErrorKind::InvalidInput);
    let (result, region) = client.send_region(region.unwrap(), ..4097).await;
    assert_eq!(err_kind(result).0, io::ErrorKind::InvalidInput);
    let other = rdma_async::device::DeviceContext::open(ctx.device_name()).unwrap();
    let (result, back) = client.send_region(other.reg_msgs(16).unwrap(), ..).await;
    let (kind, msg) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(back.is_some(), "a refused region comes back");

    // A call dropped once its send is posted: the message still goes, and the buffer returns
    // to the pool when the device is done (here: by the next call's completion, which comes
    // after it).
    let mut dropped = pool.try_get(100).unwrap();
    dropped[..5].copy_from_slice(b"still");
    {
        let mut send = pin!(client.send_region(dropped, ..5));
        let polled = std::future::poll_fn(|cx| Poll::Ready(send.as_mut().poll(cx))).await;
        if let Poll::Ready((result, _)) = polled {
            result.unwrap();
        }
    }
    assert_eq!(
        &guard("receive", server.recv()).await.unwrap()[..],
        b"still"
    );
    let (sent, region) = client.send_region(region.unwrap(), ..10).await;
    sent.unwrap();
    assert_eq!(
        guard("receive", server.recv()).await.unwrap()[..],
        region.as_ref().unwrap()[..10]
    );
    assert_eq!(
        pool.stats().in_use,
        1,
        "only the buffer in hand: {:?}",
        pool.stats()
    );
    drop(region);
    assert_eq!(pool.stats().in_use, 0);
}
