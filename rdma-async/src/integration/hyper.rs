//! hyper 1.x / hyper-util client glue: [`RConnector`] makes
//! `hyper_util::client::legacy::Client` speak HTTP over [`RStream`].
//!
//! ```no_run
//! use http_body_util::Empty;
//! use bytes::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use rdma_async::integration::hyper::RConnector;
//!
//! # async fn demo() -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let client = Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(RConnector::new());
//! let response = client.get("http://10.77.0.1:8080/".parse()?).await?;
//! assert!(response.status().is_success());
//! # Ok(()) }
//! ```
//!
//! For HTTP/2 with prior knowledge (there is no ALPN over rdma_cm), build the client with
//! `.http2_only(true)`.
//!
//! A server needs no glue: `TokioIo::new(stream)` turns an accepted [`RStream`] into hyper's
//! `Read + Write`, ready for `hyper::server::conn::http1::Builder::serve_connection` or
//! `hyper_util::server::conn::auto::Builder::serve_connection`.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;

use crate::stream::{RStream, RStreamOptions};

impl Connection for RStream {
    /// A plain connection: no proxy, no negotiated HTTP/2 (rdma_cm has no ALPN, so HTTP/2 is
    /// chosen by the client's `http2_only`).
    fn connected(&self) -> Connected {
        Connected::new()
    }
}

/// A connector for `hyper_util::client::legacy::Client` that opens an [`RStream`] to the
/// request URI's `host:port`.
///
/// The port defaults to 80 for `http` (and for a URI without a scheme) and to 443 for `https`;
/// the connector itself never speaks TLS, so `https` only makes sense under a TLS layer that
/// wraps this connector. The host is resolved as [`RStream::connect`] does and each address is
/// tried in turn. Cloning is cheap: a connector is one pointer, and its clones share the options.
///
/// # Errors
///
/// The connect future fails with `InvalidInput` for a URI without a host or with a scheme
/// other than `http` / `https`, and otherwise as [`RStream::connect_with`].
///
/// # Cancel safety
///
/// Dropping the connect future releases the half-built connection, as with
/// [`RStream::connect_with`]. (hyper-util's pool does not drop a connect it started, even when
/// an idle connection turns up first: it finishes it in the background and pools the result.)
#[derive(Debug, Clone, Default)]
pub struct RConnector {
    // Behind an `Arc` because hyper-util clones the connector into every request's future
    // (pooled connection or not) and moves that future around: one pointer to copy, not the
    // whole set of options.
    options: Arc<RStreamOptions>,
}

impl RConnector {
    /// A connector whose streams use the default [`RStreamOptions`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A connector whose streams use `options`.
    pub fn with_options(options: &RStreamOptions) -> Self {
        RConnector {
            options: Arc::new(options.clone()),
        }
    }
}

/// Where to connect for `uri`: the host without IPv6 brackets, and the port.
fn host_port(uri: &http::Uri) -> io::Result<(String, u16)> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
    let default_port = match uri.scheme_str() {
        None | Some("http") => 80,
        Some("https") => 443,
        Some(other) => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("unsupported URI scheme {other:?} in {uri}"),
            ));
        }
    };
    // `Uri::host` keeps the brackets of an IPv6 literal, which address parsing rejects.
    let host = host
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    Ok((host, uri.port_u16().unwrap_or(default_port)))
}

impl tower_service::Service<http::Uri> for RConnector {
    type Response = TokioIo<RStream>;
    type Error = io::Error;
    // Boxed so that it is `Unpin` and nameable, as the legacy client requires.
    type Future = Pin<Box<dyn Future<Output = io::Result<TokioIo<RStream>>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        // No shared resource to wait for: every call opens its own connection.
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let options = Arc::clone(&self.options);
        Box::pin(async move {
            let (host, port) = host_port(&uri)?;
            let stream = RStream::connect_with((host.as_str(), port), &options).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::{RConnector, host_port};
    use crate::stream::RStreamOptions;

    fn hp(uri: &str) -> std::io::Result<(String, u16)> {
        host_port(&uri.parse().unwrap())
    }

    #[test]
    fn ports_default_by_scheme() {
        assert_eq!(hp("http://10.0.0.1/x").unwrap(), ("10.0.0.1".into(), 80));
        assert_eq!(
            hp("http://10.0.0.1:8080/").unwrap(),
            ("10.0.0.1".into(), 8080)
        );
        assert_eq!(hp("https://h.example/").unwrap(), ("h.example".into(), 443));
        assert_eq!(hp("10.0.0.1:81").unwrap(), ("10.0.0.1".into(), 81));
        assert_eq!(hp("http://[fe80::1]:9/").unwrap(), ("fe80::1".into(), 9));
    }

    #[test]
    fn rejects_missing_host_and_other_schemes() {
        assert_eq!(
            hp("/only/a/path").unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
        assert_eq!(
            hp("ftp://h/").unwrap_err().kind(),
            std::io::ErrorKind::InvalidInput
        );
    }

    #[test]
    fn a_connector_is_one_pointer_and_its_clones_share_their_options() {
        assert_eq!(
            std::mem::size_of::<RConnector>(),
            std::mem::size_of::<usize>()
        );
        let connector = RConnector::with_options(&RStreamOptions::default());
        let clone = connector.clone();
        assert!(Arc::ptr_eq(&connector.options, &clone.options));
    }
}
