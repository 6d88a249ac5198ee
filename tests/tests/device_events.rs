//! A second Soft-RoCE device, chosen by name, and device asynchronous events: `ip link set
//! down`/`up` on its netdev gives `IBV_EVENT_PORT_ERR`/`IBV_EVENT_PORT_ACTIVE` on the event
//! stream and in `Device::port_state`; a queue pair event that breaks a queue pair ends its
//! connection with an error naming the event.
//!
//! Its own binary: it adds a device (rxe1 on a dummy netdev rdma1, 10.77.9.1) and takes its
//! link down and up. librdmacm keeps a device open for the life of a process that used it, and
//! the kernel deletes a Soft-RoCE device only once no process has it open: so the checks run
//! in a child process (this binary again, in the `child` role), and this process, which never
//! opens a device, adds rxe1 before and deletes it after.

use std::io;
use std::net::{IpAddr, SocketAddr};

use rdma_async::__test_hooks::inject_event;
use rdma_async::cm::CmListener;
use rdma_async::datagram::{RDatagram, RDatagramOptions};
use rdma_async::device::{
    DeviceEvent, DeviceEventKind, DeviceEvents, PortState, devices, event_counts, events,
    port_states,
};
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::RdmaOptions;
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::tools::{output_of, wait_port_state};
use rdma_async_device_tests::{endpoint_pair, err_kind, guard, rdma_pair, stream_pair, test_addr};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

const SECOND: &str = "rxe1";
const NETDEV: &str = "rdma1";
const ADDR: &str = "10.77.9.1";
/// Set in the child.
const CHILD: &str = "RDMA_ASYNC_DEVICE_EVENTS_CHILD";

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_device_by_name_and_its_port_events() {
    if std::env::var_os(CHILD).is_some() {
        return child().await;
    }
    output_of("ip", &["link", "add", NETDEV, "type", "dummy"]).await;
    output_of("ip", &["addr", "add", &format!("{ADDR}/24"), "dev", NETDEV]).await;
    output_of("ip", &["link", "set", NETDEV, "up"]).await;
    output_of(
        "rdma",
        &["link", "add", SECOND, "type", "rxe", "netdev", NETDEV],
    )
    .await;
    wait_port_state(SECOND, "ACTIVE").await;

    let exe = std::env::current_exe().unwrap();
    let child = Command::new(exe)
        .args([
            "--exact",
            "a_second_device_by_name_and_its_port_events",
            "--nocapture",
        ])
        .env(CHILD, "1")
        .output()
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&child.stdout);
    let err = String::from_utf8_lossy(&child.stderr);
    println!("{out}");
    eprintln!("{err}");

    // The child is gone, so nothing holds rxe1 open: it can be deleted.
    output_of("rdma", &["link", "delete", SECOND]).await;
    output_of("ip", &["link", "del", NETDEV]).await;
    assert!(child.status.success(), "the child's checks failed: {err}");
    assert!(
        out.contains("test result: ok. 1 passed"),
        "the child ran its checks: {out}"
    );
}

async fn child() {
    second_device_by_name().await;
    port_events().await;
    queue_pair_events_end_connections().await;
    // For the record: every event the devices reported (and the injected ones).
    println!("events counted: {:?}", event_counts());
}

/// rxe1 by name: listening on a wildcard takes its address, a stream dialed through it uses
/// it; an address rdma_cm puts on the other device, and rxe0's address, are refused with rxe1
/// chosen.
async fn second_device_by_name() {
    let addr: IpAddr = ADDR.parse().unwrap();
    let options = RStreamOptions::new().device(SECOND);
    let listener = RListener::bind_with(SocketAddr::new([0, 0, 0, 0].into(), 0), &options)
        .await
        .unwrap();
    let local = listener.local_addr().unwrap();
    assert_eq!(local.ip(), addr, "rxe1's address, not rxe0's");
    let (accepted, connected) = guard("connect through rxe1", async {
        tokio::join!(listener.accept(), RStream::connect_with(local, &options))
    })
    .await;
    let (mut server, _) = accepted.unwrap();
    let mut client = connected.unwrap();
    assert_eq!(client.context().device_name(), SECOND);
    assert_eq!(server.context().device_name(), SECOND);
    client.write_all(b"via rxe1").await.unwrap();
    let mut buf = [0u8; 8];
    guard("read", server.read_exact(&mut buf)).await.unwrap();
    assert_eq!(&buf, b"via rxe1");

    // One address on both netdevs: the GID tables of both devices have it, and rdma_cm binds
    // it to one of them (rxe1 here). Choosing the other is refused once rdma_cm has bound the
    // id, naming both; choosing that one works.
    output_of("ip", &["addr", "add", "10.77.8.1/32", "dev", "rdma0"]).await;
    output_of("ip", &["addr", "add", "10.77.8.1/32", "dev", NETDEV]).await;
    let bind = |choice: Option<&str>| {
        let mut opts = RDatagramOptions::new();
        if let Some(c) = choice {
            opts = opts.device(c);
        }
        async move {
            RDatagram::bind_with("10.77.8.1:0", &opts)
                .await
                .map(|s| s.context().device_name().to_owned())
        }
    };
    let picked = bind(None).await.unwrap();
    let other = if picked == SECOND { "rxe0" } else { SECOND };
    println!("rdma_cm binds an address of both devices to {picked}");
    assert_eq!(bind(Some(&picked)).await.unwrap(), picked);
    let (kind, msg) = err_kind(bind(Some(other)).await);
    assert_eq!(kind, io::ErrorKind::AddrNotAvailable, "{msg}");
    assert!(
        msg.contains(&format!("on RDMA device {picked}"))
            && msg.contains(&format!("not on the chosen RDMA device {other}")),
        "{msg}"
    );
    output_of("ip", &["addr", "del", "10.77.8.1/32", "dev", "rdma0"]).await;
    output_of("ip", &["addr", "del", "10.77.8.1/32", "dev", NETDEV]).await;

    // Accepting with rxe0 chosen a request that came through rxe1 (to a wildcard listener):
    // refused, and the client is told.
    let wildcard = CmListener::bind(SocketAddr::new([0, 0, 0, 0].into(), 0))
        .await
        .unwrap();
    let to_second = SocketAddr::new(addr, wildcard.local_addr().unwrap().port());
    let (on_first, plain) = (
        EndpointOptions::new().device("rxe0"),
        EndpointOptions::new(),
    );
    let (accepted, connected) = guard("accept through the wrong device", async {
        tokio::join!(
            async {
                let request = wildcard.accept_request().await?;
                Endpoint::accept(request, &on_first).await
            },
            Endpoint::connect_with(to_second, &plain)
        )
    })
    .await;
    let (kind, msg) = err_kind(accepted);
    assert_eq!(kind, io::ErrorKind::AddrNotAvailable, "{msg}");
    assert!(msg.contains(SECOND) && msg.contains("rxe0"), "{msg}");
    let (kind, msg) = err_kind(connected);
    assert_eq!(kind, io::ErrorKind::ConnectionRefused, "{msg}");

    // rxe0's address with rxe1 chosen.
    let (kind, msg) = err_kind(RListener::bind_with(test_addr(0), &options).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains(ADDR) && msg.contains(SECOND), "{msg}");

    wrong_device_contexts_and_regions(addr).await;
}

/// A device context, or a region, of rxe0 used on a connection through rxe1: refused before
/// anything reaches the device, naming both devices (the check `rdma_create_qp` would
/// otherwise leave to the provider, and the one every operation makes).
async fn wrong_device_contexts_and_regions(addr: IpAddr) {
    use rdma_async::device::DeviceContext;
    use rdma_async::rdma::RdmaConnection;
    let first = DeviceContext::shared("rxe0").unwrap();
    let listener = CmListener::bind(SocketAddr::new(addr, 0)).await.unwrap();
    let target = listener.local_addr().unwrap();
    // A connect through rxe1 in rxe0's context.
    let (kind, msg) = err_kind(
        RStream::connect_with(target, &RStreamOptions::new().context(first.clone())).await,
    );
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("rxe0") && msg.contains(SECOND), "{msg}");
    // The listener got that attempt's request or none; serve a real connection next.
    let opts = RdmaOptions::new();
    let (accepted, connected) = guard("an RDMA connection through rxe1", async {
        tokio::join!(
            async {
                loop {
                    let request = listener.accept_request().await?;
                    if let Ok(conn) = RdmaConnection::accept(request, &opts).await {
                        return io::Result::Ok(conn);
                    }
                }
            },
            RdmaConnection::connect_with(target, &opts)
        )
    })
    .await;
    let (_server, client) = (accepted.unwrap(), connected.unwrap());
    assert_eq!(client.device_name(), SECOND);
    let region = first.reg_msgs(8).unwrap();
    let (sent, region) = client.send(region, ..).await;
    let (kind, msg) = err_kind(sent);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(
        msg.contains("registered on RDMA device rxe0") && msg.contains(SECOND),
        "{msg}"
    );
    assert_eq!(region.len(), 8, "the refused region comes back");
}

/// Waits for the next event of `kind` on rxe1, returning the events of rxe1 seen before it.
async fn next_of(events: &mut DeviceEvents, kind: DeviceEventKind) -> Vec<DeviceEvent> {
    guard(kind.name(), async {
        let mut seen = Vec::new();
        loop {
            let event = events.recv().await.unwrap();
            if event.device != SECOND {
                continue;
            }
            println!("event: {event}");
            let done = event.kind == kind;
            seen.push(event);
            if done {
                return seen;
            }
        }
    })
    .await
}

/// `ip link set down`/`up` on rxe1's netdev: port error and port active, each on the stream,
/// counted, and in the port's state.
async fn port_events() {
    let device = devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name() == SECOND)
        .unwrap();
    let mut events = events().unwrap();
    assert_eq!(device.port_state(1).unwrap(), PortState::Active);
    let options = RStreamOptions::new().device(SECOND);
    let listener = RListener::bind_with(SocketAddr::new([0, 0, 0, 0].into(), 0), &options)
        .await
        .unwrap();
    let local = listener.local_addr().unwrap();
    let (accepted, connected) = guard("connect through rxe1", async {
        tokio::join!(listener.accept(), RStream::connect_with(local, &options))
    })
    .await;
    let (server, _) = accepted.unwrap();
    let mut client = connected.unwrap();

    output_of("ip", &["link", "set", NETDEV, "down"]).await;
    let seen = next_of(&mut events, DeviceEventKind::PortError).await;
    // What Soft-RoCE does to a connection whose port went down: the write is taken (it only
    // posts), but rxe finds no route out of a down netdev and fails the work request with
    // IBV_WC_LOC_QP_OP_ERR; no queue pair event is raised.
    client.write_all(b"while down").await.unwrap();
    let error = seen.last().unwrap();
    assert_eq!(error.port, Some(1), "{error}");
    assert_eq!(device.port_state(1).unwrap(), PortState::Down);
    let key = (SECOND.to_owned(), 1);
    assert_eq!(port_states().get(&key), Some(&PortState::Down));

    output_of("ip", &["link", "set", NETDEV, "up"]).await;
    let seen = next_of(&mut events, DeviceEventKind::PortActive).await;
    assert_eq!(seen.last().unwrap().port, Some(1));
    assert_eq!(device.port_state(1).unwrap(), PortState::Active);
    assert_eq!(port_states().get(&key), Some(&PortState::Active));
    // The queue pair stays in the error state after the port came back: the stream is broken,
    // and its next read says why (as a TCP connection's error comes with its next call); so
    // does every write after it.
    let mut buf = [0u8; 8];
    let read = guard("read after the port came back", client.read(&mut buf)).await;
    let (kind, text) = err_kind(read);
    assert_eq!(kind, io::ErrorKind::Other, "{text}");
    assert!(text.contains("local QP operation error"), "{text}");
    let (kind, text) = err_kind(client.write_all(b"after up!!").await);
    assert_eq!(kind, io::ErrorKind::Other, "write: {text}");
    assert!(text.contains("local QP operation error"), "write: {text}");
    drop(server);

    let counts = event_counts();
    for kind in [DeviceEventKind::PortError, DeviceEventKind::PortActive] {
        assert!(
            counts.get(&(SECOND.to_owned(), kind)).copied().unwrap_or(0) >= 1,
            "{kind} counted: {counts:?}"
        );
    }
    let (kind, msg) = err_kind(device.port_state(2));
    assert_eq!(kind, io::ErrorKind::NotFound, "{msg}");
}

/// `IBV_EVENT_QP_FATAL` for a connection's queue pair ends that connection with an error that
/// names the event (Soft-RoCE raises no queue pair events of its own, so the event is handed
/// to the same dispatch the reader uses), and leaves other connections alone.
async fn queue_pair_events_end_connections() {
    let mut events = events().unwrap();
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let (_other_server, other) = endpoint_pair(&EndpointOptions::new()).await;
    inject_event(
        client.device_name(),
        DeviceEventKind::QpFatal,
        None,
        Some(client.qp_num()),
    )
    .unwrap();
    let event = guard("the event", async {
        loop {
            let event = events.recv().await.unwrap();
            if event.kind == DeviceEventKind::QpFatal {
                return event;
            }
        }
    })
    .await;
    assert_eq!(event.qp_num, Some(client.qp_num()));

    let msg = client.reg_msgs(4).unwrap();
    let (result, _) = guard("send on the broken connection", client.send(msg, ..)).await;
    let (kind, text) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::ConnectionAborted, "{text}");
    assert!(
        text.contains("IBV_EVENT_QP_FATAL"),
        "names the event: {text}"
    );
    drop(server);

    // An Endpoint with a receive waiting when the event comes: the receive ends with it, and
    // so does a later send.
    let (_endpoint_server, endpoint) = endpoint_pair(&EndpointOptions::new()).await;
    let qp = endpoint.qp_num();
    let device = client.device_name().to_owned();
    let (received, ()) = guard("a receive waiting across the event", async {
        tokio::join!(endpoint.recv(), async {
            tokio::task::yield_now().await;
            inject_event(&device, DeviceEventKind::QpFatal, None, Some(qp)).unwrap();
        })
    })
    .await;
    let (kind, text) = err_kind(received);
    assert_eq!(kind, io::ErrorKind::ConnectionAborted, "{text}");
    assert!(
        text.contains("IBV_EVENT_QP_FATAL"),
        "names the event: {text}"
    );
    let (kind, text) = err_kind(endpoint.send(b"late").await);
    assert_eq!(kind, io::ErrorKind::ConnectionAborted, "{text}");
    assert!(
        text.contains("IBV_EVENT_QP_FATAL"),
        "names the event: {text}"
    );

    // A stream with a read waiting when the event comes: the read fails (never EOF) naming
    // the event, and so does a later write.
    let (_stream_server, mut stream) = stream_pair(RStreamOptions::new()).await;
    let qp = stream.qp_num();
    let mut buf = [0u8; 4];
    let (read, ()) = guard("a read waiting across the event", async {
        tokio::join!(stream.read(&mut buf), async {
            tokio::task::yield_now().await;
            inject_event(&device, DeviceEventKind::QpFatal, None, Some(qp)).unwrap();
        })
    })
    .await;
    println!("pending RStream::read: {read:?}");
    let (kind, text) = err_kind(read);
    assert_eq!(kind, io::ErrorKind::ConnectionAborted, "{text}");
    assert!(
        text.contains("IBV_EVENT_QP_FATAL"),
        "names the event: {text}"
    );
    let written = stream.write_all(b"late").await;
    println!("RStream::write_all after: {written:?}");
    let (kind, text) = err_kind(written);
    assert_eq!(kind, io::ErrorKind::ConnectionAborted, "{text}");

    // Another connection goes on.
    other.send(b"still here").await.unwrap();
}
