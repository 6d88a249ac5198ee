//! Device contexts: one protection domain per device shared by default, so a region registered
//! through one connection serves another; explicit contexts isolate; misuse is a clear error.

use std::io;

use rdma_async::device::DeviceContext;
use rdma_async::rdma::{RdmaConnection, RdmaOptions, SharedReceiveQueue};
use rdma_async_device_tests::pairs::rdma_pair_on;
use rdma_async_device_tests::{err_kind, guard, listener, rdma_pair, test_ip};

/// Sends `payload` from `from` (in `region`, which may come from any connection's context) and
/// receives it on `to`; returns what arrived.
async fn send_through(
    from: &RdmaConnection,
    to: &RdmaConnection,
    region: rdma_async::rdma::LocalRegion,
) -> Vec<u8> {
    let len = region.len();
    let inbox = to.reg_msgs(len).unwrap();
    let ((got, inbox), (sent, _)) = guard("send across connections", async {
        tokio::join!(to.recv(inbox, ..), from.send(region, ..))
    })
    .await;
    sent.unwrap();
    let got = got.unwrap();
    inbox[..got.len()].to_vec()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_share_their_devices_context_by_default() {
    let (server_a, client_a) = rdma_pair(&RdmaOptions::new()).await;
    let (server_b, client_b) = rdma_pair(&RdmaOptions::new()).await;
    let shared = DeviceContext::shared(client_a.device_name()).unwrap();
    for conn in [&server_a, &client_a, &server_b, &client_b] {
        assert_eq!(
            conn.context(),
            shared,
            "every connection is in the shared context"
        );
    }
    assert_eq!(shared.device_name(), client_a.device_name());
    assert_eq!(
        DeviceContext::for_local_addr(test_ip()).unwrap(),
        shared,
        "the device of the test address has that same shared context"
    );
    // Registered through connection A, sent on connection B.
    let mut region = client_a.reg_msgs(11).unwrap();
    region.copy_from_slice(b"hello via B");
    assert_eq!(
        send_through(&client_b, &server_b, region).await,
        b"hello via B"
    );
    // Registered through the context itself, sent on A.
    let mut region = shared.reg_msgs(6).unwrap();
    region.copy_from_slice(b"ctx->A");
    assert_eq!(send_through(&client_a, &server_a, region).await, b"ctx->A");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_explicit_context_isolates_its_connections_and_regions() {
    let device = rdma_async::device::devices().unwrap()[0].name().to_owned();
    let private = DeviceContext::open(&device).unwrap();
    assert_ne!(private, DeviceContext::shared(&device).unwrap());
    let listener = listener().await;
    let opts = RdmaOptions::new().context(private.clone());
    let (server, client) = rdma_pair_on(&listener, &opts, &opts).await;
    assert_eq!(client.context(), private);
    assert_eq!(server.context(), private);
    let mut region = private.reg_msgs(7).unwrap();
    region.copy_from_slice(b"private");
    assert_eq!(send_through(&client, &server, region).await, b"private");

    // A region of the shared context on a connection of the private one: refused, and the
    // region comes back intact.
    let mut foreign = DeviceContext::shared(&device).unwrap().reg_msgs(3).unwrap();
    foreign.copy_from_slice(b"abc");
    let (result, foreign) = client.send(foreign, ..).await;
    let (kind, msg) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("another device context"), "{msg}");
    assert!(msg.contains(&device), "the message names the device: {msg}");
    assert_eq!(&foreign[..], b"abc");

    // A shared receive queue of another context than the connection's is refused.
    let srq = SharedReceiveQueue::new(test_ip(), 8).unwrap();
    let mixed = RdmaOptions::new()
        .context(private.clone())
        .shared_receive_queue(&srq);
    let (kind, msg) =
        err_kind(RdmaConnection::connect_with(listener.local_addr().unwrap(), &mixed).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("shared receive queue"), "{msg}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_receive_queue_in_a_context_serves_its_connections() {
    let device = rdma_async::device::devices().unwrap()[0].name().to_owned();
    let context = DeviceContext::open(&device).unwrap();
    let srq = SharedReceiveQueue::in_context(&context, 8).unwrap();
    assert_eq!(srq.context(), context);
    let server_opts = RdmaOptions::new()
        .context(context.clone())
        .shared_receive_queue(&srq);
    let (server, client) = rdma_pair_on(&listener().await, &server_opts, &RdmaOptions::new()).await;
    assert_eq!(server.context(), context);
    let mut msg = client.reg_msgs(4).unwrap();
    msg.copy_from_slice(b"srq!");
    let inbox = context.reg_msgs(16).unwrap();
    let ((got, inbox), (sent, _)) = guard("receive through the queue", async {
        tokio::join!(srq.recv(inbox, ..), client.send(msg, ..))
    })
    .await;
    sent.unwrap();
    assert_eq!(&inbox[..got.unwrap().len()], b"srq!");
}

#[rdma_async::test]
async fn an_unknown_device_is_not_found_and_names_the_devices_there_are() {
    let device = rdma_async::device::devices().unwrap()[0].name().to_owned();
    for result in [
        DeviceContext::shared("no-such-device"),
        DeviceContext::open("no-such-device"),
    ] {
        let (kind, msg) = err_kind(result);
        assert_eq!(kind, io::ErrorKind::NotFound, "{msg}");
        assert!(
            msg.contains("\"no-such-device\"") && msg.contains(&device),
            "{msg}"
        );
    }
    let (kind, msg) = err_kind(DeviceContext::for_local_addr("127.0.0.1".parse().unwrap()));
    assert!(
        matches!(
            kind,
            io::ErrorKind::NotFound | io::ErrorKind::AddrNotAvailable
        ),
        "{kind:?}: {msg}"
    );
}

/// Writes 8 bytes through `writer` (connected to a server in some context) at `target`'s
/// remote address and key, where `target` belongs to another connection's server.
async fn write_with_a_key_of_another_connection(
    writer: &RdmaConnection,
    target: &rdma_async::rdma::SharedRegion,
) -> io::Result<()> {
    let mut buf = writer.reg_msgs(8).unwrap();
    buf.copy_from_slice(b"intruder");
    let remote = target.remote();
    let (r, _) = guard("write with another connection's key", async {
        writer.write(buf, .., remote.slice(0, 8).unwrap()).await
    })
    .await;
    r
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remote_key_works_across_a_shared_context_but_not_across_isolated_ones() {
    // Shared (the default): a key advertised on connection A works through connection B,
    // as with C rsockets' per-device protection domain. This is what `isolated_context` is for.
    let (server_a, _client_a) = rdma_pair(&RdmaOptions::new()).await;
    let (_server_b, client_b) = rdma_pair(&RdmaOptions::new()).await;
    let target = server_a.reg_write(8).unwrap();
    write_with_a_key_of_another_connection(&client_b, &target)
        .await
        .unwrap();
    assert_eq!(target.to_vec(), b"intruder");

    // Isolated: each connection has its own protection domain; the same write is refused by the
    // device, and the region is untouched.
    let isolated = RdmaOptions::new().isolated_context(true);
    let (server_a, _client_a) = rdma_pair(&isolated).await;
    let (server_b, client_b) = rdma_pair(&isolated).await;
    assert_ne!(server_a.context(), server_b.context());
    assert_ne!(server_b.context(), client_b.context());
    let target = server_a.reg_write(8).unwrap();
    let (kind, msg) = err_kind(write_with_a_key_of_another_connection(&client_b, &target).await);
    assert_eq!(kind, io::ErrorKind::PermissionDenied, "{msg}");
    assert!(msg.contains("remote access error"), "{msg}");
    assert_eq!(target.to_vec(), [0; 8]);
}
