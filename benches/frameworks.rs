//! Request latency of the frameworks people run, over `RStream` and over TCP: HTTP/1.1 and
//! HTTP/2 (hyper, one connection, a 64-byte response) and gRPC unary calls (tonic, the health
//! service's `Check`). Ends with a side-by-side table of p50/p99: medians of alternating rounds
//! (`FRAMEWORKS_ROUNDS`, `FRAMEWORKS_REQUESTS`) with the spread of the rdma/tcp ratio.
//!
//! Needs an RDMA device: run through `scripts/bench` (Soft-RoCE in a guest where there is none).
//! TCP runs over the same netdev address, so both transports cross the same (loopback) path.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod common;

use bytes::Bytes;
use common::RoundTrips;
use criterion::{BenchmarkId, Criterion};
use http_body_util::{BodyExt, Empty, Full};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rdma_async::integration::hyper::RConnector;
use rdma_async::stream::{RListener, RStream};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Transport {
    Rdma,
    Tcp,
}

impl Transport {
    const ALL: [Transport; 2] = [Transport::Rdma, Transport::Tcp];

    fn name(self) -> &'static str {
        match self {
            Transport::Rdma => "rdma",
            Transport::Tcp => "tcp",
        }
    }
}

/// One transport's requests in one alternating round (latencies in µs).
struct RoundResult {
    protocol: &'static str,
    transport: Transport,
    round: usize,
    p50: f64,
    p99: f64,
}

/// Every alternating round of every benchmark that ran, for the final table.
static RESULTS: Mutex<Vec<RoundResult>> = Mutex::new(Vec::new());

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// Answers every request with 64 bytes, over HTTP/1.1 or HTTP/2 (prior knowledge).
async fn serve_http<IO: AsyncRead + AsyncWrite + Unpin + Send + 'static>(io: IO) {
    let reply = Bytes::from_static(&[b'x'; 64]);
    let service = service_fn(move |_req| {
        let reply = reply.clone();
        async move { Ok::<_, Infallible>(hyper::Response::new(Full::new(reply))) }
    });
    let _ = auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), service)
        .await;
}

/// Starts an HTTP server on `transport` and returns its address.
async fn http_server(transport: Transport) -> SocketAddr {
    let bind = SocketAddr::new(common::addr(), 0);
    match transport {
        Transport::Rdma => {
            let listener = RListener::bind(bind).await.expect("bind RListener");
            let addr = listener.local_addr().expect("local address");
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    tokio::spawn(serve_http(stream));
                }
            });
            addr
        }
        Transport::Tcp => {
            let listener = TcpListener::bind(bind).await.expect("bind TcpListener");
            let addr = listener.local_addr().expect("local address");
            tokio::spawn(async move {
                while let Ok((stream, _)) = listener.accept().await {
                    let _ = stream.set_nodelay(true);
                    tokio::spawn(serve_http(stream));
                }
            });
            addr
        }
    }
}

/// A boxed client byte stream of either transport.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

async fn dial(transport: Transport, addr: SocketAddr) -> Box<dyn Io> {
    match transport {
        Transport::Rdma => Box::new(RStream::connect(addr).await.expect("connect RStream")),
        Transport::Tcp => {
            let stream = TcpStream::connect(addr).await.expect("connect TcpStream");
            stream.set_nodelay(true).expect("nodelay");
            Box::new(stream)
        }
    }
}

/// Rounds of the side-by-side table (`FRAMEWORKS_ROUNDS`, default 3) and requests per transport
/// in each (`FRAMEWORKS_REQUESTS`, default 1000): after criterion's runs, the transports take
/// turns (rdma, tcp, rdma, tcp, ...) on the same connections, so a slow spell of a loaded
/// machine hits both, and the table gives medians over the rounds.
fn rounds_and_requests() -> (usize, u64) {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(default)
    };
    (
        env("FRAMEWORKS_ROUNDS", 3) as usize,
        env("FRAMEWORKS_REQUESTS", 1000),
    )
}

/// Benchmarks one request at a time on one connection, for each transport, then measures the
/// alternating rounds of the table.
fn bench_requests<C, F>(
    c: &mut Criterion,
    rt: &tokio::runtime::Runtime,
    protocol: &'static str,
    connect: impl Fn(Transport) -> F,
    request: impl AsyncFn(&mut C) + Clone + 'static,
) where
    F: std::future::Future<Output = C>,
    C: Send + 'static,
{
    let mut group = c.benchmark_group(protocol);
    group.measurement_time(Duration::from_secs(5));
    let mut ran = Vec::new();
    for transport in Transport::ALL {
        let client = Arc::new(tokio::sync::Mutex::new(rt.block_on(connect(transport))));
        let hist = RoundTrips::new();
        group.bench_function(BenchmarkId::from_parameter(transport.name()), |b| {
            b.to_async(rt).iter_custom(|iters| {
                let (client, hist, request) = (client.clone(), hist.clone(), request.clone());
                async move {
                    let mut client = client.lock().await;
                    hist.time(iters, async || request(&mut client).await).await
                }
            });
        });
        hist.report(&format!("{protocol}/{}", transport.name()));
        if hist.p50_p99_us().is_some() {
            ran.push((transport, client));
        }
    }
    group.finish();
    if ran.len() < Transport::ALL.len() {
        return; // filtered out on the command line: no side-by-side rows
    }
    let (rounds, requests) = rounds_and_requests();
    for round in 0..rounds {
        for (transport, client) in &ran {
            let hist = RoundTrips::new();
            rt.block_on(async {
                let mut client = client.lock().await;
                hist.time(requests, async || request(&mut client).await)
                    .await
            });
            if let Some((p50, p99)) = hist.p50_p99_us() {
                RESULTS.lock().expect("results").push(RoundResult {
                    protocol,
                    transport: *transport,
                    round,
                    p50,
                    p99,
                });
            }
        }
    }
}

type Http1 = hyper::client::conn::http1::SendRequest<Empty<Bytes>>;
type Http2 = hyper::client::conn::http2::SendRequest<Empty<Bytes>>;

fn get() -> hyper::Request<Empty<Bytes>> {
    hyper::Request::get("/")
        .body(Empty::new())
        .expect("request")
}

async fn check_body(response: hyper::Response<hyper::body::Incoming>) {
    let body = response.into_body().collect().await.expect("body");
    assert_eq!(body.to_bytes().len(), 64);
}

fn http1(c: &mut Criterion) {
    let rt = common::runtime();
    let connect = |transport| async move {
        let addr = http_server(transport).await;
        let io = TokioIo::new(dial(transport, addr).await);
        let (sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .expect("HTTP/1.1 handshake");
        tokio::spawn(conn);
        sender
    };
    bench_requests(c, &rt, "http1", connect, async |sender: &mut Http1| {
        // The connection task must see the previous response finish before the next request.
        sender.ready().await.expect("connection ready");
        check_body(sender.send_request(get()).await.expect("response")).await;
    });
}

fn http2(c: &mut Criterion) {
    let rt = common::runtime();
    let connect = |transport| async move {
        let addr = http_server(transport).await;
        let io = TokioIo::new(dial(transport, addr).await);
        let (sender, conn) = hyper::client::conn::http2::handshake(TokioExecutor::new(), io)
            .await
            .expect("HTTP/2 handshake");
        tokio::spawn(conn);
        sender
    };
    bench_requests(c, &rt, "http2", connect, async |sender: &mut Http2| {
        sender.ready().await.expect("connection ready");
        check_body(sender.send_request(get()).await.expect("response")).await;
    });
}

/// Starts tonic's health service on `transport`; returns a channel to it.
async fn grpc_channel(transport: Transport) -> Channel {
    let (_reporter, service) = tonic_health::server::health_reporter();
    let router = tonic::transport::Server::builder().add_service(service);
    let bind = SocketAddr::new(common::addr(), 0);
    let (addr, uri) = match transport {
        Transport::Rdma => {
            let listener = RListener::bind(bind).await.expect("bind RListener");
            let addr = listener.local_addr().expect("local address");
            tokio::spawn(router.serve_with_incoming(listener.into_incoming()));
            (addr, format!("http://{addr}"))
        }
        Transport::Tcp => {
            let listener = TcpListener::bind(bind).await.expect("bind TcpListener");
            let addr = listener.local_addr().expect("local address");
            let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
            tokio::spawn(router.serve_with_incoming(incoming));
            (addr, format!("http://{addr}"))
        }
    };
    let endpoint = Endpoint::from_shared(uri).expect("URI").tcp_nodelay(true);
    match transport {
        Transport::Rdma => endpoint.connect_with_connector(RConnector::new()).await,
        Transport::Tcp => endpoint.connect().await,
    }
    .unwrap_or_else(|e| panic!("gRPC channel to {addr}: {e}"))
}

fn grpc(c: &mut Criterion) {
    let rt = common::runtime();
    let connect = |transport| async move { HealthClient::new(grpc_channel(transport).await) };
    bench_requests(
        c,
        &rt,
        "grpc_unary",
        connect,
        async |client: &mut HealthClient<Channel>| {
            let request = HealthCheckRequest {
                service: String::new(),
            };
            client.check(request).await.expect("health check");
        },
    );
}

/// The side-by-side table: one row per protocol, medians over the alternating rounds, and the
/// spread (min–max) of the per-round p50 ratio.
fn print_table() {
    let results = RESULTS.lock().expect("results");
    if results.is_empty() {
        return;
    }
    let (rounds, requests) = rounds_and_requests();
    println!(
        "\nrequest latency, one request at a time on one connection (µs): medians of {rounds} \
         alternating rounds of {requests} requests per transport"
    );
    println!(
        "{:<12} {:>10} {:>10} {:>10} {:>10} {:>12} {:>11}",
        "protocol", "rdma p50", "rdma p99", "tcp p50", "tcp p99", "p50 rdma/tcp", "spread"
    );
    for protocol in ["http1", "http2", "grpc_unary"] {
        let of = |t: Transport| -> Vec<&RoundResult> {
            results
                .iter()
                .filter(|r| r.protocol == protocol && r.transport == t)
                .collect()
        };
        let (rdma, tcp) = (of(Transport::Rdma), of(Transport::Tcp));
        if rdma.is_empty() || tcp.is_empty() {
            continue;
        }
        let ratios: Vec<f64> = rdma
            .iter()
            .filter_map(|r| {
                let t = tcp.iter().find(|t| t.round == r.round)?;
                Some(r.p50 / t.p50)
            })
            .collect();
        let (lo, hi) = ratios
            .iter()
            .fold((f64::INFINITY, 0f64), |(lo, hi), &x| (lo.min(x), hi.max(x)));
        println!(
            "{protocol:<12} {:>10.1} {:>10.1} {:>10.1} {:>10.1} {:>12.2} {:>11}",
            median(rdma.iter().map(|r| r.p50).collect()),
            median(rdma.iter().map(|r| r.p99).collect()),
            median(tcp.iter().map(|r| r.p50).collect()),
            median(tcp.iter().map(|r| r.p99).collect()),
            median(ratios.clone()),
            format!("{lo:.2}–{hi:.2}"),
        );
    }
}

fn main() {
    let mut c = Criterion::default().configure_from_args();
    http1(&mut c);
    http2(&mut c);
    grpc(&mut c);
    c.final_summary();
    print_table();
}
