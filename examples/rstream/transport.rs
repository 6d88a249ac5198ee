//! Connection setup for the two backends, kernel TCP (`-T s`) and RDMA streams (the default),
//! and the socket options rstream.c's `set_options` applies to every socket.

use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Tcp,
    Rdma,
}

/// What rstream.c sets on each socket before connecting, on the listener before each accept,
/// and on each accepted socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// SO_SNDBUF and SO_RCVBUF both (`-B`, 512 KiB when not given).
    pub buffer_size: usize,
    /// The rsockets inline size, RDMA only: `-i` on the latency connection of the default run,
    /// 0 on its bandwidth connection, left alone (`None`) in a custom run.
    pub inline_size: Option<usize>,
    /// TCP keepalive idle time in seconds (`-k`), off when `None`.
    pub keepalive: Option<u32>,
    /// `-T l`: a receive ring that lends its bytes (RDMA only).
    pub lent_reads: bool,
}

/// Resolves `host` like rstream.c's `getaddrinfo`: the first answer is used, no fallback to the
/// others. With `numeric` (`-f ip`) only address literals are accepted.
pub async fn resolve(host: &str, port: u16, numeric: bool) -> io::Result<SocketAddr> {
    if numeric {
        let ip: IpAddr = host.parse().map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("getaddrinfo: {host} is not a numeric address (-f ip)"),
            )
        })?;
        return Ok(SocketAddr::new(ip, port));
    }
    tokio::net::lookup_host((host, port))
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("getaddrinfo {host}: {e}")))?
        .next()
        .ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("getaddrinfo {host}: no address"),
            )
        })
}

/// Where the server listens without `-b`: the first passive address glibc returns, IPv4's.
pub fn any_address(port: u16) -> SocketAddr {
    SocketAddr::new(Ipv4Addr::UNSPECIFIED.into(), port)
}

#[derive(Debug)]
pub enum Listener {
    Tcp(TcpListener),
    Rdma(RdmaListener),
}

#[derive(Debug)]
pub enum Connection {
    Tcp(TcpStream),
    Rdma(RdmaStream),
}

impl Listener {
    /// Binds and listens with a backlog of 1 and SO_REUSEADDR, as rstream.c does.
    pub async fn bind(backend: Backend, addr: SocketAddr) -> io::Result<Self> {
        match backend {
            Backend::Tcp => listen_tcp(addr).map(Listener::Tcp),
            Backend::Rdma => listen_rdma(addr).await.map(Listener::Rdma),
        }
    }

    pub async fn accept(&self, opts: &StreamOptions) -> io::Result<Connection> {
        match self {
            Listener::Tcp(listener) => accept_tcp(listener, opts).await.map(Connection::Tcp),
            Listener::Rdma(listener) => accept_rdma(listener, opts).await.map(Connection::Rdma),
        }
    }
}

/// Connects to `dst`, from `src` when given (`-b` on the client).
pub async fn connect(
    backend: Backend,
    dst: SocketAddr,
    src: Option<SocketAddr>,
    opts: &StreamOptions,
) -> io::Result<Connection> {
    match backend {
        Backend::Tcp => connect_tcp(dst, src, opts).await.map(Connection::Tcp),
        Backend::Rdma => connect_rdma(dst, src, opts).await.map(Connection::Rdma),
    }
}

// ---------------------------------------------------------------------------------------------
// Kernel TCP (-T s)
// ---------------------------------------------------------------------------------------------

fn listen_tcp(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = new_tcp_socket(addr)?;
    socket.set_reuseaddr(true)?;
    socket
        .bind(addr)
        .map_err(|e| io::Error::new(e.kind(), format!("bind {addr}: {e}")))?;
    socket.listen(1)
}

async fn accept_tcp(listener: &TcpListener, opts: &StreamOptions) -> io::Result<TcpStream> {
    // rstream.c sets its options on the listening socket before every accept (the accepted
    // socket inherits them), and then once more on the accepted socket.
    set_tcp_options(SockRef::from(listener), opts);
    let (stream, _peer) = listener
        .accept()
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("accept: {e}")))?;
    set_tcp_options(SockRef::from(&stream), opts);
    Ok(stream)
}

async fn connect_tcp(
    dst: SocketAddr,
    src: Option<SocketAddr>,
    opts: &StreamOptions,
) -> io::Result<TcpStream> {
    let socket = new_tcp_socket(dst)?;
    // Before connecting: the buffer sizes decide the window scale the SYN offers.
    set_tcp_options(SockRef::from(&socket), opts);
    if let Some(src) = src {
        socket
            .bind(src)
            .map_err(|e| io::Error::new(e.kind(), format!("bind {src}: {e}")))?;
    }
    socket
        .connect(dst)
        .await
        .map_err(|e| io::Error::new(e.kind(), format!("connect {dst}: {e}")))
}

fn new_tcp_socket(addr: SocketAddr) -> io::Result<TcpSocket> {
    if addr.is_ipv4() {
        TcpSocket::new_v4()
    } else {
        TcpSocket::new_v6()
    }
}

/// Buffer sizes, TCP_NODELAY and keepalive. Failures are warnings: rstream.c ignores the
/// results of these setsockopt calls (and only reports the keepalive ones).
fn set_tcp_options(socket: SockRef<'_>, opts: &StreamOptions) {
    warn("SO_SNDBUF", socket.set_send_buffer_size(opts.buffer_size));
    warn("SO_RCVBUF", socket.set_recv_buffer_size(opts.buffer_size));
    warn("TCP_NODELAY", socket.set_tcp_nodelay(true));
    if let Some(idle) = opts.keepalive {
        let keepalive = TcpKeepalive::new().with_time(Duration::from_secs(idle.into()));
        warn("SO_KEEPALIVE", socket.set_tcp_keepalive(&keepalive));
        // rstream.c reads both back and prints them, once per socket it configures.
        if let Ok(on) = socket.keepalive() {
            println!("Keepalive: {}", if on { "ON" } else { "OFF" });
        }
        if let Ok(time) = socket.tcp_keepalive_time() {
            println!("  time: {}", time.as_secs());
        }
    }
}

fn warn(what: &str, result: io::Result<()>) {
    if let Err(e) = result {
        eprintln!("rstream: setsockopt {what}: {e}");
    }
}

// ---------------------------------------------------------------------------------------------
// RDMA streams: rdma-async's RStream, which speaks rsockets' wire protocol.
//
// The listener is the connection-management one, so that each accepted stream gets the options
// of its connection (rstream sets inline 64 on the default run's latency connection and 0 on its
// bandwidth connection, on the listener, before each accept). `-k` maps to RStream's keepalive.
// ---------------------------------------------------------------------------------------------

pub type RdmaListener = rdma_async::cm::CmListener;
pub type RdmaStream = rdma_async::stream::RStream;

/// rsockets' SO_SNDBUF/SO_RCVBUF of `n` give rings of `2n` bytes.
fn rdma_options(opts: &StreamOptions) -> rdma_async::stream::RStreamOptions {
    let ring = u32::try_from(opts.buffer_size.saturating_mul(2)).unwrap_or(u32::MAX);
    let mut options = rdma_async::stream::RStreamOptions::new()
        .send_buffer_size(ring)
        .recv_buffer_size(ring);
    if let Some(inline) = opts.inline_size {
        options = options.inline_size(u32::try_from(inline).unwrap_or(u32::MAX));
    }
    // RDMA_ASYNC_BUSY_POLL_US: see the example's documentation.
    if let Some(us) = std::env::var("RDMA_ASYNC_BUSY_POLL_US")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        options = options.busy_poll(Duration::from_micros(us));
    }
    if let Some(seconds) = opts.keepalive {
        options = options.keepalive(Duration::from_secs(u64::from(seconds)));
    }
    options.zero_copy_reads(opts.lent_reads)
}

async fn listen_rdma(addr: SocketAddr) -> io::Result<RdmaListener> {
    rdma_async::cm::CmListener::bind(addr).await
}

async fn accept_rdma(listener: &RdmaListener, opts: &StreamOptions) -> io::Result<RdmaStream> {
    let request = listener.accept_request().await?;
    RdmaStream::accept(request, &rdma_options(opts)).await
}

async fn connect_rdma(
    dst: SocketAddr,
    src: Option<SocketAddr>,
    opts: &StreamOptions,
) -> io::Result<RdmaStream> {
    let mut options = rdma_options(opts);
    if let Some(src) = src {
        options = options.bind(src);
    }
    RdmaStream::connect_with(dst, &options).await
}
