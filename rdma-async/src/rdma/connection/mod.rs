//! [`RdmaConnection`]: a reliable connected queue pair with send/receive, RDMA read/write and
//! atomics on caller-owned registered memory. This file holds the type and what it reports
//! about itself; its setup, memory, operations and teardown are in the sibling files.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

use super::completion_task::ConnShared;

mod atomics;
mod batch;
mod closing;
#[cfg(rdma_async_hooks)]
pub mod hooks;
mod memory;
mod messages;
mod one_sided;
mod posting;
mod setup;

/// A connected RDMA queue pair (reliable connected, `RDMA_PS_TCP`) for verbs-level operations on
/// registered memory: sends and receives (with immediate data), one-sided RDMA reads and writes
/// (with immediate), atomic compare-and-swap and fetch-and-add, and their vectored forms.
///
/// Memory comes from the connection ([`Self::reg_msgs`], [`Self::reg_read`],
/// [`Self::reg_write`], [`Self::register`]) and is registered with its protection domain. Every
/// operation takes its buffer **by value** and returns it with the result, like `tokio-uring`:
/// while the device owns the memory, nothing else can reach it.
///
/// Up to `send_depth` send-queue operations (sends, writes, reads, atomics) and `recv_depth`
/// receives may be in flight at once, from any number of tasks (the methods take `&self`); one
/// more waits for a slot. A completion wakes exactly the operation it belongs to.
///
/// ```no_run
/// use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};
///
/// # async fn demo() -> std::io::Result<()> {
/// let conn = RdmaConnection::connect("10.77.0.1:7471").await?;
/// // The peer advertised a region in a message: receive it.
/// let (got, msg) = conn.recv(conn.reg_msgs(64)?, ..).await;
/// let remote = RemoteRegion::from_bytes(&msg[..got?.len()])?;
/// // Write 4 KiB into it, then read it back.
/// let mut buf = conn.reg_msgs(4096)?;
/// buf.fill(7);
/// let (res, buf) = conn.write(buf, .., remote.slice(0, 4096)?).await;
/// res?;
/// let (res, buf) = conn.read(buf, ..4096, remote.whole()).await;
/// res?;
/// assert!(buf.iter().all(|&b| b == 7));
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Every operation is cancel safe in the memory sense: dropping its future before the
/// completion leaves the buffer in the connection's table of outstanding work requests, which
/// frees it (deregisters, then deallocates) only when the completion has been polled. The
/// operation itself still happens (a dropped send is still sent, a dropped write still lands);
/// only its result and the buffer are lost to the caller. A dropped **receive** stays posted: the
/// next message the peer sends may land in it and is then dropped with the buffer — it is never
/// written to freed memory, but it is lost to the application.
///
/// An operation's `Ok` means its completion arrived: for a send or an RDMA write, the peer's
/// device acknowledged the data (it is in the peer's memory); for a read or an atomic, the
/// result is in your region. An operation whose future was dropped, or that was still in
/// flight when the connection was dropped, promises nothing.
///
/// Dropping the connection disconnects, moves the queue pair to the error state so every
/// outstanding work request completes as flushed, and frees the buffers once those completions
/// have been polled (by the connection's task, which lingers for that; at most 10 s, after which
/// the queue pair is destroyed before its buffers are freed, which is equally safe).
///
/// The completion task runs on the Tokio runtime the connection was created on. If that task
/// cannot go on (polling the completion queue fails, or the runtime is shut down while the
/// connection is still in use), the connection ends: its queue pair is destroyed, every pending
/// operation ends with the cause and gets its buffers back, and every later one is refused with
/// it.
#[derive(Debug)]
pub struct RdmaConnection {
    shared: Arc<ConnShared>,
    /// The completion task; it ends after a close has drained the queue pair.
    completion_task: Option<tokio::task::JoinHandle<()>>,
}

impl RdmaConnection {
    /// The peer's address.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::peer_addr`.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.shared.link.peer_addr())
    }

    /// The local address.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpStream::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.shared.link.local_addr())
    }

    /// The private data the peer sent in the handshake (zero-padded on IB/RoCE).
    pub fn peer_private_data(&self) -> &[u8] {
        self.shared.link.peer_private_data()
    }

    /// The local queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.shared.qp.qp_num()
    }

    /// Sends and writes of up to this many bytes go inline:
    /// [`RdmaOptions::max_inline`](crate::rdma::RdmaOptions::max_inline), capped by what the
    /// device granted.
    pub fn max_inline(&self) -> u32 {
        self.shared.qp.inline_limit()
    }

    /// How many sends and writes of this connection went out inline.
    pub fn inline_sends(&self) -> u64 {
        self.shared.qp.inline_posts()
    }

    /// How many `ibv_post_send` calls (doorbells) the connection's send-queue operations took.
    /// An operation alone on the send queue rings its own. Operations posted while others are
    /// outstanding leave their requests to be posted together: the first of them lets the
    /// tasks of the same scheduler pass add theirs, then posts all of them with one call (and
    /// the connection's completion task posts what waits before it polls). On Soft-RoCE each
    /// call is a system call; on a NIC, an MMIO write.
    pub fn post_send_calls(&self) -> u64 {
        self.shared.qp.send_posts()
    }

    /// The name of the RDMA device the connection runs on (picked by the route to the peer or
    /// the bound address).
    pub fn device_name(&self) -> &str {
        &self.shared.device.name
    }

    /// The device port the connection runs on.
    pub fn port_num(&self) -> u8 {
        self.shared.device.port_num
    }

    /// The attributes of the connection's device and of the port it uses (the only entry of
    /// `ports`), as [`crate::device::Device::attributes`] reads them.
    pub fn device_attributes(&self) -> crate::device::DeviceAttributes {
        let dev = &self.shared.device;
        let mut attrs = crate::device::DeviceAttributes::from_sys(&dev.attr, &[]);
        attrs.ports.push(crate::device::PortAttributes::from_sys(
            dev.port_num,
            &dev.port,
        ));
        attrs
    }

    /// Whether the device supports atomic operations (`atomic_cap` other than
    /// `IBV_ATOMIC_NONE`).
    pub fn supports_atomics(&self) -> bool {
        self.shared.device.attr.atomic_cap != rdma_async_sys::ibv_atomic_cap::IBV_ATOMIC_NONE
    }
}
