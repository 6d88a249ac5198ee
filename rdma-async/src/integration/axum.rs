//! axum 0.8 glue: `axum::serve::Listener` for [`RListener`], so `axum::serve` serves over RDMA.
//!
//! ```no_run
//! use axum::{Router, routing::get};
//! use rdma_async::stream::RListener;
//!
//! # async fn demo() -> std::io::Result<()> {
//! let listener = RListener::bind("10.77.0.1:8080").await?;
//! let app = Router::new().route("/", get(|| async { "hello over RDMA" }));
//! axum::serve(listener, app).await
//! # }
//! ```
//!
//! # `ConnectInfo`
//!
//! axum 0.8 provides `ConnectInfo<SocketAddr>` only for its own `TcpListener` and for
//! `axum::serve::TapIo<L, F>` (whose connect info is `L::Addr`); the orphan rule keeps this
//! crate from adding `Connected<IncomingStream<'_, RListener>> for SocketAddr`. So wrap the
//! listener with `ListenerExt::tap_io` (a no-op tap) to get the peer's address in handlers:
//!
//! ```no_run
//! use std::net::SocketAddr;
//!
//! use axum::extract::ConnectInfo;
//! use axum::serve::ListenerExt;
//! use axum::{Router, routing::get};
//! use rdma_async::stream::RListener;
//!
//! # async fn demo() -> std::io::Result<()> {
//! let listener = RListener::bind("10.77.0.1:8080").await?.tap_io(|_| {});
//! let app = Router::new().route(
//!     "/",
//!     get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.to_string() }),
//! );
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```

use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use crate::stream::{RListener, RStream};

/// How long to wait after a listener-level accept error before trying again, as axum's own
/// `TcpListener` impl does (the condition, e.g. a device going away, may pass).
const ACCEPT_ERROR_BACKOFF: Duration = Duration::from_secs(1);

impl axum::serve::Listener for RListener {
    type Io = RStream;
    type Addr = SocketAddr;

    /// Waits for the next connection. axum's contract is that this never fails, so errors are
    /// handled here as axum's own `TcpListener` impl handles them: failures caused by one peer
    /// (already skipped by [`RListener::accept`], and `ConnectionRefused` /
    /// `ConnectionAborted` / `ConnectionReset`) are retried at once; any other error (a request
    /// this host could not set up, such as `EMFILE`, or the listener's own failure) is logged,
    /// then retried after one second, so that a persistent condition does not spin while
    /// descriptors or the device come back.
    ///
    /// # Cancel safety
    ///
    /// As [`RListener::accept`]: nothing leaks, and a handshake in progress when the future is
    /// dropped fails for that peer.
    async fn accept(&mut self) -> (RStream, SocketAddr) {
        loop {
            match RListener::accept(self).await {
                Ok(accepted) => return accepted,
                Err(e) if is_connection_error(&e) => {
                    tracing::debug!(error = %e, "accept: connection failed");
                }
                Err(e) => {
                    tracing::error!(error = %e, "accept error");
                    tokio::time::sleep(ACCEPT_ERROR_BACKOFF).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        RListener::local_addr(self)
    }
}

/// The errors that concern one connection rather than the listener (axum's own list).
fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
