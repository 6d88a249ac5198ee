//! Setting up `rdma::RdmaConnection`s: device attributes (as `ibv_devinfo`), `rdma_set_option`
//! options on dial and listen, and a shared receive queue serving several connections.

use std::io;
use std::net::{Ipv6Addr, SocketAddr};

use rdma_async::cm::{CmListener, IdOptions, ListenerOptions};
use rdma_async::device::{AtomicCapability, devices};
use rdma_async::rdma::{RdmaConnection, RdmaOptions, SharedReceiveQueue};
use rdma_async_device_tests::pairs::rdma_pair_on;
use rdma_async_device_tests::{
    err_kind, guard, listener, rdma_pair, test_addr, test_addr6, test_ip,
};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn device_attributes_like_ibv_devinfo() {
    let list = devices().unwrap();
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let dev = list
        .iter()
        .find(|d| d.name() == client.device_name())
        .expect("the connection's device is listed");
    let attrs = dev.attributes().unwrap();
    assert!(
        attrs.max_qp > 0 && attrs.max_qp_wr > 0 && attrs.max_mr_size > 0,
        "{attrs:?}"
    );
    assert_eq!(attrs.node_guid, dev.node_guid());
    let port = attrs.ports.first().expect("a port");
    assert_eq!(
        (port.port_num, port.state.as_str()),
        (1, "PORT_ACTIVE"),
        "{port:?}"
    );
    assert!(port.ethernet, "Soft-RoCE runs over Ethernet");
    assert!(
        port.active_mtu >= 256 && port.active_mtu <= port.max_mtu,
        "{port:?}"
    );
    // The connection reports the same device and the port its address picked.
    let conn_attrs = client.device_attributes();
    assert_eq!(conn_attrs.atomic_cap, attrs.atomic_cap);
    assert_eq!(conn_attrs.ports.len(), 1);
    assert_eq!(conn_attrs.ports[0].port_num, client.port_num());
    assert_eq!(
        client.supports_atomics(),
        attrs.atomic_cap != AtomicCapability::None
    );
    assert_eq!(server.device_name(), client.device_name());
}

async fn ping(server: &RdmaConnection, client: &RdmaConnection) {
    let mut msg = client.reg_msgs(5).unwrap();
    msg.copy_from_slice(b"hello");
    let ((got, inbox), (sent, _)) = guard("ping", async {
        tokio::join!(
            server.recv(server.reg_msgs(16).unwrap(), ..),
            client.send(msg, ..)
        )
    })
    .await;
    sent.unwrap();
    assert_eq!(&inbox[..got.unwrap().len()], b"hello");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn id_options_on_dial_and_listen() {
    let listen_opts = IdOptions::new().reuse_address(true).type_of_service(32);
    let listener = CmListener::bind_with(
        test_addr(0),
        &ListenerOptions::new().id_options(listen_opts),
    )
    .await
    .unwrap();
    let opts = RdmaOptions::new().id_options(
        IdOptions::new()
            .type_of_service(32)
            .ack_timeout(14)
            .reuse_address(true),
    );
    let (server, client) = rdma_pair_on(&listener, &opts, &opts).await;
    ping(&server, &client).await;

    // IPv6-only: a wildcard IPv6 listener then takes IPv6 connections and refuses IPv4 ones.
    let v6only = CmListener::bind_with(
        SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
        &ListenerOptions::new().id_options(IdOptions::new().ipv6_only(true)),
    )
    .await
    .unwrap();
    let port = v6only.local_addr().unwrap().port();
    let plain = RdmaOptions::new();
    let (server, client) = guard("IPv6 connect", async {
        tokio::join!(
            async { RdmaConnection::accept(v6only.accept_request().await?, &plain).await },
            RdmaConnection::connect_with(test_addr6(port), &plain)
        )
    })
    .await;
    ping(&server.unwrap(), &client.unwrap()).await;
    let refused = guard(
        "IPv4 connect to an IPv6-only listener",
        RdmaConnection::connect_with(test_addr(port), &plain),
    )
    .await;
    assert_eq!(err_kind(refused).0, io::ErrorKind::ConnectionRefused);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_receive_queue_serves_several_connections() {
    let srq = SharedReceiveQueue::new(test_ip(), 8).unwrap();
    let server_opts = RdmaOptions::new().shared_receive_queue(&srq);
    let listener = listener().await;
    let plain = RdmaOptions::new();
    let mut servers = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let (s, c) = rdma_pair_on(&listener, &server_opts, &plain).await;
        servers.push(s);
        clients.push(c);
    }
    // Receives go through the queue, not the connection.
    let (r, _) = servers[0].recv(servers[0].reg_msgs(8).unwrap(), ..).await;
    assert_eq!(r.unwrap_err().kind(), io::ErrorKind::InvalidInput);

    // Post four receives (the queue's memory and a connection's memory share one domain).
    let mut receives = tokio::task::JoinSet::new();
    for i in 0..4 {
        let srq = srq.clone();
        let buf = if i % 2 == 0 {
            srq.reg_msgs(64).unwrap()
        } else {
            servers[0].reg_msgs(64).unwrap()
        };
        receives.spawn(async move {
            let (got, buf) = srq.recv(buf, ..).await;
            let got = got.unwrap();
            (got.qp_num(), buf[..got.len()].to_vec())
        });
    }
    tokio::task::yield_now().await;
    for (i, client) in clients.iter().enumerate() {
        for j in 0..2u8 {
            let mut msg = client.reg_msgs(3).unwrap();
            msg.copy_from_slice(&[b'c', i as u8, j]);
            let (sent, _) = guard("send to the shared queue", client.send(msg, ..)).await;
            sent.unwrap();
        }
    }
    let mut got = Vec::new();
    guard("shared receives", async {
        while let Some(r) = receives.join_next().await {
            got.push(r.unwrap());
        }
    })
    .await;
    for (i, server) in servers.iter().enumerate() {
        let mut from: Vec<Vec<u8>> = got
            .iter()
            .filter(|(qp, _)| *qp == server.qp_num())
            .map(|(_, m)| m.clone())
            .collect();
        from.sort();
        assert_eq!(
            from,
            vec![vec![b'c', i as u8, 0], vec![b'c', i as u8, 1]],
            "{got:?}"
        );
    }
}
