//! An `RListener` under an 8 MiB locked-memory limit while peers park handshakes: each parked
//! handshake pins its stream's rings, and without a bound peers that park enough of them pin
//! the whole limit, after which every registration of the process fails (a legitimate
//! client's rings, an open connection's memory). Here one address may hold only a share of the
//! handshakes, and handshakes in progress pin at most half of the limit.
//!
//! The guest runs as root, whose `CAP_IPC_LOCK` lifts the limit, so the listener runs in a
//! child process (`limits-peer serve-parked`) under `prlimit --memlock` and without that
//! capability, and this process plays the peers: the parked ones with `ParkedConnect` (test
//! hooks) from the test's IPv4 address, the legitimate client from its IPv6 address, which the
//! child sees as another source. A binary of its own: its children take minutes of guest time.

use std::io;
use std::net::{IpAddr, SocketAddr};

use rdma_async::cm::ParkedConnect;
use rdma_async::stream::{RStream, RStreamOptions, hooks};
use rdma_async_device_tests::streams::echo_once;
use rdma_async_device_tests::tools::{spawn_limits_peer, stdout_lines};
use rdma_async_device_tests::{guard, test_ip, test_ip6};
use tokio::io::{AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout};

/// The child's locked-memory limit: 8 MiB, a common default (systemd's since v253).
const MEMLOCK: u64 = 8 << 20;

/// The listening child and what it prints.
struct Server {
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    port: u16,
}

impl Server {
    /// `limits-peer serve-parked RING` under the limit, once it listens.
    async fn start(ring: u32) -> Self {
        let mut child = spawn_limits_peer(MEMLOCK, &["serve-parked", &ring.to_string()]);
        let mut lines = stdout_lines(&mut child);
        let port = guard("limits-peer listens", async {
            let line = lines.next_line().await.expect("output");
            let line = line.expect("limits-peer ended before listening");
            line.strip_prefix("listening ")
                .unwrap_or_else(|| panic!("limits-peer printed {line:?}"))
                .parse()
                .expect("the listening port")
        })
        .await;
        Server { child, lines, port }
    }

    fn addr(&self, ip: IpAddr) -> SocketAddr {
        SocketAddr::new(ip, self.port)
    }

    /// Has the child's open connection register 2 MiB; returns the outcome it printed.
    async fn register(&mut self) -> String {
        let stdin = self.child.stdin.as_mut().expect("stdin");
        stdin
            .write_all(b"register\n")
            .await
            .expect("to limits-peer");
        guard("limits-peer registers", self.lines.next_line())
            .await
            .expect("output")
            .expect("limits-peer ended")
    }
}

/// `count` requests from `ip`'s address to `server`, each parked, and the listener's answer to
/// each: `Ok` when it accepted (the handshake is then in progress until the peer completes it,
/// which it never does), the rejection otherwise.
async fn park(server: &Server, ip: IpAddr, count: usize) -> (Vec<ParkedConnect>, Vec<io::Error>) {
    let data = hooks::request_data(&RStreamOptions::new());
    let mut parked = Vec::with_capacity(count);
    let mut refused = Vec::new();
    for _ in 0..count {
        let client = ParkedConnect::resolve(server.addr(ip))
            .await
            .expect("resolve");
        client.send_request(&data).expect("send the request");
        match guard("the listener's answer", client.answer()).await {
            Ok(()) => parked.push(client),
            Err(e) => refused.push(e),
        }
    }
    (parked, refused)
}

/// Asserts that every refusal is a `ConnectionRefused` carrying the listener's reason, and one
/// of them `reason`.
#[track_caller]
fn assert_refused_saying(refused: &[io::Error], reason: &str) {
    for e in refused {
        assert_eq!(e.kind(), io::ErrorKind::ConnectionRefused, "{e}");
        assert!(e.to_string().contains("handshakes in progress"), "{e}");
    }
    assert!(
        refused.iter().any(|e| e.to_string().contains(reason)),
        "no refusal says {reason:?}: {refused:?}"
    );
}

/// 64 requests parked from one address (the listener's 64 slots; 16.5 MiB of default rings,
/// more than the limit): the listener takes a share of them and refuses the rest at once, so a
/// client from another address connects and echoes, and the open connection still registers
/// 2 MiB. Before the bounds the parked handshakes pinned the whole limit: the client was
/// refused ("memory registration of 131072 bytes failed") and the registration failed.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_address_parking_handshakes_leaves_room_for_other_clients_and_registrations() {
    let mut server = Server::start(128 * 1024).await;
    let (parked, refused) = park(&server, test_ip(), 64).await;

    let mut client = guard(
        "a client from another address",
        RStream::connect(server.addr(test_ip6())),
    )
    .await
    .expect("a client from another address is served beside the parked handshakes");
    echo_once(&mut client, b"beside the parked ones")
        .await
        .expect("echo");
    assert_eq!(server.register().await, "register-2MiB ok");

    eprintln!(
        "64 parked requests: {} in progress, {} refused",
        parked.len(),
        refused.len()
    );
    assert!(!parked.is_empty(), "the listener accepted none");
    assert_refused_saying(&refused, "the most one address may have");
}

/// Rings of 1 MiB each way (2 MiB a handshake): requests parked from two addresses, within
/// what one address may hold, would still pin the limit three times over; the handshakes in
/// progress pin at most half of it, the rest are refused, and the open connection registers
/// 2 MiB. Without the memory bound three handshakes pinned 6 MiB and the registration failed.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshakes_in_progress_pin_at_most_half_the_limit() {
    let mut server = Server::start(1 << 20).await;
    let (mut parked, mut refused) = park(&server, test_ip(), 4).await;
    let (more_parked, more_refused) = park(&server, test_ip6(), 4).await;
    parked.extend(more_parked);
    refused.extend(more_refused);

    assert_eq!(server.register().await, "register-2MiB ok");
    assert_eq!(
        parked.len(),
        1,
        "two handshakes' rings (4 MiB and 16 KiB) are more than half the limit"
    );
    assert_refused_saying(&refused, "would pass their budget");
}
