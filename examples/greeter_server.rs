//! A tonic gRPC server over RDMA: the greeter of proto/greeter.proto (unary, server-streaming
//! and bidirectional calls), served from an `RListener`.
//!
//!   scripts/softroce cargo run --example greeter_server -- 10.77.0.1:50051
//!
//! Pair it with `greeter_client`.

use std::pin::Pin;

use rdma_async::stream::RListener;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status, Streaming};

mod greeter {
    tonic::include_proto!("greeter");
}
use greeter::greeter_server::{Greeter, GreeterServer};
use greeter::{HelloReply, HelloRequest};

type ReplyStream = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;

#[derive(Debug, Default)]
struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        // `remote_addr` works over RDMA: RStream reports its peer as tonic's TcpConnectInfo.
        let peer = request.remote_addr();
        let name = request.into_inner().name;
        println!("greeting {name} from {peer:?}");
        Ok(Response::new(HelloReply {
            message: format!("Hello {name}!"),
            ..Default::default()
        }))
    }

    type SayHelloStreamStream = ReplyStream;

    async fn say_hello_stream(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<ReplyStream>, Status> {
        let HelloRequest { name, count, .. } = request.into_inner();
        let replies = tokio_stream::iter(0..count).map(move |index| {
            Ok(HelloReply {
                message: format!("Hello {name}, #{index}"),
                index,
                ..Default::default()
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }

    type ChatStream = ReplyStream;

    async fn chat(
        &self,
        request: Request<Streaming<HelloRequest>>,
    ) -> Result<Response<ReplyStream>, Status> {
        let mut index = 0;
        let replies = request.into_inner().map(move |request| {
            let request = request?;
            index += 1;
            Ok(HelloReply {
                message: format!("Hello {}!", request.name),
                index: index - 1,
                payload: request.payload,
            })
        });
        Ok(Response::new(Box::pin(replies)))
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "10.77.0.1:50051".into());
    let listener = RListener::bind(addr.as_str()).await?;
    println!("greeter listening on {}", listener.local_addr()?);
    tonic::transport::Server::builder()
        .add_service(GreeterServer::new(Hello))
        .serve_with_incoming(listener.into_incoming())
        .await?;
    Ok(())
}
