//! HTTP over `RStream` / `RListener` on a real RDMA device: hyper (server and hyper-util's
//! pooled client through `RConnector`, HTTP/1.1 and HTTP/2) and `axum::serve`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};

use axum::extract::ConnectInfo;
use axum::routing::get;
use axum::serve::ListenerExt;
use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rdma_async::integration::hyper::RConnector;
use rdma_async::stream::RStream;
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{guard, rlistener};
use tokio::io::AsyncWriteExt;
use tokio::sync::{Barrier, mpsc};

/// Size of the large request and response bodies.
const BIG: usize = 16 << 20;

/// What the test server's handler needs.
struct State {
    /// `/wait` requests block here until this many are in flight at once.
    barrier: Barrier,
    big_request: Bytes,
    big_response: Bytes,
}

/// A hyper server (auto: HTTP/1.1 or HTTP/2 prior knowledge) on an `RListener`.
struct Server {
    addr: SocketAddr,
    /// Connections accepted so far.
    accepted: Arc<AtomicUsize>,
    /// How each connection ended (`serve_connection`'s result), in order of ending.
    ended: mpsc::UnboundedReceiver<Result<(), String>>,
}

/// Routes: `/echo/X` answers `X`; `/wait` answers once `waiters` of them are in flight;
/// `/big` checks a 16 MiB request body (header `x-body-ok`) and answers 16 MiB.
async fn handle(state: Arc<State>, req: Request<Incoming>) -> hyper::Result<Response<Full<Bytes>>> {
    let path = req.uri().path().to_owned();
    // Read the whole body first, so a client that vanishes mid-body fails the handler.
    let body = req.into_body().collect().await?.to_bytes();
    Ok(if let Some(what) = path.strip_prefix("/echo/") {
        Response::new(Full::new(Bytes::from(what.to_owned())))
    } else if path == "/wait" {
        state.barrier.wait().await;
        Response::new(Full::new(Bytes::from_static(b"done")))
    } else if path == "/big" {
        Response::builder()
            .header("x-body-ok", (body == state.big_request).to_string())
            .body(Full::new(state.big_response.clone()))
            .unwrap()
    } else {
        let mut not_found = Response::new(Full::new(Bytes::new()));
        *not_found.status_mut() = StatusCode::NOT_FOUND;
        not_found
    })
}

async fn start_server(waiters: usize) -> Server {
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let (ended_tx, ended) = mpsc::unbounded_channel();
    let state = Arc::new(State {
        barrier: Barrier::new(waiters),
        big_request: pattern(1, BIG).into(),
        big_response: pattern(2, BIG).into(),
    });
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((stream, _peer)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let state = state.clone();
            let ended_tx = ended_tx.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| handle(state.clone(), req));
                let result = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
                let _ = ended_tx.send(result.map_err(|e| e.to_string()));
            });
        }
    });
    Server {
        addr,
        accepted,
        ended,
    }
}

/// An `RConnector` that really connects only the first time; later connects never finish.
///
/// hyper-util's pool starts a speculative connect whenever a checkout finds no idle
/// connection, even if the busy one becomes idle a moment later (which it then uses, leaving
/// the new connection in the pool). Blocking those connects makes "one connection for every
/// request" deterministic: if the pool failed to reuse, a request would hang (and the guard
/// fail) rather than open a second connection.
#[derive(Clone)]
struct FirstConnectOnly {
    inner: RConnector,
    calls: Arc<AtomicUsize>,
}

impl tower_service::Service<Uri> for FirstConnectOnly {
    type Response = TokioIo<RStream>;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<RStream>>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            self.inner.call(uri)
        } else {
            Box::pin(std::future::pending())
        }
    }
}

async fn body_string(response: Response<Incoming>) -> String {
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(bytes.to_vec()).unwrap()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_keep_alive_reuses_one_connection_for_1000_requests() {
    let server = start_server(1).await;
    let connector = FirstConnectOnly {
        inner: RConnector::new(),
        calls: Arc::new(AtomicUsize::new(0)),
    };
    let calls = connector.calls.clone();
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(connector);
    // Each request is a step of its own under the hang guard: 1000 of them on a slow (emulated)
    // guest, beside another test, can take longer than one step may.
    for i in 0..1000 {
        let uri: Uri = format!("http://{}/echo/{i}", server.addr).parse().unwrap();
        let response = guard("request", client.get(uri)).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.version(), http::Version::HTTP_11);
        assert_eq!(guard("body", body_string(response)).await, i.to_string());
    }
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
    eprintln!(
        "connector calls (speculative ones never connect): {}",
        calls.load(Ordering::SeqCst)
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_carries_100_concurrent_streams_on_one_connection() {
    const STREAMS: usize = 100;
    // Every `/wait` is answered only when all 100 are in flight at once.
    let server = start_server(STREAMS).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, Empty<Bytes>>(RConnector::new());
    let uri: Uri = format!("http://{}/wait", server.addr).parse().unwrap();
    let requests: Vec<_> = (0..STREAMS)
        .map(|_| {
            let client = client.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                let response = client.get(uri).await.unwrap();
                assert_eq!(response.version(), http::Version::HTTP_2);
                body_string(response).await
            })
        })
        .collect();
    guard("100 concurrent streams", async {
        for request in requests {
            assert_eq!(request.await.unwrap(), "done");
        }
    })
    .await;
    assert_eq!(server.accepted.load(Ordering::SeqCst), 1);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn http1_moves_16_mib_each_way() {
    let server = start_server(1).await;
    let client = Client::builder(TokioExecutor::new()).build::<_, Full<Bytes>>(RConnector::new());
    let request = Request::post(format!("http://{}/big", server.addr))
        .body(Full::new(Bytes::from(pattern(1, BIG))))
        .unwrap();
    let body = guard("16 MiB exchange", async {
        let response = client.request(request).await.unwrap();
        assert_eq!(response.status(), StatusCode::OK);
        assert_eq!(response.headers()["x-body-ok"], "true");
        response.into_body().collect().await.unwrap().to_bytes()
    })
    .await;
    assert_eq!(body.len(), BIG);
    assert!(body == pattern(2, BIG), "response body differs");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn http2_moves_16_mib_each_way() {
    let server = start_server(1).await;
    let client = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, Full<Bytes>>(RConnector::new());
    let request = Request::post(format!("http://{}/big", server.addr))
        .body(Full::new(Bytes::from(pattern(1, BIG))))
        .unwrap();
    let body = guard("16 MiB exchange over h2", async {
        let response = client.request(request).await.unwrap();
        assert_eq!(response.version(), http::Version::HTTP_2);
        assert_eq!(response.headers()["x-body-ok"], "true");
        response.into_body().collect().await.unwrap().to_bytes()
    })
    .await;
    assert!(body == pattern(2, BIG), "response body differs");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn axum_handler_sees_the_peer_address() {
    let listener = rlistener().await;
    let addr = axum::serve::Listener::local_addr(&listener).unwrap();
    assert_eq!(addr, listener.local_addr().unwrap());
    let app = axum::Router::new().route(
        "/peer",
        get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
    );
    // `tap_io` is what gives `ConnectInfo<SocketAddr>` for a listener other than axum's own.
    let serve = axum::serve(
        listener.tap_io(|_| {}),
        app.into_make_service_with_connect_info::<SocketAddr>(),
    );
    tokio::spawn(async move { serve.await });

    let stream = guard("connect", RStream::connect(addr)).await.unwrap();
    let local = stream.local_addr().unwrap();
    let (mut sender, conn) = guard(
        "handshake",
        hyper::client::conn::http1::handshake::<_, Empty<Bytes>>(TokioIo::new(stream)),
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    let request = Request::get("/peer")
        .header(http::header::HOST, addr.to_string())
        .body(Empty::new())
        .unwrap();
    let response = guard("request", sender.send_request(request))
        .await
        .unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    assert_eq!(
        guard("body", body_string(response)).await,
        local.to_string()
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_survives_clients_that_vanish_mid_request() {
    let mut server = start_server(1).await;
    let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(RConnector::new());
    let echo = |what: &str| -> Uri {
        format!("http://{}/echo/{what}", server.addr)
            .parse()
            .unwrap()
    };
    let half_requests: [&[u8]; 2] = [
        // Headers complete, 10 of 100 body bytes.
        b"POST /echo/a HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n0123456789",
        // Half a request line.
        b"GET /echo/b HT",
    ];
    // Kept alive: a dropped client closes its connection, which would end on the server.
    let mut fresh_clients = Vec::new();
    for half in half_requests {
        let mut vanishing = guard("connect", RStream::connect(server.addr))
            .await
            .unwrap();
        guard("write half a request", vanishing.write_all(half))
            .await
            .unwrap();
        // Served while the half request is pending...
        let response = guard("request", client.get(echo("during"))).await.unwrap();
        assert_eq!(guard("body", body_string(response)).await, "during");
        drop(vanishing);
        // ...and the server notices the vanished client (the pooled connection stays open,
        // so the first connection to end is the vanished one)...
        let ended = guard("vanished connection ends", server.ended.recv())
            .await
            .unwrap();
        assert!(ended.is_err(), "a half request ended cleanly: {ended:?}");
        // ...and still serves, on the pooled connection and on a new one.
        let response = guard("request", client.get(echo("after"))).await.unwrap();
        assert_eq!(guard("body", body_string(response)).await, "after");
        let fresh =
            Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(RConnector::new());
        let response = guard("request", fresh.get(echo("fresh"))).await.unwrap();
        assert_eq!(guard("body", body_string(response)).await, "fresh");
        fresh_clients.push(fresh);
    }
}
