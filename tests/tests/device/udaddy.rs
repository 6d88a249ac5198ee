//! Interoperation with librdmacm's `udaddy` (rdmacm-utils), both directions.
//!
//! udaddy's exchange: the client resolves the server (port 7174, fixed) with a SIDR request and
//! sends `-C` datagrams of `-S` bytes, each with its queue pair number as immediate data; the
//! server receives them all, builds an address handle from the first one and sends as many
//! back, which the client receives.

use rdma_async::datagram::RDatagram;
use rdma_async_device_tests::ports;
use rdma_async_device_tests::tools::{EXCHANGE_DONE, UDADDY_PORT, finish_tool_printing};
use rdma_async_device_tests::{
    argv, connect_when_listening, datagram, guard, spawn_tool, test_addr, test_ip,
};

const COUNT: usize = 10;
const SIZE: usize = 100;
/// udaddy's port: its `-p` selects the port space, not the port.
const PORT: u16 = ports::UDADDY;

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_c_server() {
    let _turn = UDADDY_PORT.lock().await;
    let child = spawn_tool("udaddy", &argv!["-b", test_ip(), "-C", COUNT, "-S", SIZE]);
    let server = test_addr(PORT);
    let client = datagram(test_ip()).await;
    let msg = [0x5au8; SIZE];
    // The server may not be bound yet: nothing answers the SIDR request until it is.
    let n = connect_when_listening(|| client.send_to(&msg, server)).await;
    assert_eq!(n, SIZE);
    for _ in 1..COUNT {
        client.send_to(&msg, server).await.unwrap();
    }
    let mut buf = [0u8; 2 * SIZE];
    for _ in 0..COUNT {
        let (n, from) = guard("reply from udaddy", client.recv_from(&mut buf))
            .await
            .unwrap();
        assert_eq!(n, SIZE);
        assert_eq!(
            from, server,
            "replies are attributed to the address we resolved"
        );
    }
    finish_tool_printing(child, "udaddy", &EXCHANGE_DONE).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_client_with_our_server() {
    let _turn = UDADDY_PORT.lock().await;
    let server = RDatagram::bind(test_addr(PORT)).await.unwrap();
    let child = spawn_tool(
        "udaddy",
        &argv!["-s", test_ip(), "-b", test_ip(), "-C", COUNT, "-S", SIZE],
    );
    let mut buf = [0u8; 2 * SIZE];
    let mut client = None;
    for _ in 0..COUNT {
        let (n, from) = guard("datagram from udaddy", server.recv_from(&mut buf))
            .await
            .unwrap();
        assert_eq!(n, SIZE);
        assert_eq!(from.ip(), test_ip());
        assert_ne!(from.port(), 0, "the port of the client's SIDR request");
        assert!(client.is_none_or(|c| c == from), "one client");
        client = Some(from);
    }
    let client = client.unwrap();
    for _ in 0..COUNT {
        // No rdma_cm exchange: the route back comes from the received datagrams.
        server.send_to(&[0xa5u8; SIZE], client).await.unwrap();
    }
    finish_tool_printing(child, "udaddy", &EXCHANGE_DONE).await;
    assert_eq!(server.stats().received, COUNT as u64);
}
