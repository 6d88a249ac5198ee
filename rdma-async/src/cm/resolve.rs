//! Turning `host:port` into socket addresses.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::{ToSocketAddrs, lookup_host};

/// Resolves `addr` like `TcpStream::connect` does (numeric addresses without a lookup), with an
/// error that names what could not be resolved.
pub(crate) async fn resolve<A: ToSocketAddrs>(addr: A) -> io::Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = lookup_host(addr)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("cannot resolve the address: {e}")))?
        .collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "could not resolve to any address",
        ));
    }
    Ok(addrs)
}

/// Resolves `addr` and tries `attempt` on each address in turn; returns the first success or
/// the last error, like `TcpStream::connect` and `TcpListener::bind`.
pub(crate) async fn each_addr<A, T, F, Fut>(addr: A, mut attempt: F) -> io::Result<T>
where
    A: ToSocketAddrs,
    F: FnMut(SocketAddr) -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    let mut last = None;
    for addr in resolve(addr).await? {
        match attempt(addr).await {
            Ok(value) => return Ok(value),
            Err(e) => last = Some(e),
        }
    }
    // `resolve` never returns an empty list; this only keeps the function total.
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to try")))
}

/// As [`each_addr`], each attempt bounded by `limit`.
pub(crate) async fn connect_each<A, T, F, Fut>(
    addr: A,
    limit: Option<Duration>,
    mut attempt: F,
) -> io::Result<T>
where
    A: ToSocketAddrs,
    F: FnMut(SocketAddr) -> Fut,
    Fut: Future<Output = io::Result<T>>,
{
    each_addr(addr, |dst| {
        let attempt = attempt(dst);
        async move {
            match limit {
                Some(limit) => tokio::time::timeout(limit, attempt)
                    .await
                    .unwrap_or_else(|_| {
                        Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            format!("connecting to {dst} timed out after {limit:?}"),
                        ))
                    }),
                None => attempt.await,
            }
        }
    })
    .await
}
