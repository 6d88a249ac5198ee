//! An HTTP server (hyper, HTTP/1.1 or HTTP/2 prior knowledge) over RDMA.
//!
//! ```text
//! http_server [--tcp] [address:port]        # default 10.77.0.1:8080
//! http_server --help
//! ```
//!
//! `POST /echo` answers with the request's body, unchanged; every other request gets a greeting
//! that names the request's path, the peer and the transport. `--tcp` serves the same over
//! kernel TCP instead (with `TCP_NODELAY`), so `http_client --tcp` can compare the two
//! (`scripts/compare-wire` does, across two hosts).

use std::net::SocketAddr;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rdma_async::stream::RListener;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;

/// An HTTP server (hyper, HTTP/1.1 or HTTP/2 prior knowledge) over RDMA.
#[derive(Debug, Parser)]
#[command(name = "http_server")]
struct Options {
    /// Serve over kernel TCP (with TCP_NODELAY) instead of RDMA, for comparisons.
    #[arg(long)]
    tcp: bool,
    /// The address and port to listen on.
    #[arg(value_name = "ADDRESS:PORT", default_value = "10.77.0.1:8080")]
    addr: String,
}

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> std::io::Result<()> {
    let Options { tcp, addr } = Options::parse();
    if tcp {
        let listener = TcpListener::bind(&addr).await?;
        println!("over TCP, listening on http://{}", listener.local_addr()?);
        loop {
            let (stream, peer) = listener.accept().await?;
            // Answers go out at once, as RStream's do (it has no Nagle).
            stream.set_nodelay(true)?;
            tokio::spawn(serve(stream, peer, "TCP"));
        }
    }
    let listener = RListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                tokio::spawn(serve(stream, peer, "RDMA"));
            }
            // Only a listener whose device went away is done; a request this host could not
            // set up (a client gone mid-handshake, no memory or queue pairs left) is refused
            // and the next one is taken, as `RListener::accept` documents.
            Err(e) if e.kind() == std::io::ErrorKind::NetworkDown => return Err(e),
            Err(e) => eprintln!("http_server: a connection request failed: {e}"),
        }
    }
}

/// Serves one connection until the client closes it.
async fn serve<IO>(io: IO, peer: SocketAddr, transport: &'static str)
where
    IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let service = service_fn(move |req| answer(req, peer, transport));
    // `auto` picks HTTP/1.1 or HTTP/2 from the first bytes, as over TCP.
    let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), service)
        .await;
    if let Err(e) = served {
        eprintln!("{peer}: {e}");
    }
}

async fn answer(
    req: Request<Incoming>,
    peer: SocketAddr,
    transport: &str,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == Method::POST && req.uri().path() == "/echo" {
        let body = req.into_body().collect().await?.to_bytes();
        return Ok(Response::new(Full::new(body)));
    }
    Ok(greet(&req, peer, transport))
}

fn greet(req: &Request<Incoming>, peer: SocketAddr, transport: &str) -> Response<Full<Bytes>> {
    let text = format!(
        "hello {peer}, you asked for {} over {transport}\n",
        req.uri().path()
    );
    Response::new(Full::new(Bytes::from(text)))
}
