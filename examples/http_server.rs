//! An HTTP server (hyper, HTTP/1.1 or HTTP/2 prior knowledge) over RDMA.
//!
//! ```text
//! http_server [address:port]        # default 10.77.0.1:8080
//! ```
//!
//! `POST /echo` answers with the request's body, unchanged; every other request gets a greeting
//! that names the request's path and the peer.

use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rdma_async::stream::RListener;

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> std::io::Result<()> {
    let addr = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "10.77.0.1:8080".into());
    let listener = RListener::bind(addr).await?;
    println!("listening on http://{}", listener.local_addr()?);
    loop {
        let (stream, peer) = listener.accept().await?;
        tokio::spawn(async move {
            let service = service_fn(move |req| answer(req, peer));
            // `auto` picks HTTP/1.1 or HTTP/2 from the first bytes, as over TCP.
            let served = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
            if let Err(e) = served {
                eprintln!("{peer}: {e}");
            }
        });
    }
}

async fn answer(
    req: Request<Incoming>,
    peer: SocketAddr,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == Method::POST && req.uri().path() == "/echo" {
        let body = req.into_body().collect().await?.to_bytes();
        return Ok(Response::new(Full::new(body)));
    }
    Ok(greet(&req, peer))
}

fn greet(req: &Request<Incoming>, peer: SocketAddr) -> Response<Full<Bytes>> {
    let text = format!(
        "hello {peer}, you asked for {} over RDMA\n",
        req.uri().path()
    );
    Response::new(Full::new(Bytes::from(text)))
}
