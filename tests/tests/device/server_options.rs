//! Id options given to the server side (a listener, the accepting type's options, a bound
//! datagram socket's options) take effect on every transport: the ACK timeout is read back from
//! the accepted queue pair, IPv6-only from which connections a listener takes, the type of
//! service from the route a datagram socket resolves.

use std::io;
use std::net::{Ipv6Addr, SocketAddr};

use rdma_async::cm::{CmListener, IdOptions, ListenerOptions};
use rdma_async::datagram::{RDatagram, RDatagramOptions};
use rdma_async::endpoint::EndpointOptions;
use rdma_async::rdma::RdmaOptions;
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async::{datagram, endpoint, rdma, stream};
use rdma_async_device_tests::pairs::{endpoint_pair_on, rdma_pair_on};
use rdma_async_device_tests::{err_kind, guard, test_ip, test_ip6};

/// An ACK timeout exponent that rdma_cm does not pick by itself on Soft-RoCE, so reading it back
/// proves the option was set.
const ACK_TIMEOUT: u8 = 20;
/// Another one, for options that must win over the listener's.
const OTHER_ACK_TIMEOUT: u8 = 21;

fn ack_timeout(exponent: u8) -> IdOptions {
    IdOptions::new().ack_timeout(exponent)
}

async fn cm_listener(options: &IdOptions) -> CmListener {
    CmListener::bind_with(
        SocketAddr::new(test_ip(), 0),
        &ListenerOptions::new().id_options(options.clone()),
    )
    .await
    .expect("bind a listener on the RDMA test address")
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlistener_ack_timeout_reaches_accepted_streams() {
    let server_opts = RStreamOptions::new().id_options(ack_timeout(ACK_TIMEOUT));
    let listener = RListener::bind_with(SocketAddr::new(test_ip(), 0), &server_opts)
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (accepted, client) = guard("connect", async {
        tokio::join!(listener.accept(), RStream::connect(addr))
    })
    .await;
    let (server, _) = accepted.unwrap();
    let client = client.unwrap();
    assert_eq!(stream::hooks::ack_timeout(&server).unwrap(), ACK_TIMEOUT);
    assert_ne!(
        stream::hooks::ack_timeout(&client).unwrap(),
        ACK_TIMEOUT,
        "the client did not ask for it"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rlistener_ipv6_only_refuses_ipv4() {
    let server_opts = RStreamOptions::new().id_options(IdOptions::new().ipv6_only(true));
    let listener = RListener::bind_with(
        SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0),
        &server_opts,
    )
    .await
    .unwrap();
    let port = listener.local_addr().unwrap().port();
    let (accepted, client) = guard("IPv6 connect", async {
        tokio::join!(
            listener.accept(),
            RStream::connect(SocketAddr::new(test_ip6(), port))
        )
    })
    .await;
    accepted.unwrap();
    client.unwrap();
    let refused = guard(
        "IPv4 connect to an IPv6-only listener",
        RStream::connect(SocketAddr::new(test_ip(), port)),
    )
    .await;
    assert_eq!(err_kind(refused).0, io::ErrorKind::ConnectionRefused);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn endpoint_accept_takes_the_listener_and_its_own_ack_timeout() {
    let listener = cm_listener(&ack_timeout(ACK_TIMEOUT)).await;
    // The server's options vary; the client connects with the defaults. Each pair's client is
    // dropped at once: only the accepted side is read.
    let defaults = EndpointOptions::new();
    let server = endpoint_pair_on(&listener, &defaults, &defaults).await.0;
    assert_eq!(endpoint::hooks::ack_timeout(&server).unwrap(), ACK_TIMEOUT);
    // The accepting type's own option wins over the listener's.
    let own = EndpointOptions::new().id_options(ack_timeout(OTHER_ACK_TIMEOUT));
    let server = endpoint_pair_on(&listener, &own, &defaults).await.0;
    assert_eq!(
        endpoint::hooks::ack_timeout(&server).unwrap(),
        OTHER_ACK_TIMEOUT
    );
    // And works without any on the listener.
    let plain = rdma_async_device_tests::listener().await;
    let server = endpoint_pair_on(&plain, &own, &defaults).await.0;
    assert_eq!(
        endpoint::hooks::ack_timeout(&server).unwrap(),
        OTHER_ACK_TIMEOUT
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdma_accept_takes_the_listener_and_its_own_ack_timeout() {
    let listener = cm_listener(&ack_timeout(ACK_TIMEOUT)).await;
    let defaults = RdmaOptions::new();
    let server = rdma_pair_on(&listener, &defaults, &defaults).await.0;
    assert_eq!(rdma::hooks::ack_timeout(&server).unwrap(), ACK_TIMEOUT);
    let own = RdmaOptions::new().id_options(ack_timeout(OTHER_ACK_TIMEOUT));
    let server = rdma_pair_on(&listener, &own, &defaults).await.0;
    assert_eq!(
        rdma::hooks::ack_timeout(&server).unwrap(),
        OTHER_ACK_TIMEOUT
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rdatagram_type_of_service_reaches_its_routes() {
    const TOS: u8 = 32;
    let bind = SocketAddr::new(test_ip(), 0);
    let server_opts = RDatagramOptions::new().id_options(IdOptions::new().type_of_service(TOS));
    let server = RDatagram::bind_with(bind, &server_opts).await.unwrap();
    let client = RDatagram::bind(bind).await.unwrap();
    let (server_addr, client_addr) = (server.local_addr().unwrap(), client.local_addr().unwrap());
    let got = guard(
        "resolve the client",
        datagram::hooks::resolve_traffic_class(&server, client_addr),
    )
    .await;
    assert_eq!(got.unwrap(), TOS);
    let got = guard(
        "resolve the server",
        datagram::hooks::resolve_traffic_class(&client, server_addr),
    )
    .await;
    assert_ne!(got.unwrap(), TOS, "the client did not ask for it");
    // And the socket still reaches its peer with it.
    guard("send", server.send_to(b"tos", client_addr))
        .await
        .unwrap();
    let mut buf = [0u8; 8];
    let (n, from) = guard("receive", client.recv_from(&mut buf)).await.unwrap();
    assert_eq!((&buf[..n], from), (&b"tos"[..], server_addr));
}
