//! Interoperation with librdmacm's `ucmatose` (rdmacm-utils), both directions.
//!
//! ucmatose's exchange: the server posts its receives and accepts, then sends `-C` messages of
//! `-S` bytes; the client receives them all, then sends as many back; the server then
//! disconnects.

use std::net::SocketAddr;

use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async_tests::{connect_when_listening, finish_tool, guard, listener, spawn_tool, test_ip};

const COUNT: usize = 10;
const SIZE: usize = 100;

fn ucmatose(args: &[String]) -> tokio::process::Child {
    spawn_tool("ucmatose", args)
}

async fn finish(child: tokio::process::Child) -> String {
    finish_tool(child, "ucmatose").await
}

#[rdma_async::test]
async fn our_client_with_c_server() {
    let port = 17471u16;
    let child = ucmatose(&[
        "-b".into(),
        test_ip().to_string(),
        "-p".into(),
        port.to_string(),
        "-C".into(),
        COUNT.to_string(),
        "-S".into(),
        SIZE.to_string(),
    ]);
    let addr = SocketAddr::new(test_ip(), port);
    let opts = EndpointOptions::new();
    let ep = connect_when_listening(|| Endpoint::connect(addr, &opts)).await;
    for _ in 0..COUNT {
        let msg = guard("recv from ucmatose", ep.recv()).await.unwrap();
        assert_eq!(msg.len(), SIZE);
    }
    for i in 0..COUNT {
        ep.send(&[i as u8; SIZE]).await.unwrap();
    }
    guard("ucmatose disconnects", ep.closed()).await.unwrap();
    let text = finish(child).await;
    assert!(text.contains("data transfers complete"), "{text}");
    assert!(text.contains("return status 0"), "{text}");
}

#[rdma_async::test]
async fn c_client_with_our_server() {
    let listener = listener().await;
    let addr = listener.local_addr();
    let child = ucmatose(&[
        "-s".into(),
        addr.ip().to_string(),
        "-p".into(),
        addr.port().to_string(),
        "-C".into(),
        COUNT.to_string(),
        "-S".into(),
        SIZE.to_string(),
    ]);
    let request = guard("request from ucmatose", listener.accept_request())
        .await
        .unwrap();
    let ep = guard("accept", Endpoint::accept(request, &EndpointOptions::new()))
        .await
        .unwrap();
    for i in 0..COUNT {
        ep.send(&[i as u8; SIZE]).await.unwrap();
    }
    for _ in 0..COUNT {
        let msg = guard("recv from ucmatose", ep.recv()).await.unwrap();
        assert_eq!(msg.len(), SIZE);
    }
    guard("disconnect", ep.disconnect()).await.unwrap();
    let text = finish(child).await;
    assert!(text.contains("data transfers complete"), "{text}");
    assert!(text.contains("return status 0"), "{text}");
}
