//! Bytes that `write_all` accepted are never lost silently: a writer on node 2 writes, and then
//! returns from its main (multi-thread and current-thread runtimes), drops its stream outside
//! any runtime, exits the process with the stream open, or is killed (SIGKILL), while netem drops 1 % of
//! node 2's packets, so sends are still unacknowledged when it goes. (At 3 % Soft-RoCE itself
//! gives up now and then: it counts every retransmission against the transport retry count
//! until a whole 64 KiB write is acknowledged, and about one 512 KiB transfer in eight failed
//! with "transport retry counter exceeded" before any byte arrived. The writer's linger is set
//! long for the same reason: see `WRITE_CLOSE_LINGER` in `wire-peer`.) The reader on node 1 gets
//! every byte then end-of-stream where the writer's close could drain its sends (the first
//! three), and otherwise the bytes that arrived, intact, then `ConnectionReset`: never a clean
//! end-of-stream with bytes missing, never a hang. Sizes below and above a ring (128 KiB).
//! Before the fix (at 3 % loss), the reader of a multi-thread main got 917,504 of 1,048,576
//! bytes, of a current-thread main 131,072 of 262,144, of a killed writer 983,040 of
//! 1,048,576, each then a clean EOF.

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::test_ip;
use rdma_async_device_tests::wire::{
    IMPAIRED, Netem, PeerJob, WIRE, log_warnings, peer_ip, peer_program,
};
use tokio::io::AsyncReadExt;

/// Reads until end-of-stream or an error; what arrived, and how it ended.
async fn read_until_end(stream: &mut RStream) -> (Vec<u8>, io::Result<()>) {
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match stream.read(&mut buf).await {
            Ok(0) => return (got, Ok(())),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => return (got, Err(e)),
        }
    }
}

/// Runs `wire-peer write-close` against a listener here with netem on node 2; returns what
/// the reader saw and the writer's exit and log.
async fn write_then_go(how: &str, bytes: usize, seed: u64) -> Outcome {
    let peer = peer_ip().expect("a peer node");
    log_warnings();
    let _wire = WIRE.lock().await;
    // The reader keeps alive: a writer that exits or is killed leaves its disconnect to the
    // kernel, and when that request is lost on the impaired wire only a keepalive (or a credit
    // update of the reader's) finds the writer's queue pair gone; without one the reader would
    // wait, as a TCP reader without keepalive waits for a host that vanished.
    let keepalive = RStreamOptions::new().keepalive(Duration::from_secs(1));
    let listener = RListener::bind_with(SocketAddr::new(test_ip(), 0), &keepalive)
        .await
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let netem = Netem::peer_only("loss 1%").await;
    let args = [
        peer_program(),
        "write-close".into(),
        addr.to_string(),
        bytes.to_string(),
        seed.to_string(),
        how.into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let job = PeerJob::start(&format!("close-{how}"), "", &args).await;
    let reader = async {
        let (mut stream, from) = listener.accept().await.expect("accept the writer");
        assert_eq!(from.ip(), peer);
        read_until_end(&mut stream).await
    };
    let (got, end) = tokio::time::timeout(IMPAIRED, reader)
        .await
        .unwrap_or_else(|_| panic!("{how}: the reader hung on the impaired wire"));
    let (writer_ok, log) = job.wait().await;
    drop(netem);
    let data = pattern(seed, bytes);
    assert!(
        data.starts_with(&got),
        "{how}: the reader got {} bytes that are not what was written\nnode 2:\n{log}",
        got.len()
    );
    eprintln!("{how}, {bytes} bytes: {} arrived, then {end:?}", got.len());
    Outcome {
        complete: got.len() == bytes,
        end,
        writer_ok,
        log,
    }
}

struct Outcome {
    complete: bool,
    end: io::Result<()>,
    writer_ok: bool,
    log: String,
}

impl Outcome {
    /// The writer closed: every byte arrived, then end-of-stream.
    #[track_caller]
    fn assert_delivered(&self, how: &str) {
        assert!(self.writer_ok, "{how}: the writer failed:\n{}", self.log);
        assert!(
            self.complete && self.end.is_ok(),
            "{how}: the reader saw {:?} after {} bytes; every byte then end-of-stream was due\n\
             node 2:\n{}",
            self.end,
            if self.complete { "all" } else { "missing" },
            self.log
        );
    }

    /// The writer never closed: the reader's stream ends in a reset, whatever arrived.
    #[track_caller]
    fn assert_reset(&self, how: &str) {
        let err = self.end.as_ref().expect_err(&format!(
            "{how}: a writer that never closed read as a clean end-of-stream ({})",
            if self.complete {
                "all bytes"
            } else {
                "bytes missing"
            }
        ));
        // The reset is the CM's disconnect without rsockets' DISCONNECT, or, when the reader
        // had a credit update in flight to the dead peer, that send's flush: either way the
        // message names the peer and says it reset. When the kernel's disconnect request was
        // lost, the keepalive's retries run out instead: `TimedOut`, naming the peer.
        assert!(
            matches!(
                err.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::TimedOut
            ),
            "{how}: {err}\nnode 2:\n{}",
            self.log
        );
        let peer = peer_ip().expect("a peer node").to_string();
        let message = err.to_string();
        if err.kind() == io::ErrorKind::ConnectionReset {
            assert!(
                message.contains(&format!("connection with {peer}")) && message.contains("reset"),
                "{how}: the error does not name the peer and the reset: {err}"
            );
        } else {
            assert!(
                message.contains(&peer),
                "{how}: the error does not name the peer: {err}"
            );
        }
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_from_a_multi_thread_main_delivers_every_byte() {
    write_then_go("return-multi", 512 << 10, 11)
        .await
        .assert_delivered("return-multi");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_from_a_multi_thread_main_below_a_ring_delivers_every_byte() {
    write_then_go("return-multi", 64 << 10, 16)
        .await
        .assert_delivered("return-multi, 64 KiB");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn returning_from_a_current_thread_main_delivers_every_byte() {
    write_then_go("return-current", 256 << 10, 12)
        .await
        .assert_delivered("return-current");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_outside_any_runtime_delivers_every_byte() {
    write_then_go("no-runtime", 512 << 10, 13)
        .await
        .assert_delivered("no-runtime");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_writer_that_exits_without_closing_reads_as_a_reset() {
    let outcome = write_then_go("exit", 256 << 10, 14).await;
    assert!(outcome.writer_ok, "exit: {}", outcome.log);
    outcome.assert_reset("exit");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_writer_reads_as_a_reset() {
    let outcome = write_then_go("kill", 512 << 10, 15).await;
    assert!(!outcome.writer_ok, "the killed writer reported success");
    outcome.assert_reset("killed");
}
