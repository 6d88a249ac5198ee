//! TLS over `RStream`: tokio-rustls runs unchanged on it (the stream is `AsyncRead` +
//! `AsyncWrite` like `TcpStream`), with a certificate made in the test; hyper (HTTP/1.1 and
//! HTTP/2) runs on the TLS stream as it would over TCP.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;

use rdma_async::stream::{RListener, RStream};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::tls::TestCert;
use rdma_async_device_tests::{guard, rlistener, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::client::TlsStream;
use tokio_rustls::rustls::pki_types::ServerName;

/// Serves one TLS connection: echoes what it reads until the client's close, then closes.
/// Returns how many bytes it echoed, or the handshake's error.
fn echo_one(listener: RListener, acceptor: TlsAcceptor) -> JoinHandle<std::io::Result<u64>> {
    tokio::spawn(async move {
        let (stream, _peer) = listener.accept().await?;
        let tls = acceptor.accept(stream).await?;
        let (mut reader, mut writer) = tokio::io::split(tls);
        let echoed = tokio::io::copy(&mut reader, &mut writer).await?;
        writer.shutdown().await?;
        Ok(echoed)
    })
}

fn server_name() -> ServerName<'static> {
    ServerName::from(test_ip())
}

/// Connects an `RStream` to `addr` and runs the TLS handshake over it as `cert`'s client.
async fn tls_connect(cert: &TestCert, addr: SocketAddr) -> std::io::Result<TlsStream<RStream>> {
    let stream = RStream::connect(addr).await.expect("connect");
    guard(
        "TLS handshake",
        cert.connector().connect(server_name(), stream),
    )
    .await
}

#[rdma_async::test]
async fn tls_over_rstream_verifies_the_server_and_echoes_one_mebibyte() {
    let cert = TestCert::for_ip(test_ip());
    let listener = rlistener().await;
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = echo_one(listener, cert.acceptor());

    let tls = tls_connect(&cert, addr)
        .await
        .expect("TLS handshake over RStream");
    let (_, session) = tls.get_ref();
    assert_eq!(
        session.peer_certificates(),
        Some(&[cert.der.clone()][..]),
        "the server presented another certificate"
    );

    let data = pattern(7, 1 << 20);
    let (mut reader, mut writer) = tokio::io::split(tls);
    let sent = data.clone();
    let writing = tokio::spawn(async move {
        for chunk in sent.chunks(10_000) {
            writer.write_all(chunk).await?;
        }
        // close_notify, then the stream's half-close.
        writer.shutdown().await
    });
    let mut echoed = Vec::new();
    guard("TLS echo", reader.read_to_end(&mut echoed))
        .await
        .expect("read the echo");
    writing.await.unwrap().expect("write over TLS");
    assert!(
        echoed == data,
        "the echo over TLS differs from what was sent"
    );
    let served = guard("server", server).await.unwrap().expect("server");
    assert_eq!(served, data.len() as u64);
}

#[rdma_async::test]
async fn a_client_that_does_not_trust_the_certificate_refuses_the_connection() {
    let presented = TestCert::for_ip(test_ip());
    let trusted = TestCert::for_ip(test_ip());
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let server = echo_one(listener, presented.acceptor());

    let err = tls_connect(&trusted, addr)
        .await
        .expect_err("a certificate the client does not trust was accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // The server's handshake fails too (the client's alert, or its close).
    assert!(guard("server", server).await.unwrap().is_err());
}

/// Answers every request with its path, a colon and its body.
async fn path_and_body(req: Request<Incoming>) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let mut out = format!("{}:", req.uri().path()).into_bytes();
    out.extend_from_slice(&req.into_body().collect().await?.to_bytes());
    Ok(Response::new(Full::new(Bytes::from(out))))
}

/// Serves `connections` TLS connections with hyper (HTTP/1.1 or HTTP/2, whichever the client
/// speaks), each in a task of its own.
fn serve_https(
    listener: RListener,
    acceptor: TlsAcceptor,
    connections: usize,
) -> JoinHandle<std::io::Result<()>> {
    tokio::spawn(async move {
        for _ in 0..connections {
            let (stream, _peer) = listener.accept().await?;
            let tls = acceptor.accept(stream).await?;
            tokio::spawn(async move {
                auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(tls), service_fn(path_and_body))
                    .await
                    .expect("serve an HTTPS connection over RStream");
            });
        }
        Ok(())
    })
}

/// The body of `response`, checked to be `path:` followed by `sent`.
async fn check_echo(response: Response<Incoming>, path: &str, sent: &[u8]) {
    let got = guard("the response body", response.into_body().collect())
        .await
        .expect("read the response body")
        .to_bytes();
    let mut want = format!("{path}:").into_bytes();
    want.extend_from_slice(sent);
    assert_eq!(got.len(), want.len(), "response length for {path}");
    assert!(
        got == want,
        "the response for {path} differs from the request's echo"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn hyper_http1_and_http2_over_tls_over_rstream() {
    let cert = TestCert::for_ip(test_ip());
    let listener = rlistener().await;
    let addr = listener.local_addr().unwrap();
    let server = serve_https(listener, cert.acceptor(), 2);
    let body = pattern(8, 1 << 20);
    let tls_client = || async {
        tls_connect(&cert, addr)
            .await
            .expect("TLS handshake over RStream")
    };

    // HTTP/1.1 on one TLS connection: two requests, the second with a 1 MiB body.
    let (mut h1, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tls_client().await))
        .await
        .expect("HTTP/1.1 handshake over TLS");
    tokio::spawn(conn);
    for (path, sent) in [("/h1/small", &b"hello"[..]), ("/h1/big", &body[..])] {
        let request = Request::post(path)
            .header("host", addr.to_string())
            .body(Full::new(Bytes::copy_from_slice(sent)))
            .unwrap();
        // The connection takes the next request once the last response is read to its end.
        guard("the HTTP/1.1 connection ready", h1.ready())
            .await
            .expect("the HTTP/1.1 connection over TLS is usable");
        let response = guard("an HTTP/1.1 request over TLS", h1.send_request(request))
            .await
            .expect("HTTP/1.1 request over TLS");
        assert_eq!(response.version(), http::Version::HTTP_11);
        check_echo(response, path, sent).await;
    }

    // HTTP/2 with prior knowledge on another: two concurrent streams.
    let (h2, conn) = hyper::client::conn::http2::handshake(
        TokioExecutor::new(),
        TokioIo::new(tls_client().await),
    )
    .await
    .expect("HTTP/2 handshake over TLS");
    tokio::spawn(conn);
    let send = |path: &'static str, sent: Vec<u8>| {
        let mut h2 = h2.clone();
        async move {
            let request = Request::post(format!("https://{addr}{path}"))
                .body(Full::new(Bytes::from(sent.clone())))
                .unwrap();
            let response = guard("an HTTP/2 request over TLS", h2.send_request(request))
                .await
                .expect("HTTP/2 request over TLS");
            assert_eq!(response.version(), http::Version::HTTP_2);
            check_echo(response, path, &sent).await;
        }
    };
    tokio::join!(
        send("/h2/a", body.clone()),
        send("/h2/b", b"second".to_vec())
    );
    guard("server", server).await.unwrap().expect("server");
}
