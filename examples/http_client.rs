//! An HTTP client (hyper-util's pooled client) over RDMA: GETs a URL a few times on one
//! kept-alive connection and prints the bodies.
//!
//! ```text
//! http_client [--h2] [url]          # default http://10.77.0.1:8080/
//! ```
//!
//! `--h2` speaks HTTP/2 with prior knowledge (rdma_cm has no ALPN).

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rdma_async::integration::hyper::RConnector;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let mut h2 = false;
    let mut url = "http://10.77.0.1:8080/".to_owned();
    for arg in std::env::args().skip(1) {
        match arg.as_str() {
            "--h2" => h2 = true,
            _ => url = arg,
        }
    }
    let client = Client::builder(TokioExecutor::new())
        .http2_only(h2)
        .build::<_, Empty<Bytes>>(RConnector::new());
    for _ in 0..3 {
        let response = client.get(url.parse()?).await?;
        println!("{:?} {}", response.version(), response.status());
        let body = response.into_body().collect().await?.to_bytes();
        print!("{}", String::from_utf8_lossy(&body));
    }
    Ok(())
}
