//! `rdma::RdmaConnection`: every operation kind with content checks, the edges of a remote
//! region, clear errors for bad ranges and keys, vectored forms, and 1000 operations through a
//! small queue.

use std::future::Future;
use std::io;
use std::sync::Arc;
use std::task::Poll;

use rdma_async::rdma::{
    LocalRegion, RdmaConnection, RdmaOptions, ReceivedOp, RemoteAccess, RemoteRegion, SharedRegion,
};
use rdma_async_device_tests::data::cyclic;
use rdma_async_device_tests::{completion_status, guard, rdma_pair};

/// Sends `region`'s descriptor as a 16-byte message (as rping does).
pub(super) async fn advertise(conn: &RdmaConnection, region: &SharedRegion) {
    let mut msg = conn.reg_msgs(RemoteRegion::ENCODED_LEN).unwrap();
    msg.copy_from_slice(&region.remote().to_bytes());
    let (sent, _) = guard("send descriptor", conn.send(msg, ..)).await;
    sent.unwrap();
}

pub(super) async fn learn(conn: &RdmaConnection) -> RemoteRegion {
    let (got, msg) = guard("recv descriptor", conn.recv(conn.reg_msgs(64).unwrap(), ..)).await;
    let n = got.unwrap().len();
    RemoteRegion::from_bytes(&msg[..n]).unwrap()
}

/// A 1-byte message both ways: the peer's one-sided operations before it have landed.
pub(super) async fn sync(a: &RdmaConnection, b: &RdmaConnection) {
    let recv = b.recv(b.reg_msgs(1).unwrap(), ..);
    let send = a.send(a.reg_msgs(1).unwrap(), ..);
    let ((r, _), (s, _)) = guard("sync", async { tokio::join!(recv, send) }).await;
    s.unwrap();
    r.unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn send_and_receive_with_and_without_immediate() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let data = cyclic(1, 3000);
    let mut out = client.reg_msgs(4096).unwrap();
    out[..3000].copy_from_slice(&data);
    // Receive into the middle of a region: the bytes land at the start of the range.
    let recv = server.recv(server.reg_msgs(8192).unwrap(), 100..4196);
    let send = client.send(out, ..3000);
    let ((got, inbox), (sent, out)) = guard("send", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!((got.len(), got.imm()), (3000, None));
    assert_eq!(&inbox[100..3100], &data[..]);
    assert!(inbox[..100].iter().chain(&inbox[3100..]).all(|&b| b == 0));

    let recv = server.recv(inbox, ..);
    let send = client.send_with_imm(out, 10..20, 0xdead_beef);
    let ((got, inbox), (sent, _)) = guard("send imm", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    let got = got.unwrap();
    assert_eq!((got.len(), got.imm()), (10, Some(0xdead_beef)));
    assert_eq!((got.op(), got.write_len()), (ReceivedOp::Send, None));
    assert_eq!(&inbox[..10], &data[10..20]);

    // An existing vector, registered by taking ownership, comes back with its contents.
    let vec = cyclic(9, 777);
    let region = client.register(vec.clone()).unwrap();
    let recv = server.recv(inbox, ..);
    let send = client.send(region, ..);
    let ((got, inbox), (sent, region)) =
        guard("send vec", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(&inbox[..got.unwrap().len()], &vec[..]);
    assert_eq!(region.into_vec(), vec);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_and_reads_reach_the_edges_of_the_remote_region() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    const LEN: usize = 10_000;
    let mut target = server
        .reg_shared(LEN, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    target.write_at(0, &cyclic(3, LEN)).unwrap();
    let ((), remote) = tokio::join!(advertise(&server, &target), learn(&client));
    assert_eq!(remote.len() as usize, LEN);

    // Read all of it, then its first and last bytes.
    let (r, buf) = client
        .read(client.reg_msgs(LEN).unwrap(), .., remote.whole())
        .await;
    r.unwrap();
    assert_eq!(&buf[..], &cyclic(3, LEN)[..]);
    let (r, buf) = client
        .read(buf, 0..1, remote.slice(LEN as u32 - 1, 1).unwrap())
        .await;
    r.unwrap();
    assert_eq!(buf[0], cyclic(3, LEN)[LEN - 1]);

    // Write the first byte, the last byte and the last 100 bytes.
    let mut src = client.reg_msgs(LEN).unwrap();
    src.copy_from_slice(&cyclic(50, LEN));
    let (r, src) = client.write(src, 0..1, remote.slice(0, 1).unwrap()).await;
    r.unwrap();
    let (r, src) = client
        .write(src, 1..2, remote.slice(LEN as u32 - 1, 1).unwrap())
        .await;
    r.unwrap();
    let (r, src) = client
        .write(src, 200..300, remote.slice(LEN as u32 - 100, 100).unwrap())
        .await;
    r.unwrap();
    // With immediate: the server's receive reports it once the data is there.
    let recv = server.recv_imm();
    let write = client.write_with_imm(src, 5000..5010, remote.slice(5000, 10).unwrap(), 77);
    let (got, (w, src)) = guard("write imm", async { tokio::join!(recv, write) }).await;
    w.unwrap();
    let got = got.unwrap();
    assert_eq!(got.op(), ReceivedOp::RdmaWriteWithImm);
    assert_eq!(
        (got.imm(), got.len(), got.write_len()),
        (Some(77), 0, Some(10))
    );
    // A receive with a buffer smaller than the write: the write's bytes went to the region,
    // none into the buffer, so `len` stays within it (it used to be the write's length, and
    // the documented `&buf[..got.len()]` panicked).
    let inbox = server.reg_msgs(4).unwrap();
    let recv = server.recv(inbox, ..);
    let write = client.write_with_imm(src, 5000..5010, remote.slice(5000, 10).unwrap(), 78);
    let ((got, inbox), (w, _src)) = guard("write imm into a receive with a buffer", async {
        tokio::join!(recv, write)
    })
    .await;
    w.unwrap();
    let got = got.unwrap();
    assert_eq!(
        (got.op(), got.imm(), got.write_len()),
        (ReceivedOp::RdmaWriteWithImm, Some(78), Some(10))
    );
    assert!(
        got.len() <= inbox.len(),
        "{} bytes in a 4-byte buffer",
        got.len()
    );
    assert!(inbox[..got.len()].is_empty());

    let mut expect = cyclic(3, LEN);
    let new = cyclic(50, LEN);
    expect[0] = new[0];
    expect[LEN - 1] = new[1];
    expect[LEN - 100..].copy_from_slice(&new[200..300]);
    expect[5000..5010].copy_from_slice(&new[5000..5010]);
    assert_eq!(target.to_vec(), expect);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_ranges_are_rejected_before_posting() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let target = server.reg_write(100).unwrap();
    let remote = target.remote();
    assert_eq!(
        remote.slice(99, 2).unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    let buf = client.reg_msgs(200).unwrap();
    // Longer than the remote slice.
    let (r, buf) = client.write(buf, ..101, remote.whole()).await;
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    // Outside the local region.
    let (r, buf) = client.write(buf, 150..201, remote.whole()).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
    assert!(e.to_string().contains("outside the 200-byte region"), "{e}");
    // A region of another device context (protection domain); the server's, in the same
    // shared context, would be fine.
    let other = rdma_async::device::DeviceContext::open(client.device_name()).unwrap();
    let (r, _) = client.send(other.reg_msgs(8).unwrap(), ..).await;
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("another device context"), "{e}");
    // Atomics on unaligned words.
    let (r, _) = client
        .fetch_and_add(buf, 0, remote.slice(4, 8).unwrap(), 1)
        .await;
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);
    // The connection is still fine.
    let (r, _) = client
        .write(client.reg_msgs(100).unwrap(), .., remote.whole())
        .await;
    r.unwrap();
}

/// A write past the end of the peer's region (a forged descriptor) fails on that operation with
/// PermissionDenied; operations after it fail too, clearly, and nothing hangs.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn access_outside_the_remote_region_is_a_remote_access_error() {
    /// `IBV_WC_REM_ACCESS_ERR`.
    const REM_ACCESS_ERR: u32 = 10;
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let target = server.reg_write(4096).unwrap();
    let real = target.remote();
    let forged = RemoteRegion::new(real.addr(), real.len() + 8, real.rkey()).unwrap();
    let (r, buf) = guard(
        "write past the end",
        client.write(
            client.reg_msgs(8).unwrap(),
            ..,
            forged.slice(4096, 8).unwrap(),
        ),
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("remote access error"), "{e}");
    // The status survives every later report (the error keeps its cause).
    assert_eq!(completion_status(&e), REM_ACCESS_ERR, "{e}");
    let (r, mut buf) = guard(
        "write after the error",
        client.write(buf, .., real.slice(0, 8).unwrap()),
    )
    .await;
    let e = r.unwrap_err();
    assert!(e.to_string().contains("failed earlier"), "{e}");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert_eq!(completion_status(&e), REM_ACCESS_ERR, "{e}");
    for _ in 0..2 {
        let (r, back) = guard("send after the error", client.send(buf, ..)).await;
        buf = back;
        let again = r.unwrap_err();
        assert_eq!(again.kind(), io::ErrorKind::PermissionDenied, "{again}");
        assert!(again.to_string().contains("failed earlier"), "{again}");
        assert_eq!(completion_status(&again), REM_ACCESS_ERR, "{again}");
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_rkey_is_a_remote_access_error() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let target = server.reg_read(4096).unwrap();
    let real = target.remote();
    let forged = RemoteRegion::new(real.addr(), real.len(), real.rkey() ^ 0x5a5a_0000).unwrap();
    let (r, _) = guard(
        "read with a wrong rkey",
        client.read(
            client.reg_msgs(64).unwrap(),
            ..,
            forged.slice(0, 64).unwrap(),
        ),
    )
    .await;
    let e = r.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    // Writing a region registered only for reads is refused the same way (on a new connection:
    // the error above ended this one).
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let read_only = server.reg_read(64).unwrap();
    let (r, _) = guard(
        "write to a read-only region",
        client.write(client.reg_msgs(64).unwrap(), .., read_only.remote().whole()),
    )
    .await;
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::PermissionDenied);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn atomics_compare_and_swap_and_fetch_and_add() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let mut word = server
        .reg_shared(16, RemoteAccess::ATOMIC | RemoteAccess::READ)
        .unwrap();
    word.write_at(8, &100u64.to_ne_bytes()).unwrap();
    let remote = word.remote().slice(8, 8).unwrap();
    let result = client.reg_msgs(8).unwrap();
    if !client.supports_atomics() {
        let (r, _) = client.fetch_and_add(result, 0, remote, 1).await;
        assert_eq!(r.unwrap_err().kind(), io::ErrorKind::Unsupported);
        return;
    }
    let (old, result) = client.fetch_and_add(result, 0, remote, 5).await;
    assert_eq!(old.unwrap(), 100);
    assert_eq!(u64::from_ne_bytes(result[..8].try_into().unwrap()), 100);
    // A compare that fails leaves the word alone; one that matches swaps.
    let (old, result) = client.compare_and_swap(result, 0, remote, 1, 7).await;
    assert_eq!(old.unwrap(), 105);
    let (old, _) = client.compare_and_swap(result, 0, remote, 105, 7).await;
    assert_eq!(old.unwrap(), 105);
    sync(&client, &server).await;
    let mut now = [0; 8];
    word.read_at(8, &mut now).unwrap();
    assert_eq!(u64::from_ne_bytes(now), 7);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_sends_receives_writes_and_reads() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let parts: Vec<LocalRegion> = (0..3)
        .map(|i| {
            let mut r = client.reg_msgs(100).unwrap();
            r.copy_from_slice(&cyclic(i, 100));
            r
        })
        .collect();
    let gather: Vec<_> = parts.into_iter().map(|r| (r, 10..60)).collect();
    let scatter = vec![
        (server.reg_msgs(70).unwrap(), 0..70),
        (server.reg_msgs(200).unwrap(), 100..200),
    ];
    let ((got, inbox), (sent, parts)) = guard("vectored send", async {
        tokio::join!(server.recv_vectored(scatter), client.send_vectored(gather))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().len(), 150);
    let expect: Vec<u8> = (0..3)
        .flat_map(|i| cyclic(i, 100)[10..60].to_vec())
        .collect();
    let mut arrived = inbox[0][..70].to_vec();
    arrived.extend_from_slice(&inbox[1][100..180]);
    assert_eq!(arrived, expect);

    let target = server
        .reg_shared(150, RemoteAccess::READ | RemoteAccess::WRITE)
        .unwrap();
    let gather: Vec<_> = parts.into_iter().map(|r| (r, 10..60)).collect();
    let (w, parts) = client.write_vectored(gather, target.remote().whole()).await;
    w.unwrap();
    let scatter: Vec<_> = parts.into_iter().map(|r| (r, 0..50)).collect();
    let (r, parts) = client.read_vectored(scatter, target.remote().whole()).await;
    r.unwrap();
    let read: Vec<u8> = parts.iter().flat_map(|p| p[..50].to_vec()).collect();
    assert_eq!(read, expect);
    assert_eq!(target.to_vec(), expect);
}

/// 1000 writes and 1000 sends in flight at once through a send queue of 4 (and 1000 receives
/// through 32 receive slots): the extra operations wait for a slot (no error), and every one lands.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_thousand_operations_through_a_small_queue() {
    const N: usize = 1000;
    let opts = RdmaOptions::new().send_depth(4).recv_depth(32);
    let (server, client) = rdma_pair(&opts).await;
    let (server, client) = (Arc::new(server), Arc::new(client));
    let target = server.reg_write(N * 8).unwrap();
    let remote = target.remote();

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..N {
        let client = client.clone();
        tasks.spawn(async move {
            let mut buf = client.reg_msgs(8).unwrap();
            buf.copy_from_slice(&(i as u64 * 3 + 1).to_be_bytes());
            let (r, _) = client
                .write(buf, .., remote.slice(i as u32 * 8, 8).unwrap())
                .await;
            r.unwrap();
        });
    }
    guard("1000 writes", async {
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    })
    .await;
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for i in 0..N {
        let v = u64::from_be_bytes(bytes[i * 8..i * 8 + 8].try_into().unwrap());
        assert_eq!(v, i as u64 * 3 + 1, "write {i}");
    }

    // Sends: 1000 receives wait for one of the server's 32 receive slots (backpressure on that
    // side too); 32 posted receives stay ahead of 4 sends, so no send meets an empty queue.
    let mut receivers = tokio::task::JoinSet::new();
    for _ in 0..N {
        let server = server.clone();
        receivers.spawn(async move {
            let (got, buf) = server.recv(server.reg_msgs(8).unwrap(), ..).await;
            assert_eq!(got.unwrap().len(), 8);
            u64::from_be_bytes(buf[..8].try_into().unwrap()) as usize
        });
    }
    for i in 0..N {
        let client = client.clone();
        tasks.spawn(async move {
            let mut buf = client.reg_msgs(8).unwrap();
            buf.copy_from_slice(&(i as u64).to_be_bytes());
            let (r, _) = client.send(buf, ..).await;
            r.unwrap();
        });
    }
    guard("1000 sends", async {
        while let Some(t) = tasks.join_next().await {
            t.unwrap();
        }
    })
    .await;
    let mut seen = vec![false; N];
    guard("1000 receives", async {
        while let Some(i) = receivers.join_next().await {
            let i = i.unwrap();
            assert!(!seen[i], "message {i} twice");
            seen[i] = true;
        }
    })
    .await;
    assert!(seen.iter().all(|&s| s), "every message arrived");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_disconnect_fails_outstanding_receives() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let recv = server.recv(server.reg_msgs(64).unwrap(), ..);
    let close = async {
        tokio::task::yield_now().await;
        client.close().await;
    };
    let ((got, _), ()) = guard("receive across a disconnect", async {
        tokio::join!(recv, close)
    })
    .await;
    let e = got.unwrap_err();
    assert!(
        matches!(
            e.kind(),
            io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
        ),
        "{e}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_sends_and_writes_go_inline_and_arrive_intact() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let limit = client.max_inline() as usize;
    assert_eq!(
        limit, 64,
        "the default asks for 64 inline bytes; Soft-RoCE grants more"
    );
    let target = server.reg_write(2 * limit + 1 + 4096).unwrap();
    let ((), remote) = tokio::join!(advertise(&server, &target), learn(&client));
    let before = client.inline_sends();

    // A send and a write of exactly the limit go inline; one byte more and a 4 KiB write do not.
    let mut msg = client.reg_msgs(limit + 1).unwrap();
    msg.copy_from_slice(&cyclic(9, limit + 1));
    let recv = server.recv(server.reg_msgs(limit + 1).unwrap(), ..);
    let ((got, inbox), (sent, msg)) = guard("inline send", async {
        tokio::join!(recv, client.send(msg, ..limit))
    })
    .await;
    sent.unwrap();
    assert_eq!(&inbox[..got.unwrap().len()], &cyclic(9, limit + 1)[..limit]);
    let (w, msg) = client
        .write(msg, .., remote.slice(0, limit as u32 + 1).unwrap())
        .await;
    w.unwrap();
    let (w, msg) = client
        .write(
            msg,
            ..limit,
            remote.slice(limit as u32 + 1, limit as u32).unwrap(),
        )
        .await;
    w.unwrap();
    let mut big = client.reg_msgs(4096).unwrap();
    big.copy_from_slice(&cyclic(10, 4096));
    let (w, _big) = client
        .write(big, .., remote.slice(2 * limit as u32 + 1, 4096).unwrap())
        .await;
    w.unwrap();
    sync(&client, &server).await;
    // The 1-byte sync message went inline too.
    assert_eq!(client.inline_sends() - before, 3);

    let mut expect = cyclic(9, limit + 1);
    expect.extend_from_slice(&cyclic(9, limit + 1)[..limit]);
    expect.extend_from_slice(&cyclic(10, 4096));
    assert_eq!(&target.to_vec()[..expect.len()], &expect[..]);
    drop(msg);

    // Turned off: nothing goes inline.
    let (server, client) = rdma_pair(&RdmaOptions::new().max_inline(0)).await;
    assert_eq!(client.max_inline(), 0);
    sync(&client, &server).await;
    assert_eq!(client.inline_sends(), 0);
}

/// A receive dropped while it waits for a message: the message completes its work request, and
/// the connection's own task reaps that completion (nobody else polls for it), which gives the
/// one receive slot back; the next receive gets the next message, intact.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_receive_gives_its_slot_back_when_its_message_comes() {
    let (server, client) = rdma_pair(&RdmaOptions::new().recv_depth(1)).await;
    {
        let mut recv = std::pin::pin!(server.recv(server.reg_msgs(8).unwrap(), ..));
        // Posted and waiting (its busy-poll window passes within this first poll).
        let pending =
            std::future::poll_fn(|cx| Poll::Ready(recv.as_mut().poll(cx).is_pending())).await;
        assert!(pending, "a receive completed before anything was sent");
    }
    let send = |n: u64| {
        let mut msg = client.reg_msgs(8).unwrap();
        msg.copy_from_slice(&n.to_le_bytes());
        async {
            let (sent, _) = client.send(msg, ..).await;
            sent.unwrap();
        }
    };
    // The dropped receive takes message 1; the next waits for its slot, then takes message 2.
    guard("the first send", send(1)).await;
    let next = server.recv(server.reg_msgs(8).unwrap(), ..);
    let ((got, buf), ()) = guard("the next receive", async { tokio::join!(next, send(2)) }).await;
    assert_eq!(got.unwrap().len(), 8);
    assert_eq!(u64::from_le_bytes(buf[..8].try_into().unwrap()), 2);
}
