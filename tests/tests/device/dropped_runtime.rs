//! Objects used after the Tokio runtime they were created on was shut down: created on runtime
//! A, used on runtime B after A was dropped. Nothing hangs: objects with a background task on A
//! (`RdmaConnection`, `RDatagram`) end every operation with a clear error; the others fail, with
//! the same kind of error, as soon as they must wait (A's reactor watched their channels).

use std::io;

use rdma_async::endpoint::EndpointOptions;
use rdma_async::rdma::RdmaOptions;
use rdma_async::stream::RStreamOptions;
use rdma_async_device_tests::{
    datagram, endpoint_pair, guard, poll_once, rdma_pair, stream_pair, test_ip,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::runtime::Runtime;

fn runtime_a() -> Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime A")
}

fn runtime_b() -> Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime B")
}

#[track_caller]
fn assert_runtime_gone(what: &str, err: &io::Error) {
    assert_eq!(
        err.kind(),
        io::ErrorKind::ConnectionAborted,
        "{what}: {err}"
    );
    assert!(
        err.to_string().contains("runtime") && err.to_string().contains("shut down"),
        "{what} does not say that its runtime was shut down: {err}"
    );
}

/// A receive pending on runtime B when A (which runs the connection's completion task) is
/// dropped ends with that cause and its buffer; later operations are refused with it.
#[test]
fn rdma_connection_of_a_dropped_runtime_ends_its_operations() {
    let a = runtime_a();
    let (server, client) = a.block_on(rdma_pair(&RdmaOptions::new()));
    runtime_b().block_on(async move {
        let mut buf = client.reg_msgs(64).unwrap();
        buf.fill(0x5a);
        let mut recv = std::pin::pin!(client.recv(buf, ..));
        assert!(
            poll_once(recv.as_mut()).await.is_pending(),
            "nothing was sent"
        );
        // Dropped on a thread outside any runtime, as an application's main would.
        let dropper = std::thread::spawn(move || drop(a));
        let (r, buf) = guard("the pending receive to end", recv).await;
        dropper.join().expect("dropping runtime A");
        assert_runtime_gone("the pending receive", &r.expect_err("runtime A is gone"));
        assert!(buf.iter().all(|&b| b == 0x5a), "the receive buffer changed");
        let (sent, _) = guard("a later send", client.send(buf, ..)).await;
        assert_runtime_gone("a later send", &sent.expect_err("runtime A is gone"));
        let msg = server.register(b"late".to_vec()).unwrap();
        let (sent, _) = guard("the server's send", server.send(msg, ..)).await;
        assert_runtime_gone("the server's send", &sent.expect_err("runtime A is gone"));
    });
}

/// A datagram socket's responder task runs on A: once A is gone, its receives and sends fail.
#[test]
fn datagram_socket_of_a_dropped_runtime_fails_its_operations() {
    let a = runtime_a();
    let socket = a.block_on(datagram(test_ip()));
    let peer = socket.local_addr().expect("local address");
    drop(a);
    runtime_b().block_on(async move {
        let mut buf = [0u8; 64];
        let r = guard("a receive", socket.recv_from(&mut buf)).await;
        assert_runtime_gone("a receive", &r.expect_err("runtime A is gone"));
        let r = guard("a send", socket.send_to(b"x", peer)).await;
        assert_runtime_gone("a send", &r.expect_err("runtime A is gone"));
    });
}

/// A runtime dropped before the socket's responder task ever ran (a current-thread runtime
/// runs spawned tasks only while its `block_on` waits, and `bind` returns right after spawning
/// it): the socket still learns that its task is gone. The task's guard used to be made at
/// its first poll, so this send waited for an answer nobody would give.
#[test]
fn datagram_socket_whose_task_never_ran_fails_its_operations() {
    let a = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime A");
    let socket = a.block_on(datagram(test_ip()));
    let peer = socket.local_addr().expect("local address");
    drop(a);
    runtime_b().block_on(async move {
        let r = guard("a send", socket.send_to(b"x", peer)).await;
        assert_runtime_gone("a send", &r.expect_err("runtime A is gone"));
        let mut buf = [0u8; 8];
        let r = guard("a receive", socket.recv_from(&mut buf)).await;
        assert_runtime_gone("a receive", &r.expect_err("runtime A is gone"));
    });
}

/// An `RStream` has no task of its own: on B it keeps working as long as nothing needs to wait
/// (a write with room, a read of bytes already there); a wait needs A's reactor and fails,
/// saying so.
#[test]
fn rstream_of_a_dropped_runtime_works_until_it_must_wait() {
    let a = runtime_a();
    let (mut server, mut client) = a.block_on(stream_pair(RStreamOptions::new()));
    drop(a);
    runtime_b().block_on(async move {
        guard("a write", client.write_all(b"hello"))
            .await
            .expect("a write with room needs no wait");
        let mut buf = [0u8; 5];
        // The bytes may need a wait to arrive: then the read fails as below.
        match guard("a read", server.read_exact(&mut buf)).await {
            Ok(_) => assert_eq!(&buf, b"hello"),
            Err(e) => assert_runtime_gone("a read", &e),
        }
        let r = guard("a read of nothing", server.read(&mut buf)).await;
        assert_runtime_gone("a read that must wait", &r.expect_err("runtime A is gone"));
    });
}

/// An `Endpoint` checks its connection's rdma_cm channel, through A's reactor, before a send
/// and while it waits for a receive: both fail on B, saying why.
#[test]
fn endpoint_of_a_dropped_runtime_fails_its_operations() {
    let a = runtime_a();
    let (server, client) = a.block_on(endpoint_pair(&EndpointOptions::new()));
    drop(a);
    runtime_b().block_on(async move {
        let r = guard("a send", client.send(b"hello")).await;
        assert_runtime_gone("a send", &r.expect_err("runtime A is gone"));
        let r = guard("a receive", server.recv()).await;
        assert_runtime_gone("a receive", &r.expect_err("runtime A is gone"));
    });
}
