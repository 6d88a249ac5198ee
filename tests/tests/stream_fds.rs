//! How many file descriptors an `RStream` holds, on each side: at most 2 (C rsockets holds 2 per
//! socket), and at most 1 with shared channels (`RStreamOptions::shared_channels`), so that a
//! process can keep thousands of streams open under a common descriptor limit.
//!
//! Descriptors are process-wide, so each side runs in a process of its own: this test accepts,
//! and a second copy of this binary, started with `FDS_CONNECT_TO` set, connects. Each side
//! counts `/proc/self/fd` before and after opening its streams. A binary of its own, whose tests
//! run one at a time: no other test may open descriptors meanwhile.

use std::net::SocketAddr;
use std::process::Stdio;

use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::streams::echo_once;
use rdma_async_device_tests::{guard, rlistener_with};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// Streams opened on each side.
const STREAMS: usize = 8;
/// Set in the connecting child: the address to connect to.
const CONNECT_TO: &str = "FDS_CONNECT_TO";

/// How the streams of a test are made.
#[derive(Clone, Copy)]
struct Mode {
    /// The test's name, for the child's `--exact` filter.
    test: &'static str,
    /// `RStreamOptions::shared_channels`, on both sides.
    shared_channels: bool,
    /// The most descriptors one stream may hold.
    max_fds_per_stream: usize,
}

impl Mode {
    fn options(self) -> RStreamOptions {
        RStreamOptions::new().shared_channels(self.shared_channels)
    }
}

const OWN_CHANNELS: Mode = Mode {
    test: "each_side_of_a_stream_holds_at_most_two_descriptors",
    shared_channels: false,
    max_fds_per_stream: 2,
};

const SHARED_CHANNELS: Mode = Mode {
    test: "with_shared_channels_each_side_of_a_stream_holds_at_most_one_descriptor",
    shared_channels: true,
    max_fds_per_stream: 1,
};

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .expect("list /proc/self/fd")
        .count()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_side_of_a_stream_holds_at_most_two_descriptors() {
    count_descriptors(OWN_CHANNELS).await;
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_shared_channels_each_side_of_a_stream_holds_at_most_one_descriptor() {
    count_descriptors(SHARED_CHANNELS).await;
}

/// Opens [`STREAMS`] streams in `mode` on each side, echoes on each, and asserts how many
/// descriptors each side's streams hold.
async fn count_descriptors(mode: Mode) {
    if let Ok(addr) = std::env::var(CONNECT_TO) {
        return connect_side(addr.parse().expect("FDS_CONNECT_TO is an address"), mode).await;
    }
    // The tests of this binary count the same process's descriptors: one at a time.
    static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    let _alone = ONE_AT_A_TIME.lock().await;
    let max_fds_per_stream = mode.max_fds_per_stream;
    let listener = rlistener_with(mode.options()).await;
    let addr = listener.local_addr().unwrap();
    // One stream first, so that what every process opens once (the device's verbs context,
    // its event reader, the runtime's shared state) is not counted against the streams.
    let mut child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", mode.test, "--nocapture", "--test-threads=1"])
        .env(CONNECT_TO, addr.to_string())
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run the connecting side");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut first, _) = guard("the first accept", listener.accept()).await.unwrap();
    let before = open_fds();
    let mut streams = vec![];
    for _ in 0..STREAMS {
        streams.push(guard("accept", listener.accept()).await.unwrap().0);
    }
    let accepted = open_fds() - before;
    // Echo on every stream: each one works, not only exists.
    for stream in std::iter::once(&mut first).chain(&mut streams) {
        let mut buf = [0; 5];
        guard("echo", stream.read_exact(&mut buf)).await.unwrap();
        guard("echo", stream.write_all(&buf)).await.unwrap();
    }
    let connected = guard("the connecting side's count", async {
        loop {
            let line = lines.next_line().await.unwrap().expect("the child's count");
            // Anywhere in the line: the test harness's own "test NAME ... " may come first.
            if let Some((_, n)) = line.split_once("connect side: new descriptors ") {
                break n.trim().parse::<usize>().unwrap();
            }
        }
    })
    .await;
    drop(streams);
    drop(first);
    let status = guard("the connecting side ends", child.wait())
        .await
        .unwrap();
    assert!(status.success(), "the connecting side failed: {status}");
    println!(
        "{STREAMS} streams: accepting side {accepted} descriptors, connecting side {connected}"
    );
    assert!(
        accepted <= max_fds_per_stream * STREAMS,
        "{STREAMS} accepted streams hold {accepted} descriptors: more than {max_fds_per_stream} \
         each"
    );
    assert!(
        connected <= max_fds_per_stream * STREAMS,
        "{STREAMS} connected streams hold {connected} descriptors: more than \
         {max_fds_per_stream} each"
    );
}

/// The child: connects one stream, counts, connects [`STREAMS`] more, counts again, echoes on
/// each, prints the difference, and reads each stream to its end.
async fn connect_side(addr: SocketAddr, mode: Mode) {
    let options = mode.options();
    let mut first = guard("connect", RStream::connect_with(addr, &options))
        .await
        .unwrap();
    let before = open_fds();
    let mut streams = vec![];
    for _ in 0..STREAMS {
        let stream = guard("connect", RStream::connect_with(addr, &options)).await;
        streams.push(stream.unwrap());
    }
    let opened = open_fds() - before;
    for stream in std::iter::once(&mut first).chain(&mut streams) {
        guard("echo", echo_once(stream, b"hello")).await.unwrap();
    }
    println!("connect side: new descriptors {opened}");
    for mut stream in std::iter::once(first).chain(streams) {
        let mut rest = vec![];
        guard("the end of the stream", stream.read_to_end(&mut rest))
            .await
            .unwrap();
        assert!(rest.is_empty());
    }
}
