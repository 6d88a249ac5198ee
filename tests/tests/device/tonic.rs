//! tonic gRPC over `RStream` / `RListener` on a real RDMA device: the server on
//! `serve_with_incoming(listener.into_incoming())`, the client on `RConnector`.

use std::net::SocketAddr;
use std::pin::Pin;

use rdma_async::integration::hyper::RConnector;
use rdma_async::stream::RListener;
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{guard, test_addr, test_ip};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status, Streaming};

use rdma_async_device_tests::greeter::greeter_client::GreeterClient;
use rdma_async_device_tests::greeter::greeter_server::{Greeter, GreeterServer};
use rdma_async_device_tests::greeter::{HelloReply, HelloRequest};

const MESSAGES: u32 = 1000;

type ReplyStream = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;

/// Greets with the server's generation and the addresses tonic reports for the call.
struct TestGreeter {
    generation: u32,
}

#[tonic::async_trait]
impl Greeter for TestGreeter {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        let peer = request.remote_addr().map(|a| a.to_string());
        let local = request.local_addr().map(|a| a.to_string());
        let name = request.into_inner().name;
        Ok(Response::new(HelloReply {
            message: format!(
                "{name} gen={} peer={peer:?} local={local:?}",
                self.generation
            ),
            index: self.generation,
            payload: Vec::new(),
        }))
    }

    type SayHelloStreamStream = ReplyStream;

    async fn say_hello_stream(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let count = request.into_inner().count;
        let replies = tokio_stream::iter(0..count).map(|index| {
            Ok(HelloReply {
                message: String::new(),
                index,
                payload: pattern(index.into(), index as usize % 3000),
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }

    type ChatStream = ReplyStream;

    /// Echoes each request's payload with its position in the call.
    async fn chat(
        &self,
        request: Request<Streaming<HelloRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let mut index = 0;
        let replies = request.into_inner().map(move |request| {
            let request = request?;
            index += 1;
            Ok(HelloReply {
                message: request.name,
                index: index - 1,
                payload: request.payload,
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

/// A running server: stop it gracefully with `stop`, then await `done`.
struct Server {
    addr: SocketAddr,
    stop: oneshot::Sender<()>,
    done: JoinHandle<Result<(), tonic::transport::Error>>,
}

async fn start_server(addr: SocketAddr, generation: u32) -> Server {
    let listener = RListener::bind(addr).await.expect("bind RListener");
    let addr = listener.local_addr().expect("local_addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(GreeterServer::new(TestGreeter { generation }))
            .serve_with_incoming_shutdown(listener.into_incoming(), async {
                let _ = stopped.await;
            }),
    );
    Server { addr, stop, done }
}

async fn channel(addr: SocketAddr) -> Channel {
    Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint URI")
        .connect_with_connector(RConnector::new())
        .await
        .expect("connect a tonic channel over RDMA")
}

#[rdma_async::test]
async fn unary_calls_see_the_peer_address() {
    let server = start_server(test_addr(0), 1).await;
    let mut client = GreeterClient::new(channel(server.addr).await);
    for i in 0..10 {
        let request = HelloRequest {
            name: format!("call{i}"),
            ..Default::default()
        };
        let reply = guard("unary call", client.say_hello(request))
            .await
            .expect("unary call")
            .into_inner();
        let expected_peer = format!("peer=Some(\"{}:", test_ip());
        let expected_local = format!("local=Some(\"{}\")", server.addr);
        assert!(
            reply.message.starts_with(&format!("call{i} gen=1 ")),
            "{}",
            reply.message
        );
        assert!(reply.message.contains(&expected_peer), "{}", reply.message);
        assert!(reply.message.contains(&expected_local), "{}", reply.message);
    }
}

#[rdma_async::test]
async fn server_streaming_delivers_every_reply_in_order() {
    let server = start_server(test_addr(0), 1).await;
    let mut client = GreeterClient::new(channel(server.addr).await);
    let request = HelloRequest {
        count: MESSAGES,
        ..Default::default()
    };
    let mut replies = guard("server-streaming call", client.say_hello_stream(request))
        .await
        .expect("server-streaming call")
        .into_inner();
    let mut expected = 0;
    while let Some(reply) = guard("next reply", replies.next()).await {
        let reply = reply.expect("reply");
        assert_eq!(reply.index, expected);
        assert_eq!(
            reply.payload,
            pattern(expected.into(), expected as usize % 3000)
        );
        expected += 1;
    }
    assert_eq!(expected, MESSAGES);
}

#[rdma_async::test]
async fn bidirectional_streaming_echoes_1000_messages() {
    let server = start_server(test_addr(0), 1).await;
    let mut client = GreeterClient::new(channel(server.addr).await);
    let requests = tokio_stream::iter(0..MESSAGES).map(|i| HelloRequest {
        name: format!("m{i}"),
        count: 0,
        // Sizes from 0 to ~16 KiB, so replies span many rsockets messages.
        payload: pattern(i.into(), (i as usize * 997) % 16_500),
    });
    let mut replies = guard("bidirectional call", client.chat(requests))
        .await
        .expect("bidirectional call")
        .into_inner();
    let mut received = 0;
    while let Some(reply) = guard("next reply", replies.next()).await {
        let reply = reply.expect("reply");
        assert_eq!(reply.index, received);
        assert_eq!(reply.message, format!("m{received}"));
        assert_eq!(
            reply.payload,
            pattern(received.into(), (received as usize * 997) % 16_500)
        );
        received += 1;
    }
    assert_eq!(received, MESSAGES);
}

#[rdma_async::test]
async fn client_reconnects_after_the_server_restarts() {
    let first = start_server(test_addr(0), 1).await;
    let addr = first.addr;
    let mut client = GreeterClient::new(channel(addr).await);
    let hello = || HelloRequest {
        name: "again".into(),
        ..Default::default()
    };
    let reply = guard("call to the first server", client.say_hello(hello()))
        .await
        .expect("call to the first server");
    assert_eq!(reply.into_inner().index, 1);

    // A graceful stop sends GOAWAY and ends once the client has let the connection go; the
    // listener (and its port) is released when the server future returns.
    first.stop.send(()).expect("server still running");
    guard("first server stops", first.done)
        .await
        .expect("server task")
        .expect("first server ended cleanly");

    let second = start_server(addr, 2).await;
    assert_eq!(second.addr, addr);
    // The channel reconnects on demand; a call that raced the old connection's end may fail
    // once with `Unavailable`, as over TCP.
    let mut answered = None;
    for _ in 0..3 {
        match guard("call after the restart", client.say_hello(hello())).await {
            Ok(reply) => {
                answered = Some(reply.into_inner().index);
                break;
            }
            Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        }
    }
    assert_eq!(answered, Some(2), "the restarted server never answered");
}

/// gRPC over TLS over RDMA: tonic's own TLS (`ServerTlsConfig` on `serve_with_incoming`, a
/// `ClientTlsConfig` channel through `connect_with_connector`) with a certificate made in the
/// test; a unary call (which still sees the peer's address) and a server stream.
#[rdma_async::test]
async fn tls_unary_and_streaming_calls() {
    use rdma_async_device_tests::tls::TestCert;
    use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

    let cert = TestCert::for_ip(test_ip());
    let listener = RListener::bind(test_addr(0)).await.expect("bind RListener");
    let addr = listener.local_addr().expect("local_addr");
    let (stop, stopped) = oneshot::channel::<()>();
    let done = tokio::spawn(
        tonic::transport::Server::builder()
            .tls_config(
                ServerTlsConfig::new().identity(Identity::from_pem(&cert.pem, &cert.key_pem)),
            )
            .expect("server TLS configuration")
            .add_service(GreeterServer::new(TestGreeter { generation: 3 }))
            .serve_with_incoming_shutdown(listener.into_incoming(), async {
                let _ = stopped.await;
            }),
    );
    let channel = guard(
        "TLS channel",
        Endpoint::from_shared(format!("https://{addr}"))
            .expect("endpoint URI")
            .tls_config(
                ClientTlsConfig::new()
                    .ca_certificate(Certificate::from_pem(&cert.pem))
                    .domain_name(test_ip().to_string()),
            )
            .expect("client TLS configuration")
            .connect_with_connector(RConnector::new()),
    )
    .await
    .expect("connect a TLS channel over RDMA");
    let mut client = GreeterClient::new(channel);
    let reply = guard(
        "unary call over TLS",
        client.say_hello(HelloRequest {
            name: "tls".into(),
            ..Default::default()
        }),
    )
    .await
    .expect("unary call over TLS")
    .into_inner();
    assert!(
        reply.message.starts_with("tls gen=3 ")
            && reply
                .message
                .contains(&format!("peer=Some(\"{}:", test_ip())),
        "{}",
        reply.message
    );
    let mut replies = guard(
        "server stream over TLS",
        client.say_hello_stream(HelloRequest {
            count: 50,
            ..Default::default()
        }),
    )
    .await
    .expect("server stream over TLS")
    .into_inner();
    let mut n = 0;
    while let Some(reply) = guard("stream item", replies.next()).await {
        let reply = reply.expect("stream item over TLS");
        assert_eq!(reply.index, n);
        assert!(reply.payload == pattern(n.into(), n as usize % 3000));
        n += 1;
    }
    assert_eq!(n, 50);
    drop(client);
    stop.send(()).unwrap();
    guard("server shutdown", done)
        .await
        .unwrap()
        .expect("server over TLS");
}
