//! Choosing the device, port and GID index on dial and bind (`device(...)` on the options,
//! `CmListener::bind_with`), with the errors for unknown names and contradicting
//! addresses. The second-device cases (a device other than the default one) are in
//! `tests/tests/device_events.rs`, which adds that device.

use std::io;
use std::net::{IpAddr, SocketAddr};

use rdma_async::cm::{CmListener, ListenerOptions};
use rdma_async::datagram::{RDatagram, RDatagramOptions};
use rdma_async::device::{DeviceChoice, DeviceContext, devices};
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::{err_kind, guard, test_addr, test_ip, test_ip6};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The device of the test address (rxe0 in the Soft-RoCE guest).
fn device_name() -> String {
    DeviceContext::for_local_addr(test_ip())
        .unwrap()
        .device_name()
        .to_owned()
}

/// The GID index of `ip` on the test device's port 1.
fn gid_index_of(ip: IpAddr) -> u32 {
    let name = device_name();
    let device = devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name() == name)
        .expect("the test device");
    let ports = device.ports().unwrap();
    ports[0]
        .gids
        .iter()
        .find(|g| g.ip == Some(ip))
        .unwrap_or_else(|| panic!("no GID of {ip} on {name}: {ports:?}"))
        .index
}

fn any_v4(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::from([0, 0, 0, 0]), port)
}

fn any_v6(port: u16) -> SocketAddr {
    SocketAddr::new(IpAddr::from([0u16; 8]), port)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_listen_and_dial_by_device_name() {
    let device = device_name();
    let device = device.as_str();
    let options = RStreamOptions::new().device(device);
    // A wildcard address with a device: the device's IPv4 address, the wildcard's port.
    let listener = RListener::bind_with(any_v4(0), &options).await.unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(
        addr.ip(),
        test_ip(),
        "the listener took the device's IPv4 address"
    );
    assert_ne!(addr.port(), 0);
    let ((accepted, connected), ()) = guard("connect by device name", async {
        (
            tokio::join!(listener.accept(), RStream::connect_with(addr, &options)),
            (),
        )
    })
    .await;
    let (mut server, _) = accepted.unwrap();
    let mut client = connected.unwrap();
    assert_eq!(client.local_addr().unwrap().ip(), test_ip());
    assert_eq!(client.context().device_name(), device);
    client.write_all(b"by name").await.unwrap();
    let mut buf = [0u8; 7];
    guard("read", server.read_exact(&mut buf)).await.unwrap();
    assert_eq!(&buf, b"by name");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoints_and_rdma_connections_dial_by_device_port_and_gid_index() {
    let device = device_name();
    let device = device.as_str();
    let v6 = gid_index_of(test_ip6());
    let choice = DeviceChoice::new(device).port(1).gid_index(v6);
    // A listener on the IPv6 GID, chosen by index; its address is that GID's.
    let listener = CmListener::bind_with(any_v6(0), &ListenerOptions::new().device(choice.clone()))
        .await
        .unwrap();
    assert_eq!(listener.local_addr().unwrap().ip(), test_ip6());
    let addr = listener.local_addr().unwrap();

    let opts = EndpointOptions::new().device(choice.clone());
    let (server, client) = guard("endpoint by GID index", async {
        tokio::join!(
            async { Endpoint::accept(listener.accept_request().await?, &opts).await },
            Endpoint::connect_with(addr, &opts)
        )
    })
    .await;
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_eq!(
        client.local_addr().unwrap().ip(),
        test_ip6(),
        "GID {v6}'s address"
    );
    client.send(b"gid").await.unwrap();
    assert_eq!(&guard("recv", server.recv()).await.unwrap()[..], b"gid");

    let opts = RdmaOptions::new().device(choice.clone());
    let (server, client) = guard("RdmaConnection by GID index", async {
        tokio::join!(
            async { RdmaConnection::accept(listener.accept_request().await?, &opts).await },
            RdmaConnection::connect_with(addr, &opts)
        )
    })
    .await;
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_eq!(client.local_addr().unwrap().ip(), test_ip6());
    assert_eq!(client.device_name(), device);
    assert_eq!(server.device_name(), device);

    // The IPv4 GID by index for a datagram socket on a wildcard.
    let v4 = gid_index_of(test_ip());
    let socket = RDatagram::bind_with(
        any_v4(0),
        &RDatagramOptions::new().device(DeviceChoice::new(device).gid_index(v4)),
    )
    .await
    .unwrap();
    assert_eq!(socket.local_addr().unwrap().ip(), test_ip());
}

/// Asserts `NotFound` with a message naming `wanted` and what there is (`exists`).
fn assert_not_found<T: std::fmt::Debug>(result: io::Result<T>, wanted: &str, exists: &str) {
    let (kind, msg) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::NotFound, "{msg}");
    assert!(msg.contains(wanted), "the message names {wanted:?}: {msg}");
    assert!(msg.contains(exists), "the message names {exists:?}: {msg}");
}

#[rdma_async::test]
async fn an_unknown_device_port_or_gid_is_not_found_naming_what_exists() {
    let device = device_name();
    let device = device.as_str();
    let target = test_addr(4791);
    let nope = "mlx5_9";
    assert_not_found(
        RStream::connect_with(target, &RStreamOptions::new().device(nope)).await,
        nope,
        device,
    );
    assert_not_found(
        Endpoint::connect_with(target, &EndpointOptions::new().device(nope)).await,
        nope,
        device,
    );
    assert_not_found(
        RdmaConnection::connect_with(target, &RdmaOptions::new().device(nope)).await,
        nope,
        device,
    );
    assert_not_found(
        RListener::bind_with(any_v4(0), &RStreamOptions::new().device(nope)).await,
        nope,
        device,
    );
    assert_not_found(
        CmListener::bind_with(any_v4(0), &ListenerOptions::new().device(nope)).await,
        nope,
        device,
    );
    assert_not_found(
        RDatagram::bind_with(any_v4(0), &RDatagramOptions::new().device(nope)).await,
        nope,
        device,
    );
    // A port and a GID index that do not exist.
    assert_not_found(
        RListener::bind_with(
            any_v4(0),
            &RStreamOptions::new().device(DeviceChoice::new(device).port(2)),
        )
        .await,
        "no port 2",
        "ports are: 1",
    );
    assert_not_found(
        RStream::connect_with(
            target,
            &RStreamOptions::new().device(DeviceChoice::new(device).gid_index(999)),
        )
        .await,
        "no GID at index 999",
        &test_ip().to_string(),
    );
}

#[rdma_async::test]
async fn a_bind_address_that_contradicts_the_chosen_gid_is_invalid_input() {
    let device = device_name();
    let device = device.as_str();
    // The IPv6 GID chosen by index, the IPv4 address given to bind: they disagree.
    let v6 = DeviceChoice::new(device).gid_index(gid_index_of(test_ip6()));
    let check = |result: io::Result<()>| {
        let (kind, msg) = err_kind(result);
        assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
        assert!(
            msg.contains(&test_ip().to_string()) && msg.contains("not an address of the chosen"),
            "{msg}"
        );
        assert!(
            msg.contains(&test_ip6().to_string()),
            "names the GID's address: {msg}"
        );
    };
    check(
        RListener::bind_with(test_addr(0), &RStreamOptions::new().device(v6.clone()))
            .await
            .map(drop),
    );
    check(
        RDatagram::bind_with(test_addr(0), &RDatagramOptions::new().device(v6.clone()))
            .await
            .map(drop),
    );
    // Dialing: the explicit source address contradicts the GID.
    let listener = RListener::bind(test_addr(0)).await.unwrap();
    check(
        RStream::connect_with(
            listener.local_addr().unwrap(),
            &RStreamOptions::new().device(v6).bind(test_addr(0)),
        )
        .await
        .map(drop),
    );
    // An address that agrees with the device is kept.
    let agreeing = RListener::bind_with(test_addr(0), &RStreamOptions::new().device(device))
        .await
        .unwrap();
    assert_eq!(agreeing.local_addr().unwrap().ip(), test_ip());
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_link_local_gid_is_bound_with_its_netdevs_scope() {
    let device = device_name();
    let device = device.as_str();
    // GID 0 of a RoCE port is the netdev's link-local address: binding it needs the scope.
    let ports = devices()
        .unwrap()
        .into_iter()
        .find(|d| d.name() == device)
        .unwrap()
        .ports()
        .unwrap();
    let gid0 = ports[0].gid(0).unwrap().clone();
    let Some(IpAddr::V6(link_local)) = gid0.ip else {
        panic!("GID 0 is not an IPv6 address: {gid0:?}");
    };
    assert_eq!(link_local.segments()[0], 0xfe80, "{gid0:?}");
    let choice = DeviceChoice::new(device).gid_index(0);
    let listener = CmListener::bind_with(any_v6(0), &ListenerOptions::new().device(choice.clone()))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    assert_eq!(addr.ip(), IpAddr::V6(link_local));
    let opts = EndpointOptions::new().device(choice);
    let (server, client) = guard("endpoint over the link-local GID", async {
        tokio::join!(
            async { Endpoint::accept(listener.accept_request().await?, &opts).await },
            Endpoint::connect_with(addr, &opts)
        )
    })
    .await;
    let (server, client) = (server.unwrap(), client.unwrap());
    assert_eq!(client.local_addr().unwrap().ip(), IpAddr::V6(link_local));
    client.send(b"fe80").await.unwrap();
    assert_eq!(&guard("recv", server.recv()).await.unwrap()[..], b"fe80");
}
