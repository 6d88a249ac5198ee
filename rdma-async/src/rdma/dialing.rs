//! The connect and accept of the connection types that build their queue pair before the
//! handshake and send their options' private data ([`RdmaConnection`](super::RdmaConnection)
//! and `Endpoint`): the options are checked, then [`handshake::connect`] or
//! [`handshake::accept`] runs with their dial options and connection parameters. (`RStream`
//! sends connection data of its own and calls the handshake itself.)
//!
//! It lives here, below `endpoint`, so that both types share it without `rdma` depending on
//! `endpoint`.

use std::io;
use std::sync::Arc;

use tokio::net::ToSocketAddrs;

use crate::cm::handshake::{self, DialOptions};
use crate::cm::link::CmLink;
use crate::cm::{ConnParams, ConnectRequest};
use crate::verbs::CmId;

/// Options that drive a handshake.
pub(crate) trait HandshakeOptions {
    /// Checks the options; returns the dial options and connection parameters of the handshake.
    fn for_handshake(&self) -> io::Result<(&DialOptions, &ConnParams)>;
}

/// Checks `options`, then connects to `addr` as [`handshake::connect`] does: `build` creates the
/// queue pair once the device is known, `assemble` makes the connection of it and the link.
pub(crate) async fn connect<A, O, P, T>(
    addr: A,
    options: &O,
    build: impl Fn(&Arc<CmId>, &O) -> io::Result<P>,
    assemble: impl Fn(P, CmLink, &O) -> io::Result<T>,
) -> io::Result<T>
where
    A: ToSocketAddrs,
    O: HandshakeOptions,
{
    let (dial, params) = options.for_handshake()?;
    handshake::connect(
        addr,
        dial,
        params,
        |id| Ok((build(id, options)?, None)),
        |parts, link| assemble(parts, link, options),
    )
    .await
}

/// Checks `options`, then accepts `request` as [`handshake::accept`] does, with `build` and
/// `assemble` as in [`connect`].
pub(crate) async fn accept<O, P, T>(
    request: ConnectRequest,
    options: &O,
    build: impl FnOnce(&Arc<CmId>, &O) -> io::Result<P>,
    assemble: impl FnOnce(P, CmLink, &O) -> io::Result<T>,
) -> io::Result<T>
where
    O: HandshakeOptions,
{
    let (dial, params) = options.for_handshake()?;
    handshake::accept(
        request,
        dial,
        params,
        |id| Ok((build(id, options)?, None)),
        |parts, link| assemble(parts, link, options),
    )
    .await
}
