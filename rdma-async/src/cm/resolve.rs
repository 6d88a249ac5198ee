//! Turning `host:port` into socket addresses.

use std::io;
use std::net::SocketAddr;

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
