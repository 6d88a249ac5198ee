//! Memory windows on `RdmaConnection`: a window exposes exactly its range of a region that has
//! no remote access of its own; the peer's writes and reads through it land; an invalidation
//! revokes it (the peer's next access is a remote access error) and gives the region back with
//! what was written; misuse is refused with the region returned.

use std::io;

use rdma_async::rdma::{
    BoundWindow, LocalRegion, RdmaConnection, RdmaOptions, RemoteAccess, RemoteRegion, WindowError,
};
use rdma_async_device_tests::data::cyclic;
use rdma_async_device_tests::{guard, rdma_pair};

/// Sends a window's descriptor as a 16-byte message and receives it on the other side.
async fn hand_over(
    from: &RdmaConnection,
    to: &RdmaConnection,
    remote: RemoteRegion,
) -> RemoteRegion {
    let mut msg = from.reg_msgs(RemoteRegion::ENCODED_LEN).unwrap();
    msg.copy_from_slice(&remote.to_bytes());
    let recv = to.recv(to.reg_msgs(64).unwrap(), ..);
    let send = from.send(msg, ..);
    let ((got, inbox), (sent, _)) = guard("descriptor", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    RemoteRegion::from_bytes(&inbox[..got.unwrap().len()]).unwrap()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_window_grants_its_range_until_it_is_invalidated() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    const LEN: usize = 8192;
    let mut region = server.reg_bindable(LEN).unwrap();
    region.copy_from_slice(&cyclic(1, LEN));
    // The window covers 4096..6096 only, for reads and writes.
    let window = guard(
        "bind",
        server.bind_window(region, 4096..6096, RemoteAccess::READ | RemoteAccess::WRITE),
    )
    .await
    .unwrap();
    let remote = window.remote();
    assert_eq!(remote.len(), 2000);
    let remote = hand_over(&server, &client, remote).await;

    // The peer reads what is there and writes the window's first and last 100 bytes.
    let (r, buf) = guard(
        "read",
        client.read(client.reg_msgs(2000).unwrap(), .., remote.whole()),
    )
    .await;
    r.unwrap();
    assert_eq!(&buf[..], &cyclic(1, LEN)[4096..6096]);
    let mut src = client.reg_msgs(200).unwrap();
    src.copy_from_slice(&cyclic(7, 200));
    let (w, src) = guard(
        "write first",
        client.write(src, ..100, remote.slice(0, 100).unwrap()),
    )
    .await;
    w.unwrap();
    // With immediate, while the server waits for it: its receive says the bytes are there.
    let recv = server.recv_imm();
    let write = client.write_with_imm(src, 100.., remote.slice(1900, 100).unwrap(), 5);
    let (got, (w, src)) = guard("write last", async { tokio::join!(recv, write) }).await;
    w.unwrap();
    assert_eq!(got.unwrap().imm(), Some(5));
    let mut seen = [0u8; 100];
    window.read_at(1900, &mut seen).unwrap();
    assert_eq!(&seen[..], &cyclic(7, 200)[100..]);
    assert!(
        window.read_at(1901, &mut seen).is_err(),
        "read_at past the window"
    );

    // The invalidation ends on the server's side; the region comes back with the peer's bytes.
    let region = guard("invalidate", server.invalidate_window(window))
        .await
        .unwrap();
    let mut expect = cyclic(1, LEN);
    expect[4096..4196].copy_from_slice(&cyclic(7, 200)[..100]);
    expect[5996..6096].copy_from_slice(&cyclic(7, 200)[100..]);
    assert_eq!(&region[..], &expect[..]);
    drop(src);
}

/// Past the end of the window's region the device refuses the peer. (Between the window's
/// range and the region's edges it depends on the device: rxe checks an access through a window
/// against the registration under it, not the window's range; see `bind_window`.)
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_reaches_nothing_past_the_windows_region() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let mut region = server.reg_bindable(4096).unwrap();
    region.fill(0x11);
    let window = guard("bind", server.bind_window(region, .., RemoteAccess::WRITE))
        .await
        .unwrap();
    let remote = hand_over(&server, &client, window.remote()).await;
    // The last byte is the peer's; one byte past it, with the window's key, is refused.
    let mut src = client.reg_msgs(2).unwrap();
    src.fill(0x22);
    let (w, src) = guard(
        "write the last byte",
        client.write(src, ..1, remote.slice(4095, 1).unwrap()),
    )
    .await;
    w.unwrap();
    let beyond = RemoteRegion::new(remote.addr() + 4096, 1, remote.rkey()).unwrap();
    let (w, _src) = guard(
        "write past the region",
        client.write(src, 1.., beyond.whole()),
    )
    .await;
    let e = w.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    // The responder's queue pair may be in the error state now, so the invalidation may fail;
    // the region comes back either way, with the one byte the peer was allowed to write.
    let region = match guard("invalidate", server.invalidate_window(window)).await {
        Ok(region) => region,
        Err(e) => e
            .into_region()
            .expect("a failed invalidation's window was deallocated"),
    };
    assert!(region[..4095].iter().all(|&b| b == 0x11));
    assert_eq!(region[4095], 0x22);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidated_window_refuses_the_peer() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let region = server.reg_bindable(4096).unwrap();
    let window = guard("bind", server.bind_window(region, .., RemoteAccess::WRITE))
        .await
        .unwrap();
    let remote = hand_over(&server, &client, window.remote()).await;
    let mut region = guard("invalidate", server.invalidate_window(window))
        .await
        .unwrap();
    // Only now is the region ours to change: nobody else can write it.
    region.fill(0x5a);
    // The server tells the client the window is gone (a message after the invalidation's
    // completion), and the client's write through the old key fails.
    let recv = client.recv(client.reg_msgs(1).unwrap(), ..);
    let send = server.send(server.reg_msgs(1).unwrap(), ..);
    let ((r, _), (s, _)) = guard("revoked notice", async { tokio::join!(recv, send) }).await;
    s.unwrap();
    r.unwrap();
    let mut src = client.reg_msgs(64).unwrap();
    src.fill(0xee);
    let (w, _) = guard(
        "write through a revoked key",
        client.write(src, .., remote.slice(0, 64).unwrap()),
    )
    .await;
    let e = w.unwrap_err();
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(
        region.iter().all(|&b| b == 0x5a),
        "a revoked window let bytes in"
    );
}

/// The error of a bind that had to fail, and the region it gives back.
fn refused(bind: Result<BoundWindow, WindowError>, what: &str) -> (io::Error, LocalRegion) {
    let (e, region) = bind.expect_err(what).into_parts();
    (e, region.expect("a refused bind gives the region back"))
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn window_misuse_is_refused_and_the_region_comes_back() {
    let (server, _client) = rdma_pair(&RdmaOptions::new()).await;
    // A region registered without window binding.
    let plain = server.reg_msgs(4096).unwrap();
    let (e, plain) = refused(
        server.bind_window(plain, .., RemoteAccess::WRITE).await,
        "a region without MW_BIND",
    );
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("reg_bindable"), "{e}");
    assert_eq!(plain.len(), 4096);
    // Empty and out-of-range windows.
    let region = server.reg_bindable(4096).unwrap();
    let (e, region) = refused(
        server
            .bind_window(region, 10..10, RemoteAccess::WRITE)
            .await,
        "an empty window",
    );
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    let (e, region) = refused(
        server
            .bind_window(region, 4000..4097, RemoteAccess::WRITE)
            .await,
        "a window past the region",
    );
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    // A region of another device context (its own protection domain).
    let other = rdma_async::device::DeviceContext::open(server.device_name())
        .unwrap()
        .reg_bindable(4096)
        .unwrap();
    let (e, _other) = refused(
        guard(
            "foreign bind",
            server.bind_window(other, .., RemoteAccess::WRITE),
        )
        .await,
        "a region of another context",
    );
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    // The connection still works: a valid bind after the refusals succeeds.
    let window = guard("bind", server.bind_window(region, .., RemoteAccess::READ))
        .await
        .unwrap();
    let region = guard("invalidate", server.invalidate_window(window))
        .await
        .unwrap();
    assert_eq!(region.len(), 4096);
}
