//! Interoperation with librdmacm's `ucmatose` (rdmacm-utils), both directions.
//!
//! ucmatose's exchange: the server posts its receives and accepts, then sends `-C` messages of
//! `-S` bytes; the client receives them all, then sends as many back; the server then
//! disconnects.

use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async_device_tests::ports;
use rdma_async_device_tests::tools::{EXCHANGE_DONE, finish_tool_printing};
use rdma_async_device_tests::{
    argv, connect_when_listening, guard, listener, spawn_tool, test_addr, test_ip,
};

const COUNT: usize = 10;
const SIZE: usize = 100;

#[rdma_async::test]
async fn our_client_with_c_server() {
    let port = ports::C_UCMATOSE_SERVER;
    let child = spawn_tool(
        "ucmatose",
        &argv!["-b", test_ip(), "-p", port, "-C", COUNT, "-S", SIZE],
    );
    let addr = test_addr(port);
    let opts = EndpointOptions::new();
    let ep = connect_when_listening(|| Endpoint::connect_with(addr, &opts)).await;
    for _ in 0..COUNT {
        let msg = guard("recv from ucmatose", ep.recv()).await.unwrap();
        assert_eq!(msg.len(), SIZE);
    }
    for i in 0..COUNT {
        ep.send(&[i as u8; SIZE]).await.unwrap();
    }
    guard("ucmatose disconnects", ep.closed()).await.unwrap();
    finish_tool_printing(child, "ucmatose", &EXCHANGE_DONE).await;
}

#[rdma_async::test]
async fn c_client_with_our_server() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let child = spawn_tool(
        "ucmatose",
        &argv!["-s", addr.ip(), "-p", addr.port(), "-C", COUNT, "-S", SIZE],
    );
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
    finish_tool_printing(child, "ucmatose", &EXCHANGE_DONE).await;
}
