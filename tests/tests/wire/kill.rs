//! A peer process killed mid-transfer across the wire (`kill -9` of C `rstream` on node 2): our
//! server reads every byte that arrived, intact, then `ConnectionReset` (it never closed, so
//! bytes may be missing: never a clean end-of-stream), never wrong bytes; the listener goes on serving the next client, and once the connections are gone
//! this process's RDMA resources are back where they were. One test, alone in its process
//! (`scripts/wire-tests` runs each module in its own): it counts the process's resources.

use std::io;
use std::net::SocketAddr;

use rdma_async::stream::RListener;
use rdma_async_device_tests::argv;
use rdma_async_device_tests::rstream_peer::{
    Counter, c_rstream_verify_args, recv, rstream_exchange, send,
};
use rdma_async_device_tests::wire::{PeerJob, peer_ip};
use rdma_async_device_tests::{guard, leak_counts, settled_counts, test_ip};
use tokio::io::AsyncReadExt;

/// C rstream's client in verify mode against `addr`: `-S size -C xfers -I 1`.
fn c_rstream_client(addr: SocketAddr, size: usize, xfers: usize) -> Vec<String> {
    let mut args = vec!["rstream".to_owned()];
    args.extend(c_rstream_verify_args(size, xfers, 1));
    args.extend(argv!["-s", addr.ip(), "-p", addr.port()]);
    args
}

async fn start(tag: &str, argv: &[String]) -> PeerJob {
    let argv: Vec<&str> = argv.iter().map(String::as_str).collect();
    PeerJob::start(tag, "", &argv).await
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_peer_process_ends_the_stream_cleanly_and_the_listener_serves_the_next() {
    let Some(peer) = peer_ip() else { return };
    let listener = RListener::bind(SocketAddr::new(test_ip(), 0))
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let baseline = leak_counts();

    // A long run that will not finish by itself before the kill.
    let doomed = start("kill-victim", &c_rstream_client(addr, 65_536, 1_000_000)).await;
    let (mut stream, from) = guard("accept C rstream", listener.accept()).await.unwrap();
    assert_eq!(from.ip(), peer);
    let (mut tx, mut rx) = (Counter::default(), Counter::default());
    let mut sync = [0u8; 16];
    guard("sync", recv(&mut stream, &mut rx, &mut sync)).await;
    guard("sync", send(&mut stream, &mut tx, &mut sync)).await;

    let mut buf = vec![0u8; 65_536];
    let mut total = 0usize;
    let mut killed = false;
    let end = guard("the stream of a killed peer ends", async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) => return Ok(()),
                Ok(n) => {
                    rx.check(&buf[..n]);
                    total += n;
                }
                Err(e) => return Err(e),
            }
            if !killed && total >= 1 << 20 {
                doomed.signal("KILL").await;
                killed = true;
            }
        }
    })
    .await;
    assert!(killed, "the peer sent only {total} bytes before it ended");
    // A killed rstream never sent rsockets' DISCONNECT: what it wrote after the last byte
    // read may be lost, so the stream must not end cleanly.
    let e = end
        .as_ref()
        .expect_err("a killed peer read as a clean end-of-stream");
    assert_eq!(e.kind(), io::ErrorKind::ConnectionReset, "{e}");
    eprintln!("killed peer: {total} bytes intact, then {end:?}");
    let (ok, _) = doomed.wait().await;
    assert!(!ok, "the killed rstream reported success");
    drop(stream);

    // The listener serves the next client from the same host.
    let next = start("kill-next", &c_rstream_client(addr, 4096, 50)).await;
    let (mut stream, _) = guard("accept the next client", listener.accept())
        .await
        .unwrap();
    guard(
        "exchange with the next client",
        rstream_exchange(&mut stream, false, 4096, 50, 1),
    )
    .await;
    let (ok, text) = next.wait().await;
    assert!(
        ok && text.contains("Gb/sec"),
        "C rstream on node 2:\n{text}"
    );
    drop(stream);

    // Dropped streams linger until their DISCONNECT is out: wait for the counts to settle.
    guard("resources back to the baseline", settled_counts(&baseline)).await;
}
