//! TLS over RDMA: tokio-rustls runs unchanged on `RStream`, as it does on `TcpStream`.
//!
//! Makes a self-signed certificate for the address's IP, serves a TLS echo on an `RListener`,
//! and connects a client that trusts only that certificate; prints what the client verified and
//! what came back. Run it where an RDMA device has the address:
//!
//!     tls_echo [ADDR]        (default 10.77.0.1:7480; `tls_echo --help` for the usage)

use std::net::SocketAddr;
use std::sync::Arc;

use clap::Parser;
use rdma_async::stream::{RListener, RStream};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_rustls::rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName,
};
use tokio_rustls::rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio_rustls::{TlsAcceptor, TlsConnector};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TLS over RDMA: serves a TLS echo on an `RListener` with a self-signed certificate for ADDR's
/// IP, connects a client that trusts only that certificate, and prints what came back.
#[derive(Debug, Parser)]
#[command(name = "tls_echo")]
struct Options {
    /// The address (of an RDMA device) and port to serve on.
    #[arg(default_value = "10.77.0.1:7480")]
    addr: SocketAddr,
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> Result<(), BoxError> {
    let Options { addr } = Options::parse();
    let made = rcgen::generate_simple_self_signed(vec![addr.ip().to_string()])?;
    let cert: CertificateDer<'static> = made.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(made.signing_key.serialize_der()));

    // The server: an RListener whose streams are wrapped in TLS.
    let server_config = ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)?;
    let acceptor = TlsAcceptor::from(Arc::new(server_config));
    let listener = RListener::bind(addr).await?;
    println!("tls echo listening on {}", listener.local_addr()?);
    let server = tokio::spawn(async move {
        let (stream, peer) = listener.accept().await?;
        let tls = acceptor.accept(stream).await?;
        println!("server: TLS from {peer}");
        let (mut reader, mut writer) = tokio::io::split(tls);
        tokio::io::copy(&mut reader, &mut writer).await?;
        writer.shutdown().await?;
        Ok::<_, std::io::Error>(())
    });

    // The client: trusts that one certificate and checks the server's name (its IP) against it.
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone())?;
    let client_config = ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = TlsConnector::from(Arc::new(client_config));
    let stream = RStream::connect(addr).await?;
    let mut tls = connector
        .connect(ServerName::from(addr.ip()), stream)
        .await?;
    let (_, session) = tls.get_ref();
    let verified = session.peer_certificates().is_some_and(|c| c == [cert]);
    println!(
        "client: {:?} with {:?}, server certificate verified: {verified}",
        session.protocol_version().ok_or("no TLS version")?,
        session
            .negotiated_cipher_suite()
            .ok_or("no cipher suite")?
            .suite(),
    );
    tls.write_all(b"hello over TLS over RDMA\nsecond line\n")
        .await?;
    tls.shutdown().await?;
    let mut lines = BufReader::new(tls).lines();
    while let Some(line) = lines.next_line().await? {
        println!("echo: {line}");
    }
    server.await??;
    Ok(())
}
