//! Accepting under hostile peers and exhausted resources: handshakes
//! that peers park, a process out of file descriptors, and churn beside long-lived connections.
//!
//! A binary of its own: its tests count this process's RDMA resources and change its
//! descriptor limit, so they take turns ([`EXCLUSIVE`]) and no other test runs beside them.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdma_async::cm::{ParkedConnect, ParkedOutcome};
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::hooks;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::pairs::stream_pair_on;
use rdma_async_device_tests::streams::echo_once;
use rdma_async_device_tests::{guard, leak_counts, listener, rlistener_with, settled_counts};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

/// The tests of this binary run one at a time (process-wide counts and limits).
static EXCLUSIVE: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Small rings and queues: hundreds of connections at once fit the guest's memory.
fn small() -> RStreamOptions {
    RStreamOptions::new()
        .send_buffer_size(8192)
        .recv_buffer_size(8192)
        .sq_size(16)
        .rq_size(16)
}

/// Echoes until the peer closes or the connection fails.
async fn echo_server(mut stream: RStream) {
    let mut buf = vec![0; 4096];
    while let Ok(n) = stream.read(&mut buf).await {
        if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
            break;
        }
    }
}

/// `count` clients that send a connection request to `addr` with `data` and then never
/// complete the handshake.
async fn park(addr: SocketAddr, data: &[u8], count: usize) -> Vec<ParkedConnect> {
    let mut parked = Vec::with_capacity(count);
    for _ in 0..count {
        let client = ParkedConnect::resolve(addr).await.expect("resolve");
        client.send_request(data).expect("send the request");
        parked.push(client);
    }
    parked
}

/// Asserts that the listener accepted the parked request and then rejected it.
#[track_caller]
fn assert_answered_then_rejected(outcome: &ParkedOutcome, which: &str) {
    assert!(outcome.answered, "{which}: the listener never accepted it");
    assert_eq!(
        outcome.end.kind(),
        io::ErrorKind::ConnectionRefused,
        "{which}: {}",
        outcome.end
    );
}

/// 100 clients park their handshakes with an `RListener` (64 handshake slots): each is rejected
/// at the deadline and its id destroyed, and a client that comes after all of them is accepted
/// once the first ones have timed out. Without a deadline the slots stay taken for as long as
/// rdma_cm waits (it had not given up after 3 minutes), and the client is not served in time.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn parked_handshakes_end_at_the_deadline_and_later_clients_are_served() {
    let _alone = EXCLUSIVE.lock().await;
    let deadline = Duration::from_secs(3);
    // All 100 come from this host's one address: let it hold every slot, as the deadline is
    // what is tested here (`listener_memlock.rs` tests the bound on one address's share).
    let opts = small().accept_timeout(deadline).handshakes_per_source(100);
    let listener = rlistener_with(opts.clone()).await;
    let addr = listener.local_addr().unwrap();
    let baseline = leak_counts();

    let parked = park(addr, &hooks::request_data(&opts), 100).await;
    let started = Instant::now();
    // 64 parked handshakes fill the slots; they end at the deadline, then the other 36 and
    // this client get slots (7–12 s in the guest under load). The hang guard (60 s) is twenty
    // deadlines; without them rdma_cm had not ended a parked handshake after 3 minutes.
    let (accepted, connected) = guard("a client behind 100 parked handshakes", async {
        tokio::join!(listener.accept(), RStream::connect_with(addr, &opts))
    })
    .await;
    let (mut server, _peer) = accepted.expect("accept");
    let mut client = connected.expect("connect");
    eprintln!(
        "the client behind 100 parked handshakes was served after {:?}",
        started.elapsed()
    );
    client.write_all(b"behind the parked ones").await.unwrap();
    let mut got = [0u8; 22];
    server.read_exact(&mut got).await.unwrap();
    server.write_all(&got).await.unwrap();
    client.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"behind the parked ones");
    drop((server, client));

    // Every parked request was accepted, then rejected when its deadline passed. The server
    // keeps accepting meanwhile, as servers do, so every request reaches a slot.
    let listener = Arc::new(listener);
    let acceptor = tokio::spawn({
        let listener = listener.clone();
        async move { listener.accept().await.map(|(_, peer)| peer) }
    });
    for (i, client) in parked.iter().enumerate() {
        let outcome = guard("a parked request's end", client.outcome()).await;
        assert_answered_then_rejected(&outcome, &format!("parked client {i}"));
    }
    assert!(
        !acceptor.is_finished(),
        "accept returned with only parked clients: {:?}",
        acceptor.await
    );
    acceptor.abort();
    assert!(acceptor.await.unwrap_err().is_cancelled());

    // The server destroyed every parked request's id: besides the baseline only the parked
    // clients' own ids remain (they have no queue pairs; the server's are gone).
    let mut expected = baseline.clone();
    expected[0] += parked.len();
    guard(
        "the server's ids of the parked requests",
        settled_counts(&expected),
    )
    .await;
    drop(parked);
    guard("the parked clients' ids", settled_counts(&baseline)).await;
}

/// A parked request under `CmListener` with `Endpoint::accept` and `RdmaConnection::accept`:
/// the accept fails with `TimedOut` at its `accept_timeout` and the peer sees a rejection.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parked_request_ends_endpoint_and_rdma_accepts_at_the_deadline() {
    let _alone = EXCLUSIVE.lock().await;
    let deadline = Duration::from_secs(2);
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let baseline = leak_counts();

    let parked = park(addr, b"parked", 2).await;
    let request = guard("request", listener.accept_request()).await.unwrap();
    let err = guard(
        "Endpoint::accept of a parked request",
        Endpoint::accept(request, &EndpointOptions::new().accept_timeout(deadline)),
    )
    .await
    .expect_err("the parked request never completes");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");
    assert!(err.to_string().contains("did not complete"), "{err}");

    let request = guard("request", listener.accept_request()).await.unwrap();
    let err = guard(
        "RdmaConnection::accept of a parked request",
        RdmaConnection::accept(request, &RdmaOptions::new().accept_timeout(deadline)),
    )
    .await
    .expect_err("the parked request never completes");
    assert_eq!(err.kind(), io::ErrorKind::TimedOut, "{err}");

    for (i, client) in parked.iter().enumerate() {
        let outcome = guard("a parked request's end", client.outcome()).await;
        assert_answered_then_rejected(&outcome, &format!("parked client {i}"));
    }
    drop(parked);
    guard("everything released", settled_counts(&baseline)).await;
}

/// This process's soft limit on open descriptors, held at its current use: every descriptor
/// below the lowered limit but `free` is taken (by `/dev/null`), so the open after those fails
/// with `EMFILE`. Dropping it closes them and restores the limit.
struct DescriptorsExhausted {
    _held: Vec<std::fs::File>,
    soft: String,
    hard: String,
}

impl DescriptorsExhausted {
    /// All but `free` descriptors taken.
    fn leaving(free: usize) -> Self {
        let (soft, hard) = nofile_limits();
        let highest = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u64>().ok())
            .max()
            .unwrap();
        // A few spare numbers above the highest descriptor (prlimit's own pipes close before
        // it returns), then fill every free number below the limit.
        set_nofile(&(highest + 16).to_string(), &hard);
        let mut held = Vec::new();
        loop {
            match std::fs::File::open("/dev/null") {
                Ok(f) => held.push(f),
                Err(e) if e.raw_os_error() == Some(24) => break,
                Err(e) => panic!("open /dev/null: {e}"),
            }
        }
        assert!(!held.is_empty());
        // `free` numbers left for the code under test.
        held.truncate(held.len() - free);
        DescriptorsExhausted {
            _held: held,
            soft,
            hard,
        }
    }
}

impl Drop for DescriptorsExhausted {
    fn drop(&mut self) {
        self._held.clear();
        set_nofile(&self.soft, &self.hard);
    }
}

/// This process's `RLIMIT_NOFILE` (soft, hard) as `/proc/self/limits` shows them.
fn nofile_limits() -> (String, String) {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .expect("Max open files in /proc/self/limits");
    let fields: Vec<&str> = line.split_whitespace().collect();
    (fields[3].to_owned(), fields[4].to_owned())
}

/// Sets this process's `RLIMIT_NOFILE` with util-linux's `prlimit` (no `unsafe` here).
fn set_nofile(soft: &str, hard: &str) {
    let status = std::process::Command::new("prlimit")
        .arg("--pid")
        .arg(std::process::id().to_string())
        .arg(format!("--nofile={soft}:{hard}"))
        .status()
        .expect("run prlimit");
    assert!(status.success(), "prlimit --nofile={soft}:{hard}: {status}");
    assert_eq!(nofile_limits(), (soft.to_owned(), hard.to_owned()));
}

/// A request that arrives while the process is out of descriptors: `accept` returns its error
/// (`EMFILE`, naming the listener, or the peer when the handshake ran out) and the peer is
/// rejected, as `TcpListener::accept` returns `EMFILE`; the listener stays usable. Through `into_incoming` the failure is skipped and the
/// stream goes on: once descriptors are free again, new connections are served. (Before, the
/// first such error ended `into_incoming` for good, and with it a tonic or axum server.)
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn out_of_descriptors_fails_one_request_not_the_listener() {
    let _alone = EXCLUSIVE.lock().await;
    let opts = small();
    let listener = rlistener_with(opts.clone()).await;
    let addr = listener.local_addr().unwrap();
    let data = hooks::request_data(&opts);
    // One full connection first: the device is open in this process from here on.
    let (server, mut client) = stream_pair_on(&listener, &opts).await;
    tokio::spawn(echo_server(server));
    echo_once(&mut client, b"warm").await.unwrap();

    // accept(): the request's error, and the listener goes on.
    let parked = ParkedConnect::resolve(addr).await.unwrap();
    let exhausted = DescriptorsExhausted::leaving(0);
    parked.send_request(&data).unwrap();
    let err = guard("accept without descriptors", listener.accept())
        .await
        .expect_err("no descriptor for the request's channel");
    drop(exhausted);
    assert!(
        err.to_string().contains("Too many open files"),
        "the error says what ran out: {err}"
    );
    let outcome = guard("the refused request's end", parked.outcome()).await;
    assert!(!outcome.answered);
    assert_eq!(outcome.end.kind(), io::ErrorKind::ConnectionRefused);
    let (server, mut next) = stream_pair_on(&listener, &opts).await;
    tokio::spawn(echo_server(server));
    echo_once(&mut next, b"the listener goes on").await.unwrap();

    // One descriptor left: the request gets its channel, and its handshake finds none for the
    // completion channel. accept() returns that error, naming the peer; the peer is rejected.
    let parked = ParkedConnect::resolve(addr).await.unwrap();
    let exhausted = DescriptorsExhausted::leaving(1);
    parked.send_request(&data).unwrap();
    let err = guard("accept with one descriptor", listener.accept())
        .await
        .expect_err("no descriptor for the completion channel");
    drop(exhausted);
    let text = err.to_string();
    assert!(text.contains("setting up the connection from"), "{text}");
    assert!(text.contains("Too many open files"), "{text}");
    let outcome = guard("the refused request's end", parked.outcome()).await;
    assert!(!outcome.answered);
    assert_eq!(outcome.end.kind(), io::ErrorKind::ConnectionRefused);
    let (server, mut next) = stream_pair_on(&listener, &opts).await;
    tokio::spawn(echo_server(server));
    echo_once(&mut next, b"and goes on").await.unwrap();

    // into_incoming(): the failure is skipped; the stream ends only with the listener.
    let mut incoming = listener.into_incoming();
    let (failures_tx, mut failures) = tokio::sync::mpsc::unbounded_channel();
    let server_task = tokio::spawn(async move {
        while let Some(accepted) = incoming.next().await {
            match accepted {
                Ok(stream) => {
                    tokio::spawn(echo_server(stream));
                }
                Err(e) => {
                    let _ = failures_tx.send(e);
                }
            }
        }
    });
    for round in 0..3 {
        let parked = ParkedConnect::resolve(addr).await.unwrap();
        let exhausted = DescriptorsExhausted::leaving(0);
        parked.send_request(&data).unwrap();
        // The server took the request and failed it: the peer is rejected.
        let outcome = guard("the refused request's end", parked.outcome()).await;
        drop(exhausted);
        assert!(!outcome.answered, "round {round}");
        assert_eq!(outcome.end.kind(), io::ErrorKind::ConnectionRefused);
    }
    let mut after = guard(
        "connect after descriptors came back",
        RStream::connect_with(addr, &opts),
    )
    .await
    .expect("a new connection is served through into_incoming");
    guard("echo", echo_once(&mut after, b"served after EMFILE"))
        .await
        .unwrap();
    assert!(!server_task.is_finished(), "the incoming stream ended");
    assert!(
        failures.try_recv().is_err(),
        "a request's failure reached the server"
    );
    server_task.abort();
    echo_once(&mut client, b"still there").await.unwrap();
}

/// This process's open descriptors.
fn open_descriptors() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// How many connections stay open during the churn, and how many come and go.
const LONG_LIVED: usize = 256;
const CHURNED: usize = 1000;
/// Churned connections in flight at once.
const CHURN_AT_ONCE: usize = 16;

/// 1,000 connections opened, used and closed as fast as the device allows, while 256 stay open
/// and keep echoing, all through one `into_incoming()` server: every connection is served,
/// every echo is intact, and afterwards the RDMA resources and descriptors are back where they
/// were. Also measures descriptors per stream (documented in the `stream` module docs).
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_beside_long_lived_connections_is_served_and_leaks_nothing() {
    let _alone = EXCLUSIVE.lock().await;
    // Both ends of 256 streams live in this process: raise the soft descriptor limit to the
    // hard one (4096 in the test guest), and put it back afterwards.
    let (soft, hard) = nofile_limits();
    set_nofile(&hard, &hard);
    let _restore = RestoreNofile { soft, hard };
    let started = Instant::now();
    let opts = small();
    let listener = rlistener_with(opts.clone()).await;
    let addr = listener.local_addr().unwrap();
    let baseline = leak_counts();
    let descriptors_before = open_descriptors();

    let served = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let server = tokio::spawn({
        let served = served.clone();
        async move {
            let mut incoming = listener.into_incoming();
            while let Some(stream) = incoming.next().await {
                served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tokio::spawn(echo_server(stream.expect("the listener failed")));
            }
        }
    });

    let mut long_lived = Vec::with_capacity(LONG_LIVED);
    for i in 0..LONG_LIVED {
        let mut stream = guard(
            "a long-lived connection",
            RStream::connect_with(addr, &opts),
        )
        .await
        .unwrap_or_else(|e| panic!("long-lived connection {i}: {e}"));
        guard(
            "its first echo",
            echo_once(&mut stream, format!("open {i}").as_bytes()),
        )
        .await
        .unwrap();
        long_lived.push(stream);
    }
    // Each long-lived connection holds both of its ends here.
    let per_stream = (open_descriptors() - descriptors_before) as f64 / (2 * LONG_LIVED) as f64;
    eprintln!(
        "{LONG_LIVED} connections open after {:?}: {per_stream:.2} descriptors per stream",
        started.elapsed()
    );
    assert!(per_stream <= 6.0, "{per_stream} descriptors per stream");

    let churn_started = Instant::now();
    // The churn's last connection stays open until the long-lived ones finished a round: that
    // round surely ran while connections were being opened and closed (if they stalled under
    // the churn, the churn never ends and the bound below fails the test).
    let round_done = Arc::new(tokio::sync::Notify::new());
    let churn = tokio::spawn({
        let opts = opts.clone();
        let round_done = round_done.clone();
        async move {
            let mut in_flight = tokio::task::JoinSet::new();
            for i in 0..CHURNED {
                if in_flight.len() == CHURN_AT_ONCE {
                    in_flight
                        .join_next()
                        .await
                        .unwrap()
                        .expect("a churned connection");
                }
                let opts = opts.clone();
                let hold_until = (i == CHURNED - 1).then(|| round_done.clone());
                in_flight.spawn(async move {
                    let mut stream = RStream::connect_with(addr, &opts)
                        .await
                        .unwrap_or_else(|e| panic!("churned connection {i}: {e}"));
                    echo_once(&mut stream, format!("churn {i}").as_bytes())
                        .await
                        .unwrap_or_else(|e| panic!("churned connection {i}'s echo: {e}"));
                    if let Some(round_done) = hold_until {
                        round_done.notified().await;
                    }
                });
            }
            while let Some(done) = in_flight.join_next().await {
                done.expect("a churned connection");
            }
        }
    });
    // The long-lived ones echo round after round while the churn goes on.
    let steady = async {
        let mut rounds = 0u32;
        loop {
            for (i, stream) in long_lived.iter_mut().enumerate() {
                echo_once(stream, format!("round {rounds} of {i}").as_bytes())
                    .await
                    .unwrap_or_else(|e| panic!("long-lived connection {i}: {e}"));
            }
            rounds += 1;
            round_done.notify_one();
            if churn.is_finished() {
                return rounds;
            }
        }
    };
    let rounds = tokio::time::timeout(Duration::from_secs(600), steady)
        .await
        .expect("the churn did not finish within 10 minutes");
    churn.await.expect("the churn");
    eprintln!(
        "{CHURNED} connections opened and closed in {:?} ({CHURN_AT_ONCE} at a time) while \
         {LONG_LIVED} echoed {rounds} rounds",
        churn_started.elapsed()
    );
    assert_eq!(
        served.load(std::sync::atomic::Ordering::Relaxed),
        LONG_LIVED + CHURNED,
        "connections served"
    );
    for (i, stream) in long_lived.iter_mut().enumerate() {
        echo_once(stream, format!("last of {i}").as_bytes())
            .await
            .unwrap_or_else(|e| panic!("long-lived connection {i} at the end: {e}"));
    }

    drop(long_lived);
    server.abort();
    assert!(server.await.unwrap_err().is_cancelled());
    let mut without_listener = baseline.clone();
    without_listener[0] -= 1;
    guard(
        "every connection released",
        settled_counts(&without_listener),
    )
    .await;
    assert!(
        open_descriptors() < descriptors_before,
        "descriptors: {} before, {} after",
        descriptors_before,
        open_descriptors()
    );
    eprintln!("churn test took {:?}", started.elapsed());
}

/// Puts the descriptor limit back.
struct RestoreNofile {
    soft: String,
    hard: String,
}

impl Drop for RestoreNofile {
    fn drop(&mut self) {
        set_nofile(&self.soft, &self.hard);
    }
}
