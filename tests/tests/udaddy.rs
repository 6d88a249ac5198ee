//! Interoperation with librdmacm's `udaddy` (rdmacm-utils), both directions.
//!
//! udaddy's exchange: the client resolves the server (port 7174, fixed) with a SIDR request and
//! sends `-C` datagrams of `-S` bytes, each with its queue pair number as immediate data; the
//! server receives them all, builds an address handle from the first one and sends as many
//! back, which the client receives.

use std::net::SocketAddr;

use rdma_async::datagram::RDatagram;
use rdma_async_tests::{finish_tool, guard, spawn_tool, test_ip};

const COUNT: usize = 10;
const SIZE: usize = 100;
/// udaddy's port: its `-p` selects the port space, not the port.
const PORT: u16 = 7174;

/// Both tests need port 7174; they take turns.
static PORT_7174: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn udaddy(args: &[String]) -> tokio::process::Child {
    spawn_tool("udaddy", args)
}

fn size_args() -> Vec<String> {
    vec![
        "-C".into(),
        COUNT.to_string(),
        "-S".into(),
        SIZE.to_string(),
    ]
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_c_server() {
    let _turn = PORT_7174.lock().await;
    let mut args = vec!["-b".into(), test_ip().to_string()];
    args.extend(size_args());
    let child = udaddy(&args);
    let server = SocketAddr::new(test_ip(), PORT);
    let client = RDatagram::bind(SocketAddr::new(test_ip(), 0))
        .await
        .unwrap();
    let msg = [0x5au8; SIZE];
    // The server may not be bound yet: nothing answers the SIDR request until it is.
    for attempt in 0.. {
        match client.send_to(&msg, server).await {
            Ok(n) => {
                assert_eq!(n, SIZE);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && attempt < 500 => {
                tokio::task::yield_now().await
            }
            Err(e) => panic!("resolve the C udaddy server: {e}"),
        }
    }
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
    let text = finish_tool(child, "udaddy").await;
    assert!(text.contains("data transfers complete"), "{text}");
    assert!(text.contains("return status 0"), "{text}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn c_client_with_our_server() {
    let _turn = PORT_7174.lock().await;
    let server = RDatagram::bind(SocketAddr::new(test_ip(), PORT))
        .await
        .unwrap();
    let mut args = vec![
        "-s".into(),
        test_ip().to_string(),
        "-b".into(),
        test_ip().to_string(),
    ];
    args.extend(size_args());
    let child = udaddy(&args);
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
    let text = finish_tool(child, "udaddy").await;
    assert!(text.contains("data transfers complete"), "{text}");
    assert!(text.contains("return status 0"), "{text}");
    assert_eq!(server.stats().received, COUNT as u64);
}
