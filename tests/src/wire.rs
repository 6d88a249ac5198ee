//! Helpers of the wire tests (`tests/tests/wire/`), which run on node 1 of a
//! `scripts/softroce --pair` boot while their peers run on node 2 through `scripts/on-peer`.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};
use rdma_async::stream::RStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::guard;
use crate::tools::{output_text, package_program};

/// Prints the crate's warnings (a failed send, a protocol violation) into the test's captured
/// output, which a failed test shows. Once per process; later calls do nothing.
pub fn log_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .try_init();
}

/// Both nodes' transport counters (`rdma statistic show`: retransmissions, sequence errors,
/// exceeded retries...), for the message of a failed test on an impaired wire.
pub async fn transport_counters() -> String {
    let local = tokio::process::Command::new("rdma")
        .args(["statistic", "show"])
        .output()
        .await
        .map(|out| String::from_utf8_lossy(&out.stdout).into_owned())
        .unwrap_or_else(|e| format!("rdma statistic show: {e}"));
    let (_, peer) = on_peer(&["rdma", "statistic", "show"]).await;
    format!("node 1: {local}\nnode 2: {peer}")
}

/// Node 2's address, or `None` (after printing why) when this is not a pair boot and
/// `RDMA_ASYNC_REQUIRE_DEVICE=1` is not set: under it a missing peer fails the test.
pub fn peer_ip() -> Option<IpAddr> {
    match std::env::var("RDMA_ASYNC_PEER_ADDR") {
        Ok(v) if !v.is_empty() && std::env::var_os("RDMA_ASYNC_PEER_DIR").is_some() => Some(
            v.parse()
                .unwrap_or_else(|e| panic!("RDMA_ASYNC_PEER_ADDR={v:?}: {e}")),
        ),
        _ if std::env::var("RDMA_ASYNC_REQUIRE_DEVICE").as_deref() == Ok("1") => panic!(
            "RDMA_ASYNC_PEER_ADDR / RDMA_ASYNC_PEER_DIR are not set: run the wire tests under \
             scripts/softroce --pair (scripts/test does)"
        ),
        _ => {
            println!("skipped: no peer node (run under scripts/softroce --pair)");
            None
        }
    }
}

/// The `scripts/on-peer` of this checkout.
pub fn on_peer_script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../scripts/on-peer")
}

/// The `wire-peer` program (this package's binary).
pub fn peer_program() -> String {
    package_program("wire-peer")
}

async fn on_peer_raw(args: &[String]) -> Output {
    let mut cmd = tokio::process::Command::new(on_peer_script());
    cmd.args(args).kill_on_drop(true);
    guard(&format!("on-peer {args:?}"), cmd.output())
        .await
        .unwrap_or_else(|e| panic!("run scripts/on-peer: {e}"))
}

/// Runs `args` on node 2; returns whether it succeeded and what it printed.
pub async fn on_peer(args: &[&str]) -> (bool, String) {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    let out = on_peer_raw(&args).await;
    (out.status.success(), output_text(&out))
}

/// As [`on_peer`], asserting success.
pub async fn on_peer_ok(args: &[&str]) -> String {
    let (ok, text) = on_peer(args).await;
    assert!(ok, "on node 2: {args:?} failed:\n{text}");
    text
}

/// A background command on node 2.
#[derive(Debug)]
pub struct PeerJob {
    name: String,
    done: bool,
}

static JOBS: AtomicUsize = AtomicUsize::new(0);

impl PeerJob {
    /// Starts `args` on node 2 and returns once it printed `ready`.
    pub async fn start(tag: &str, ready: &str, args: &[&str]) -> PeerJob {
        let name = format!(
            "{tag}-{}-{}",
            std::process::id(),
            JOBS.fetch_add(1, Ordering::Relaxed)
        );
        let mut all: Vec<String> = vec!["--start".into(), name.clone()];
        if !ready.is_empty() {
            all.extend(["--ready".into(), ready.into()]);
        }
        all.extend(args.iter().map(|s| s.to_string()));
        let out = on_peer_raw(&all).await;
        assert!(
            out.status.success(),
            "start {args:?} on node 2:\n{}",
            output_text(&out)
        );
        PeerJob { name, done: false }
    }

    /// Waits for the job to end; whether it succeeded and what it printed.
    pub async fn wait(mut self) -> (bool, String) {
        self.done = true;
        let out = on_peer_raw(&["--wait".into(), self.name.clone()]).await;
        (out.status.success(), output_text(&out))
    }

    /// Sends `signal` (`KILL`, `TERM`, ...) to the job.
    pub async fn signal(&self, signal: &str) {
        let out = on_peer_raw(&["--kill".into(), self.name.clone(), signal.into()]).await;
        assert!(
            out.status.success(),
            "kill {}: {}",
            self.name,
            output_text(&out)
        );
    }

    /// Ends the job (TERM) and waits for it; returns what it printed.
    pub async fn stop(self) -> String {
        self.signal("TERM").await;
        self.wait().await.1
    }
}

impl Drop for PeerJob {
    fn drop(&mut self) {
        if !self.done {
            // A test that failed halfway: do not leave its server running (best effort).
            let _ = std::process::Command::new(on_peer_script())
                .args(["--kill", &self.name, "KILL"])
                .output();
        }
    }
}

/// FNV-1a, 64-bit: both ends hash what they sent and received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fnv(pub u64);

impl Default for Fnv {
    fn default() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
}

impl Fnv {
    /// Hashes `bytes` into the running value.
    pub fn update(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 ^= u64::from(b);
            self.0 = self.0.wrapping_mul(0x0100_0000_01b3);
        }
    }

    /// The hash of `bytes` alone.
    pub fn of(bytes: &[u8]) -> u64 {
        let mut h = Fnv::default();
        h.update(bytes);
        h.0
    }
}

/// `ip:port` on node 2.
pub fn peer_addr(ip: IpAddr, port: u16) -> SocketAddr {
    SocketAddr::new(ip, port)
}

/// Connects with `connect`, retrying (boundedly) while refused or unreachable: a peer program
/// just started on node 2 may not listen yet.
pub async fn connect_retrying<T, F, Fut>(connect: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    connect_retrying_timeouts(connect, 0).await
}

/// [`connect_retrying`] for the first connection after the wire was dead: also retries up to 3
/// timed-out attempts. Node 1's neighbour (ARP) entry for node 2 can still be failed from the
/// outage, and the first address resolution may time out (rdma_cm's 2 s) before the kernel's
/// next probe is answered; a program would try again too.
pub async fn connect_after_outage<T, F, Fut>(connect: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    connect_retrying_timeouts(connect, 3).await
}

async fn connect_retrying_timeouts<T, F, Fut>(mut connect: F, mut timeouts: u32) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    let mut last = None;
    for _ in 0..100 {
        match guard("connect across the wire", connect()).await {
            Ok(conn) => return conn,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                last = Some(e);
                tokio::task::yield_now().await
            }
            Err(e) if e.kind() == io::ErrorKind::TimedOut && timeouts > 0 => {
                eprintln!("connect across the wire timed out, trying again: {e}");
                timeouts -= 1;
                last = Some(e);
            }
            Err(e) => panic!("connect across the wire: {e}"),
        }
    }
    panic!("node 2's server never accepted: {last:?}");
}

/// The wire is shared: the tests that impair it hold this, one impairment at a time.
pub static WIRE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Hang guard for a transfer on an impaired wire (a bound, not a timing assertion).
pub const IMPAIRED: Duration = Duration::from_secs(240);

/// A netem qdisc on node 2's NIC and, unless only the peer's packets are to suffer, node 1's
/// (each impairs what its node sends), removed on drop.
#[derive(Debug)]
pub struct Netem {
    local_if: Option<String>,
    peer_if: String,
}

impl Netem {
    /// `tc qdisc add dev IF root netem SPEC...` on both nodes.
    pub async fn both(spec: &str) -> Netem {
        let local_if = std::env::var("RDMA_ASYNC_TEST_IF").expect("RDMA_ASYNC_TEST_IF");
        let spec: Vec<&str> = spec.split_whitespace().collect();
        let mut local = vec!["qdisc", "replace", "dev", &local_if, "root", "netem"];
        local.extend(&spec);
        let out = tokio::process::Command::new("tc")
            .args(&local)
            .output()
            .await
            .expect("run tc");
        assert!(out.status.success(), "tc {local:?}: {}", output_text(&out));
        let mut netem = Self::peer_only(&spec.join(" ")).await;
        netem.local_if = Some(local_if);
        netem
    }

    /// `tc qdisc add dev IF root netem SPEC...` on node 2 only: what node 2 sends suffers.
    pub async fn peer_only(spec: &str) -> Netem {
        let peer_if = std::env::var("RDMA_ASYNC_PEER_IF").expect("RDMA_ASYNC_PEER_IF");
        let mut peer = vec!["tc", "qdisc", "replace", "dev", &peer_if, "root", "netem"];
        peer.extend(spec.split_whitespace());
        on_peer_ok(&peer).await;
        Netem {
            local_if: None,
            peer_if,
        }
    }
}

impl Drop for Netem {
    fn drop(&mut self) {
        if let Some(local_if) = &self.local_if {
            let _ = std::process::Command::new("tc")
                .args(["qdisc", "del", "dev", local_if, "root"])
                .output();
        }
        let _ = std::process::Command::new(on_peer_script())
            .args(["tc", "qdisc", "del", "dev", &self.peer_if, "root"])
            .output();
    }
}

/// Writes `data` through one half while reading the echo through the other, half-closes
/// after the last byte and reads to EOF: the echo must be `data`, byte for byte.
pub async fn echo_through(stream: &mut RStream, data: &[u8], chunk: usize) {
    if let Err(e) = try_echo_through(stream, data, chunk).await {
        panic!("{e}");
    }
}

/// [`echo_through`], with what went wrong as an error (for a caller that adds the peer's
/// view before failing).
pub async fn try_echo_through(
    stream: &mut RStream,
    data: &[u8],
    chunk: usize,
) -> Result<(), String> {
    let (mut rd, mut wr) = tokio::io::split(stream);
    let writer = async {
        for piece in data.chunks(chunk) {
            wr.write_all(piece).await?;
        }
        wr.shutdown().await
    };
    let reader = async {
        let mut got = Vec::with_capacity(data.len());
        rd.read_to_end(&mut got).await?;
        io::Result::Ok(got)
    };
    let (w, r) = tokio::join!(writer, reader);
    w.map_err(|e| format!("write across the wire: {e}"))?;
    let got = r.map_err(|e| format!("read the echo: {e}"))?;
    if got.len() != data.len() {
        return Err(format!("{} bytes echoed of {} sent", got.len(), data.len()));
    }
    if got != data {
        return Err("the echo differs from what was sent".into());
    }
    Ok(())
}

/// Connects to `wire-peer rdma` and learns its region.
pub async fn rdma_client(addr: SocketAddr) -> (RdmaConnection, RemoteRegion) {
    let opts = RdmaOptions::new();
    let conn = connect_retrying(|| RdmaConnection::connect_with(addr, &opts)).await;
    let (got, msg) = guard(
        "region descriptor",
        conn.recv(conn.reg_msgs(64).unwrap(), ..),
    )
    .await;
    let n = got.unwrap().len();
    let remote = RemoteRegion::from_bytes(&msg[..n]).unwrap();
    (conn, remote)
}

/// Asks node 2 for the FNV hash of its region.
pub async fn remote_hash(conn: &RdmaConnection) -> u64 {
    let mut msg = conn.reg_msgs(4).unwrap();
    msg.copy_from_slice(b"hash");
    let recv = conn.recv(conn.reg_msgs(64).unwrap(), ..);
    let send = conn.send(msg, ..);
    let ((got, reply), (sent, _)) = guard("hash", async { tokio::join!(recv, send) }).await;
    sent.unwrap();
    assert_eq!(got.unwrap().len(), 8);
    u64::from_le_bytes(reply[..8].try_into().unwrap())
}

/// Writes `data` over the whole remote region in `chunk`-byte RDMA writes, checks node 2's
/// hash of it, reads it back in one RDMA read and compares.
pub async fn rdma_write_read_check(
    conn: &RdmaConnection,
    remote: &RemoteRegion,
    data: &[u8],
    chunk: usize,
) {
    assert_eq!(remote.len() as usize, data.len());
    let mut src = conn.reg_msgs(data.len()).unwrap();
    src.copy_from_slice(data);
    let mut off = 0;
    while off < data.len() {
        let n = chunk.min(data.len() - off);
        let slice = remote.slice(off as u32, n as u32).unwrap();
        let (r, back) = conn.write(src, off..off + n, slice).await;
        r.expect("RDMA write across the wire");
        src = back;
        off += n;
    }
    assert_eq!(
        remote_hash(conn).await,
        Fnv::of(data),
        "node 2's region after the writes"
    );
    let (r, dst) = conn
        .read(conn.reg_msgs(data.len()).unwrap(), .., remote.whole())
        .await;
    r.expect("RDMA read across the wire");
    assert!(dst[..] == data[..], "RDMA read returned other bytes");
}

/// hyper-util's pooled client over RDMA, HTTP/2 with prior knowledge when `http2`.
pub fn http_client(
    http2: bool,
) -> hyper_util::client::legacy::Client<
    rdma_async::integration::hyper::RConnector,
    http_body_util::Empty<bytes::Bytes>,
> {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .http2_only(http2)
        .build(rdma_async::integration::hyper::RConnector::new())
}

/// One GET of `path` from `examples/http_server` at `addr`: status 200, the protocol asked for,
/// and the server's greeting naming the path and this node.
pub async fn check_greeting_get(
    client: &hyper_util::client::legacy::Client<
        rdma_async::integration::hyper::RConnector,
        http_body_util::Empty<bytes::Bytes>,
    >,
    addr: SocketAddr,
    path: &str,
    http2: bool,
) {
    use http_body_util::BodyExt;
    let uri: http::Uri = format!("http://{addr}{path}").parse().unwrap();
    let response = client.get(uri).await.expect("response");
    assert_eq!(response.status(), 200);
    let want = if http2 {
        http::Version::HTTP_2
    } else {
        http::Version::HTTP_11
    };
    assert_eq!(response.version(), want);
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let body = String::from_utf8_lossy(&body);
    assert!(
        body.contains(&format!("you asked for {path} over RDMA"))
            && body.contains(&format!("hello {}:", crate::test_ip())),
        "{body}"
    );
}

/// A tonic channel over RDMA to the server at `addr`, retried while it starts.
pub async fn tonic_channel(addr: SocketAddr) -> tonic::transport::Channel {
    connect_retrying(|| async {
        tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .unwrap()
            .connect_with_connector(rdma_async::integration::hyper::RConnector::new())
            .await
            .map_err(|e| io::Error::new(io::ErrorKind::ConnectionRefused, e))
    })
    .await
}
