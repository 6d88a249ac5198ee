//! TLS over `RStream`: tokio-rustls runs unchanged on it (the stream is `AsyncRead` +
//! `AsyncWrite` like `TcpStream`), with a certificate made in the test.

use std::net::SocketAddr;

use rdma_async::stream::{RListener, RStream};
use rdma_async_tests::data::pattern;
use rdma_async_tests::tls::TestCert;
use rdma_async_tests::{guard, rlistener, test_ip};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tokio_rustls::TlsAcceptor;
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

#[rdma_async::test]
async fn tls_over_rstream_verifies_the_server_and_echoes_one_mebibyte() {
    let cert = TestCert::for_ip(test_ip());
    let listener = rlistener().await;
    let addr: SocketAddr = listener.local_addr().unwrap();
    let server = echo_one(listener, cert.acceptor());

    let stream = RStream::connect(addr).await.unwrap();
    let tls = guard(
        "TLS handshake",
        cert.connector().connect(server_name(), stream),
    )
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

    let stream = RStream::connect(addr).await.unwrap();
    let err = guard(
        "TLS handshake",
        trusted.connector().connect(server_name(), stream),
    )
    .await
    .expect_err("a certificate the client does not trust was accepted");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData, "{err}");
    assert!(err.to_string().contains("certificate"), "{err}");
    // The server's handshake fails too (the client's alert, or its close).
    assert!(guard("server", server).await.unwrap().is_err());
}
