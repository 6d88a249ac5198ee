//! A tonic gRPC server over RDMA: the greeter of proto/greeter.proto (unary, server-streaming
//! and bidirectional calls), served from an `RListener`.
//!
//! ```text
//! greeter_server [--tcp] [address:port]        # default 10.77.0.1:50051
//! greeter_server --help
//! ```
//!
//!   scripts/softroce cargo run --example greeter_server -- 10.77.0.1:50051
//!
//! Pair it with `greeter_client`. `--tcp` serves the same over kernel TCP instead (with
//! `TCP_NODELAY`), so `greeter_client --tcp` can compare the two transports.

use std::pin::Pin;

use clap::Parser;
use rdma_async::stream::RListener;
use tokio_stream::{Stream, StreamExt};
use tonic::transport::Server;
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status, Streaming};

mod greeter {
    tonic::include_proto!("greeter");
}
use greeter::greeter_server::{Greeter, GreeterServer};
use greeter::{HelloReply, HelloRequest};

/// A tonic gRPC server over RDMA: the greeter of proto/greeter.proto.
#[derive(Debug, Parser)]
#[command(name = "greeter_server")]
struct Options {
    /// Serve over kernel TCP (with TCP_NODELAY) instead of RDMA, for comparisons.
    #[arg(long)]
    tcp: bool,
    /// The address and port to listen on.
    #[arg(value_name = "ADDRESS:PORT", default_value = "10.77.0.1:50051")]
    addr: String,
}

type ReplyStream = Pin<Box<dyn Stream<Item = Result<HelloReply, Status>> + Send>>;

/// The greeter service; `transport` ("RDMA" or "TCP") goes into its log lines.
#[derive(Debug)]
struct Hello {
    transport: &'static str,
}

#[tonic::async_trait]
impl Greeter for Hello {
    async fn say_hello(
        &self,
        request: Request<HelloRequest>,
    ) -> Result<Response<HelloReply>, Status> {
        // `remote_addr` works over RDMA: RStream reports its peer as tonic's TcpConnectInfo.
        let peer = request.remote_addr();
        let name = request.into_inner().name;
        println!("greeting {name} from {peer:?} over {}", self.transport);
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
    let Options { tcp, addr } = Options::parse();
    let transport = if tcp { "TCP" } else { "RDMA" };
    let service = GreeterServer::new(Hello { transport });
    if tcp {
        // Answers go out at once, as RStream's do (it has no Nagle).
        let incoming = TcpIncoming::bind(addr.parse()?)?.with_nodelay(Some(true));
        println!("greeter over TCP, listening on {}", incoming.local_addr()?);
        Server::builder()
            .add_service(service)
            .serve_with_incoming(incoming)
            .await?;
        return Ok(());
    }
    let listener = RListener::bind(addr.as_str()).await?;
    println!("greeter listening on {}", listener.local_addr()?);
    Server::builder()
        .add_service(service)
        .serve_with_incoming(listener.into_incoming())
        .await?;
    Ok(())
}
