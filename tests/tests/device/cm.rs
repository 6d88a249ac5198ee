//! Connection management and messages on a real RDMA device.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rdma_async::cm::{CmError, ConnParams, MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA};
use rdma_async::endpoint::hooks;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async_device_tests::pairs::endpoint_pair_on;
use rdma_async_device_tests::ports;
use rdma_async_device_tests::{
    endpoint_pair, err_kind, guard, listener, test_addr, test_addr6, test_ip,
};

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_accept_echo() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    assert_eq!(addr.ip(), test_ip());
    assert_ne!(addr.port(), 0, "an ephemeral port was assigned");
    let server = tokio::spawn(async move {
        let request = listener.accept_request().await?;
        let ep = Endpoint::accept(request, &EndpointOptions::new()).await?;
        for _ in 0..3 {
            let msg = ep.recv().await?;
            ep.send(&msg).await?;
        }
        ep.closed().await?;
        ep.peer_addr()
    });
    let client = guard(
        "connect",
        Endpoint::connect_with(addr, &EndpointOptions::new()),
    )
    .await
    .unwrap();
    assert_eq!(client.peer_addr().unwrap(), addr);
    for (i, size) in [0usize, 1, 4096].into_iter().enumerate() {
        let msg: Vec<u8> = (0..size).map(|b| (b as u8).wrapping_add(i as u8)).collect();
        client.send(&msg).await.unwrap();
        let back = guard("echo", client.recv()).await.unwrap();
        assert_eq!(&back[..], &msg[..], "echo of {size} bytes");
    }
    let local = client.local_addr().unwrap();
    guard("disconnect", client.disconnect()).await.unwrap();
    let seen_peer = guard("server", server).await.unwrap().unwrap();
    assert_eq!(seen_peer, local, "the server saw the client's address");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_connect_and_echo() {
    let listener = rdma_async::cm::CmListener::bind(test_addr6(0))
        .await
        .unwrap();
    assert!(listener.local_addr().unwrap().is_ipv6());
    let opts = EndpointOptions::new();
    let (ep, client) = endpoint_pair_on(&listener, &opts, &opts).await;
    let server = tokio::spawn(async move {
        let msg = ep.recv().await?;
        ep.send(&msg).await?;
        ep.closed().await
    });
    client.send(b"over ipv6").await.unwrap();
    assert_eq!(
        &guard("echo", client.recv()).await.unwrap()[..],
        b"over ipv6"
    );
    client.disconnect().await.unwrap();
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_concurrent_connections() {
    const N: usize = 20;
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let mut sessions = Vec::new();
        for _ in 0..N {
            let request = listener.accept_request().await?;
            sessions.push(tokio::spawn(async move {
                let ep = Endpoint::accept(request, &EndpointOptions::new()).await?;
                let msg = ep.recv().await?;
                ep.send(&msg).await?;
                ep.closed().await
            }));
        }
        for s in sessions {
            s.await.expect("session task")?;
        }
        io::Result::Ok(())
    });
    let clients: Vec<_> = (0..N)
        .map(|i| {
            tokio::spawn(async move {
                let ep = Endpoint::connect_with(addr, &EndpointOptions::new()).await?;
                let msg = format!("client {i}").into_bytes();
                ep.send(&msg).await?;
                let back = ep.recv().await?;
                assert_eq!(back, msg);
                ep.disconnect().await
            })
        })
        .collect();
    for c in clients {
        guard("client", c).await.unwrap().unwrap();
    }
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn private_data_both_ways_at_maximum_size() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let request_data: Vec<u8> = (1..=MAX_CONNECT_PRIVATE_DATA as u8).collect();
    let accept_data: Vec<u8> = (0..MAX_ACCEPT_PRIVATE_DATA)
        .map(|i| 255 - i as u8)
        .collect();
    let expected_request = request_data.clone();
    let reply = accept_data.clone();
    let server = tokio::spawn(async move {
        let request = listener.accept_request().await?;
        assert_eq!(request.private_data(), &expected_request[..]);
        let opts = EndpointOptions::new().conn_params(ConnParams::new().private_data(reply));
        let ep = Endpoint::accept(request, &opts).await?;
        assert_eq!(ep.peer_private_data(), &expected_request[..]);
        ep.closed().await
    });
    let opts = EndpointOptions::new().conn_params(ConnParams::new().private_data(request_data));
    let client = guard("connect", Endpoint::connect_with(addr, &opts))
        .await
        .unwrap();
    assert_eq!(client.peer_private_data(), &accept_data[..]);
    client.disconnect().await.unwrap();
    guard("server", server).await.unwrap().unwrap();

    // One byte more than fits is refused before anything is sent.
    let too_long = ConnParams::new().private_data(vec![0; MAX_CONNECT_PRIVATE_DATA + 1]);
    let (kind, msg) =
        err_kind(Endpoint::connect_with(addr, &EndpointOptions::new().conn_params(too_long)).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("private data"), "{msg}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_private_data_arrives_as_a_prefix() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let request = listener.accept_request().await?;
        let data = request.private_data().to_vec();
        request.reject(b"")?;
        io::Result::Ok(data)
    });
    let opts = EndpointOptions::new().conn_params(ConnParams::new().private_data(*b"hello"));
    let _ = Endpoint::connect_with(addr, &opts).await;
    let seen = guard("server", server).await.unwrap().unwrap();
    assert!(seen.starts_with(b"hello"), "{seen:?}");
    assert!(
        seen[5..].iter().all(|&b| b == 0),
        "padding is zeros: {seen:?}"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejection_carries_private_data() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let request = listener.accept_request().await?;
        request.reject(b"go away: server full")
    });
    let result = guard(
        "connect",
        Endpoint::connect_with(addr, &EndpointOptions::new()),
    )
    .await;
    let err = result.expect_err("a rejected connect fails");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    let cm = err
        .get_ref()
        .and_then(|e| e.downcast_ref::<CmError>())
        .expect("a CmError inside");
    assert!(cm.is_consumer_reject(), "{cm}");
    assert!(
        cm.private_data().starts_with(b"go away: server full"),
        "{:?}",
        cm.private_data()
    );
    assert!(err.to_string().contains("rejected"), "{err}");
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test]
async fn nothing_listening_is_connection_refused() {
    // Bind and drop a listener to find a port where nothing listens now.
    let addr = test_addr(listener().await.local_addr().unwrap().port());
    let err = guard(
        "connect",
        Endpoint::connect_with(addr, &EndpointOptions::new()),
    )
    .await
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused, "{err}");
    assert!(err.to_string().contains("nothing listens"), "{err}");
}

#[rdma_async::test]
async fn unanswered_peer_fails_within_the_connect_timeout() {
    // On the RDMA netdev's subnet but no host there: the connection request is never answered
    // (the netdev resolves neighbours without ARP, so address resolution itself succeeds).
    let silent = match test_ip() {
        std::net::IpAddr::V4(ip) => {
            let o = ip.octets();
            std::net::IpAddr::from([o[0], o[1], o[2], o[3].wrapping_add(100)])
        }
        v6 => v6,
    };
    let opts = EndpointOptions::new()
        .resolve_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(2));
    let result = guard(
        "connect",
        Endpoint::connect_with(SocketAddr::new(silent, ports::UNREACHED), &opts),
    )
    .await;
    let (kind, msg) = err_kind(result);
    assert!(
        matches!(
            kind,
            io::ErrorKind::TimedOut | io::ErrorKind::HostUnreachable
        ),
        "{kind:?}: {msg}"
    );
    assert!(
        msg.contains(&silent.to_string()),
        "the message names the peer: {msg}"
    );
}

#[rdma_async::test]
async fn unroutable_address_fails_within_the_timeout() {
    // TEST-NET-1: no route in the test guest.
    let opts = EndpointOptions::new()
        .resolve_timeout(Duration::from_millis(500))
        .connect_timeout(Duration::from_secs(5));
    let result = guard(
        "connect",
        Endpoint::connect_with(("192.0.2.1", ports::UNREACHED), &opts),
    )
    .await;
    let (kind, msg) = err_kind(result);
    assert!(
        matches!(
            kind,
            io::ErrorKind::NetworkUnreachable
                | io::ErrorKind::HostUnreachable
                | io::ErrorKind::AddrNotAvailable
                | io::ErrorKind::TimedOut
        ),
        "{kind:?}: {msg}"
    );
}

#[rdma_async::test]
async fn unresolvable_name_is_a_clear_error() {
    let result = Endpoint::connect_with(
        ("no-such-host.invalid", ports::UNREACHED),
        &EndpointOptions::new(),
    )
    .await;
    let (_, msg) = err_kind(result);
    assert!(msg.contains("cannot resolve"), "{msg}");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn peer_disconnect_is_seen_after_its_messages() {
    let (ep, client) = endpoint_pair(&EndpointOptions::new()).await;
    let server = tokio::spawn(async move {
        for i in 0..3u8 {
            ep.send(&[i; 100]).await?;
        }
        ep.disconnect().await
    });
    for i in 0..3u8 {
        assert_eq!(
            &guard("recv", client.recv()).await.unwrap()[..],
            &[i; 100][..]
        );
    }
    let (kind, msg) = err_kind(guard("recv after disconnect", client.recv()).await);
    assert_eq!(kind, io::ErrorKind::ConnectionReset, "{msg}");
    guard("closed", client.closed()).await.unwrap();
    let (kind, msg) = err_kind(client.send(b"late").await);
    assert_eq!(kind, io::ErrorKind::BrokenPipe, "{msg}");
    guard("server", server).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropped_peer_is_seen_as_disconnect() {
    let (server, client) = endpoint_pair(&EndpointOptions::new()).await;
    drop(server);
    let (kind, msg) = err_kind(guard("recv", client.recv()).await);
    assert_eq!(kind, io::ErrorKind::ConnectionReset, "{msg}");
}

#[rdma_async::test]
async fn oversized_message_is_rejected_before_sending() {
    let (ep, client) = endpoint_pair(&EndpointOptions::new().max_message_size(256)).await;
    let server = tokio::spawn(async move {
        let msg = ep.recv().await?;
        ep.closed().await?;
        io::Result::Ok(msg)
    });
    let (kind, msg) = err_kind(client.send(&[0; 257]).await);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    client
        .send(&[7; 256])
        .await
        .expect("a message of exactly the maximum size");
    client.disconnect().await.unwrap();
    assert_eq!(
        &guard("server", server).await.unwrap().unwrap()[..],
        &[7; 256][..]
    );
}

#[rdma_async::test]
async fn device_list_shows_the_test_device() {
    let devices = rdma_async::device::devices().expect("list devices");
    assert!(
        !devices.is_empty(),
        "a device test runs where a device exists"
    );
    let sysfs: Vec<String> = std::fs::read_dir("/sys/class/infiniband")
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    for dev in &devices {
        assert!(
            sysfs.contains(&dev.name().to_owned()),
            "{} is in sysfs {sysfs:?}",
            dev.name()
        );
        assert_ne!(dev.node_guid(), 0, "{} has a node GUID", dev.name());
    }
}

/// A receiver whose messages are all already there never waits, so only Tokio's cooperative
/// budget makes it yield: another task on the same (single) worker must still get to run.
#[rdma_async::test]
async fn busy_receiver_lets_other_tasks_run() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    const N: usize = 256;
    let opts = EndpointOptions::new()
        .max_message_size(64)
        .recv_depth(N as u32)
        .send_depth(N as u32);
    let (ep, client) = endpoint_pair(&opts).await;
    let server = tokio::spawn(async move {
        for i in 0..N {
            ep.send(&(i as u32).to_le_bytes()).await?;
        }
        // Returns once every send completed, i.e. all N messages sit in the client's queue.
        ep.disconnect().await
    });
    guard("server", server).await.unwrap().unwrap();

    let ticks = Arc::new(AtomicUsize::new(0));
    let ticker = {
        let ticks = ticks.clone();
        tokio::spawn(async move {
            loop {
                ticks.fetch_add(1, Ordering::Relaxed);
                tokio::task::yield_now().await;
            }
        })
    };
    let mut ticks_seen_during_loop = 0;
    for i in 0..N {
        let msg = client.recv().await.expect("queued message");
        assert_eq!(&msg[..], &(i as u32).to_le_bytes(), "message {i} in order");
        if i < N - 1 {
            ticks_seen_during_loop = ticks.load(Ordering::Relaxed);
        }
    }
    ticker.abort();
    assert!(
        ticks_seen_during_loop > 0,
        "the ticker never ran while {N} queued messages were received"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_disconnect_ends_sends_and_receives_at_once() {
    let (ep, client) = endpoint_pair(&EndpointOptions::new()).await;
    let server = tokio::spawn(async move {
        let (kind, _) = err_kind(ep.recv().await);
        assert_eq!(kind, io::ErrorKind::ConnectionReset);
        ep.closed().await
    });
    client.disconnect().await.unwrap();
    let (kind, msg) = err_kind(client.send(b"after").await);
    assert_eq!(kind, io::ErrorKind::BrokenPipe, "{msg}");
    let (kind, msg) = err_kind(guard("recv", client.recv()).await);
    assert_eq!(kind, io::ErrorKind::NotConnected, "{msg}");
    guard("server", server).await.unwrap().unwrap();
    guard("closed", client.closed()).await.unwrap();
}

/// A thousand messages queued before the receiver looks (as a peer sending without pause keeps
/// its queue): one `recv` hands over at most a bounded batch of them, and every one still
/// arrives, in order, before the reset.
#[rdma_async::test]
async fn a_backlog_of_messages_is_handed_over_a_bounded_batch_at_a_time() {
    const MESSAGES: u32 = 1000;
    let opts = EndpointOptions::new().send_depth(16).recv_depth(1024);
    let (server, client) = endpoint_pair(&opts).await;
    for i in 0..MESSAGES {
        guard("send", client.send(&i.to_le_bytes())).await.unwrap();
    }
    // The disconnect waits for the sends' acknowledgements: every message completed a receive
    // of the server's before it looks.
    guard("disconnect", client.disconnect()).await.unwrap();
    let first = guard("recv", server.recv()).await.unwrap();
    assert_eq!(&first[..], &0u32.to_le_bytes());
    let queued = hooks::queued_messages(&server).expect("no receiver holds the queue");
    // A peer that keeps sending keeps the queue full: one look must not take all of it.
    assert!(
        queued < hooks::REAP_LIMIT,
        "the first recv took {} of {MESSAGES} queued messages in one go",
        queued + 1
    );
    for i in 1..MESSAGES {
        let msg = guard("recv", server.recv()).await.unwrap();
        assert_eq!(&msg[..], &i.to_le_bytes(), "message {i}");
    }
    let (kind, msg) = err_kind(guard("recv after disconnect", server.recv()).await);
    assert_eq!(kind, io::ErrorKind::ConnectionReset, "{msg}");
}

/// Only some sends are signaled (a quarter of `send_depth`'s, at most every 16th, and the one that
/// takes the last free slot): a sender that keeps the queue full still gets slots back, every
/// message arrives in order, and a disconnect after unsignaled sends waits for them (an empty
/// signaled write behind them reports their completion) before the peer sees the reset.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn few_sends_are_signaled_yet_every_message_arrives_before_the_disconnect() {
    const MESSAGES: u32 = 1000;
    // 16 slots: every 4th send is signaled.
    let opts = EndpointOptions::new().send_depth(16).recv_depth(64);
    let (server, client) = endpoint_pair(&opts).await;
    let sender = tokio::spawn(async move {
        // 1000 is no multiple of 4: the last sends go unsignaled.
        for i in 0..MESSAGES + 2 {
            let len = 8 + (i as usize * 7) % 300;
            let mut msg = vec![(i % 251) as u8; len];
            msg[..4].copy_from_slice(&i.to_le_bytes());
            client.send(&msg).await?;
        }
        client.disconnect().await?;
        Ok::<_, io::Error>(hooks::send_completions(&client))
    });
    for i in 0..MESSAGES + 2 {
        let msg = guard("recv", server.recv()).await.unwrap();
        assert_eq!(
            msg.len(),
            8 + (i as usize * 7) % 300,
            "message {i}'s length"
        );
        assert_eq!(u32::from_le_bytes(msg[..4].try_into().unwrap()), i, "order");
        assert!(
            msg[4..].iter().all(|&b| b == (i % 251) as u8),
            "message {i}'s bytes"
        );
    }
    let (kind, msg) = err_kind(guard("recv after disconnect", server.recv()).await);
    assert_eq!(kind, io::ErrorKind::ConnectionReset, "{msg}");
    let completions = guard("sender", sender).await.unwrap().unwrap();
    assert!(
        completions > 0 && completions * 3 <= u64::from(MESSAGES),
        "{completions} send completions for {MESSAGES} sends: about one per 4 expected"
    );
}
