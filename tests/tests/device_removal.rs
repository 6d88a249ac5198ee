//! The RDMA device removed under live connections (`rdma link delete`): every pending and later
//! operation ends with a clear error (never `Ok(0)`, never a hang), the delete completes once the
//! process that used the device is gone, and after `rdma link add` new connections work.
//!
//! librdmacm keeps its verbs context of a device open for the life of the process, and the
//! kernel finishes a Soft-RoCE delete only when every context is closed: so the connections live
//! in a child process (this binary again, in the `victim` role), and this process, which has not
//! opened the device, waits for the delete, adds the device again and connects.
//!
//! Its own binary, run last by `scripts/device-tests`: it takes the device away from the guest
//! for a while. It needs a Soft-RoCE device it may delete and add again (found through its
//! `parent` netdev) and fails on any other.

use std::io;
use std::time::Duration;

use rdma_async::endpoint::EndpointOptions;
use rdma_async::rdma::RdmaOptions;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::tools::wait_port_state;
use rdma_async_device_tests::{
    datagram, endpoint_pair, guard, rdma_pair, rlistener, stream_pair, test_ip,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

async fn rdma_link(args: &[&str]) -> std::process::Output {
    Command::new("rdma")
        .arg("link")
        .args(args)
        .output()
        .await
        .expect("run the rdma tool")
}

fn assert_device_gone(err: &io::Error, what: &str) {
    assert_eq!(
        err.kind(),
        io::ErrorKind::ConnectionAborted,
        "{what}: {err}"
    );
    assert!(
        err.to_string().contains("device"),
        "{what}: the error says the device went away: {err}"
    );
}

/// A pending operation on the accepting end of a pair whose connecting end is on the same
/// device: rdma_cm tells the connecting end first (it attached to the device first), and the
/// kernel tears that end down on its own, so its disconnect can reach this end before this
/// end's own removal: then this end sees what a vanished peer host gives, the peer's close.
fn assert_removed_here_or_at_peer(err: &io::Error, what: &str) {
    if err.kind() == io::ErrorKind::ConnectionReset {
        assert!(
            err.to_string().contains("closed by"),
            "{what}: the error says the peer closed: {err}"
        );
    } else {
        assert_device_gone(err, what);
    }
}

async fn echo_once(server: &mut RStream, client: &mut RStream) {
    client.write_all(b"after re-add").await.unwrap();
    let mut buf = [0u8; 12];
    server.read_exact(&mut buf).await.unwrap();
    assert_eq!(&buf, b"after re-add");
}

/// Set in the child: play the process whose device is removed under it.
const VICTIM: &str = "RDMA_ASYNC_REMOVAL_VICTIM";

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_device_ends_every_operation_and_a_re_added_device_works() {
    if std::env::var_os(VICTIM).is_some() {
        return victim().await;
    }
    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([
            "--exact",
            "removing_the_device_ends_every_operation_and_a_re_added_device_works",
            "--nocapture",
        ])
        .env(VICTIM, "1")
        .output();
    let out = guard("the victim process", child).await.unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the victim process failed: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let (device, netdev) = stdout
        .lines()
        .find_map(|l| l.strip_prefix("removing device "))
        .and_then(|rest| rest.split_once(" on "))
        .unwrap_or_else(|| panic!("the victim named no device: {stdout}"));

    // The delete the victim started finishes now that the victim is gone.
    let sysfs = format!("/sys/class/infiniband/{device}");
    guard("rdma link delete", async {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        while std::path::Path::new(&sysfs).exists() {
            tick.tick().await;
        }
    })
    .await;

    let added = rdma_link(&["add", device, "type", "rxe", "netdev", netdev]).await;
    assert!(added.status.success(), "rdma link add: {added:?}");
    wait_port_state(device, "ACTIVE").await;
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    echo_once(&mut server, &mut client).await;
}

/// The connections of every kind whose device goes away.
async fn victim() {
    let (mut server, mut client) = stream_pair(RStreamOptions::new()).await;
    let (ep_server, ep_client) = endpoint_pair(&EndpointOptions::new()).await;
    let (rdma_server, rdma_client) = rdma_pair(&RdmaOptions::new()).await;
    let device = rdma_client.device_name().to_owned();
    let netdev = std::fs::read_to_string(format!("/sys/class/infiniband/{device}/parent"))
        .unwrap_or_else(|e| {
            panic!("{device} is not a Soft-RoCE device this test may delete and re-add: {e}")
        });
    println!("removing device {device} on {}", netdev.trim());

    // Operations pending when the device goes.
    let mut buf = [0u8; 16];
    let read = client.read(&mut buf);
    let recv = ep_server.recv();
    let rdma_recv = rdma_server.recv(rdma_server.reg_msgs(64).unwrap(), ..);
    let listener = rlistener().await;
    let accept = listener.accept();
    let socket = datagram(test_ip()).await;
    let mut dgram = [0u8; 64];
    let recv_from = socket.recv_from(&mut dgram);
    // Finishes only after this process exits (see the module's documentation).
    let _delete = Command::new("rdma")
        .args(["link", "delete", &device])
        .spawn()
        .expect("run rdma link delete");
    let (read, recv, (rdma_recv, _), accepted, received) =
        guard("operations pending across the removal", async {
            tokio::join!(read, recv, rdma_recv, accept, recv_from)
        })
        .await;
    let err = accepted.expect_err("a pending accept must fail");
    assert_eq!(err.kind(), io::ErrorKind::NetworkDown, "accept: {err}");
    let err = received.expect_err("a pending recv_from must fail");
    assert_eq!(err.kind(), io::ErrorKind::NetworkDown, "recv_from: {err}");
    assert!(err.to_string().contains("device"), "recv_from: {err}");
    let err = socket
        .send_to(b"x", std::net::SocketAddr::new(test_ip(), 9))
        .await
        .expect_err("a later send_to must fail");
    assert_eq!(err.kind(), io::ErrorKind::NetworkDown, "send_to: {err}");
    assert_device_gone(
        &read.expect_err("a pending read must fail, not read EOF"),
        "read",
    );
    assert_removed_here_or_at_peer(&recv.expect_err("a pending recv must fail"), "recv");
    assert_removed_here_or_at_peer(
        &rdma_recv.expect_err("a pending RDMA recv must fail"),
        "RDMA recv",
    );

    // Every end's removal is queued by now (rdma_cm reached the datagram socket, which attached
    // last): later operations name the removal whichever close they saw first.
    assert_device_gone(
        &client.write(b"x").await.expect_err("a later write"),
        "write",
    );
    assert_device_gone(
        &server
            .read(&mut buf)
            .await
            .expect_err("the other end's read"),
        "peer read",
    );
    assert_device_gone(
        &ep_client.send(b"x").await.expect_err("a later send"),
        "send",
    );
    let (sent, _) = rdma_client.send(rdma_client.reg_msgs(8).unwrap(), ..).await;
    assert_device_gone(&sent.expect_err("a later RDMA send"), "RDMA send");
}
