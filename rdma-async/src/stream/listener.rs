//! `RListener`: accepts rsockets-compatible streams.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_core::Stream;
use tokio::net::ToSocketAddrs;

use super::options::RStreamOptions;
use super::rstream::RStream;
use crate::cm::CmListener;

/// Listens for [`RStream`] connections: a drop-in for `tokio::net::TcpListener`.
///
/// Options set on the listener apply to every accepted stream (as rsockets' accepted sockets
/// inherit the listener's). A handshake that fails (a peer that sends invalid connection data
/// or goes away) fails only that connection: `accept` logs it and waits for the next one.
#[derive(Debug)]
pub struct RListener {
    cm: CmListener,
    options: RStreamOptions,
}

impl RListener {
    /// Binds to `addr` and listens, with the default stream options.
    ///
    /// # Errors
    ///
    /// As [`CmListener::bind`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Self::bind_with(addr, RStreamOptions::default()).await
    }

    /// Binds to `addr` and listens; accepted streams use `options`.
    ///
    /// # Errors
    ///
    /// As [`CmListener::bind`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with<A: ToSocketAddrs>(addr: A, options: RStreamOptions) -> io::Result<Self> {
        Ok(RListener {
            cm: CmListener::bind(addr).await?,
            options,
        })
    }

    /// The address the listener is bound to.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpListener::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.cm.local_addr())
    }

    /// Waits for the next connection and completes its handshake.
    ///
    /// # Errors
    ///
    /// Only errors of the listener itself (`NetworkDown` when the device went away);
    /// per-connection failures are logged and skipped.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in that nothing leaks; a handshake in progress when the future is dropped
    /// fails for that peer.
    pub async fn accept(&self) -> io::Result<(RStream, SocketAddr)> {
        loop {
            let request = self.cm.accept_request().await?;
            let peer = request.peer_addr();
            match RStream::accept(request, &self.options).await {
                Ok(stream) => return Ok((stream, peer)),
                Err(e) => tracing::warn!(%peer, error = %e, "rsocket handshake failed"),
            }
        }
    }
}

impl RListener {
    /// The accepted connections as a [`Stream`] (for `serve_with_incoming`-style APIs). An
    /// error of the listener itself is yielded once, then the stream ends, so a consumer that
    /// retries errors does not spin on a dead listener.
    pub fn into_incoming(self) -> Incoming {
        Incoming {
            listener: Arc::new(self),
            accept: None,
            done: false,
        }
    }
}

type AcceptFuture = Pin<Box<dyn Future<Output = io::Result<(RStream, SocketAddr)>> + Send>>;

/// The connections of an [`RListener`], from [`RListener::into_incoming`].
pub struct Incoming {
    listener: Arc<RListener>,
    accept: Option<AcceptFuture>,
    done: bool,
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("listener", &self.listener)
            .field("done", &self.done)
            .finish()
    }
}

impl Stream for Incoming {
    type Item = io::Result<RStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let listener = self.listener.clone();
        let accept = self
            .accept
            .get_or_insert_with(|| Box::pin(async move { listener.accept().await }));
        let result = ready!(accept.as_mut().poll(cx));
        self.accept = None;
        Poll::Ready(Some(match result {
            Ok((stream, _peer)) => Ok(stream),
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }))
    }
}
