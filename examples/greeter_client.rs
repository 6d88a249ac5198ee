//! A tonic gRPC client over RDMA: one unary call and one server-streaming call to
//! `greeter_server`.
//!
//!   scripts/softroce sh -c 'target/debug/examples/greeter_server 10.77.0.1:50051 &
//!       target/debug/examples/greeter_client http://10.77.0.1:50051'

use rdma_async::integration::hyper::RConnector;
use tokio_stream::StreamExt;
use tonic::transport::Endpoint;

mod greeter {
    tonic::include_proto!("greeter");
}
use greeter::HelloRequest;
use greeter::greeter_client::GreeterClient;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let uri = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "http://10.77.0.1:50051".into());
    // The hyper connector opens an RStream to the URI's host and port.
    let channel = Endpoint::from_shared(uri)?
        .connect_with_connector(RConnector::new())
        .await?;
    let mut client = GreeterClient::new(channel);

    let request = HelloRequest {
        name: "RDMA".into(),
        ..Default::default()
    };
    let reply = client.say_hello(request).await?.into_inner();
    println!("unary: {}", reply.message);

    let request = HelloRequest {
        name: "RDMA".into(),
        count: 3,
        ..Default::default()
    };
    let mut replies = client.say_hello_stream(request).await?.into_inner();
    while let Some(reply) = replies.next().await {
        println!("stream: {}", reply?.message);
    }
    Ok(())
}
