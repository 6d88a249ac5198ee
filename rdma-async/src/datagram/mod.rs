//! Unreliable datagrams and multicast over RDMA: [`RDatagram`], used like
//! `tokio::net::UdpSocket`.
//!
//! A socket is a UD queue pair on an rdma_cm id of the `RDMA_PS_UDP` port space, bound to an
//! address of an RDMA device. Peers are addressed by IP and rdma_cm port, as UDP peers are: the
//! first datagram to a peer resolves it (address and route resolution, then a SIDR exchange,
//! `rdma_connect` on a UDP id, whose reply carries the peer's queue pair number, Q_Key and
//! address handle attributes), and the result is cached per peer. Multicast groups are joined
//! with `rdma_join_multicast`.
//!
//! ```no_run
//! use rdma_async::datagram::RDatagram;
//!
//! # async fn demo() -> std::io::Result<()> {
//! let server = RDatagram::bind("10.77.0.1:7174").await?;
//! let client = RDatagram::bind("10.77.0.1:0").await?;
//! client.send_to(b"ping", "10.77.0.1:7174").await?;   // resolves the peer once
//! let mut buf = [0u8; 1024];
//! let (n, from) = server.recv_from(&mut buf).await?;
//! server.send_to(&buf[..n], from).await?;               // answered by the datagram's route
//! let (n, _) = client.recv_from(&mut buf).await?;
//! assert_eq!(&buf[..n], b"ping");
//!
//! // Multicast: every socket that joined receives what is sent to the group.
//! let group = "239.1.2.3".parse().unwrap();
//! server.join_multicast(group).await?;
//! client.join_multicast(group).await?;
//! client.send_to(b"to all", (group, 0)).await?;
//! # Ok(()) }
//! ```
//!
//! Limits and behaviour, as UDP has them:
//!
//! - A datagram is one packet: at most the active MTU of the device port
//!   ([`RDatagram::max_datagram`]); a longer one is refused with `InvalidInput` before anything
//!   is posted.
//! - Receive buffers stay posted: up to the receive depth ([`RDatagramOptions::recv_depth`])
//!   datagrams are kept while nobody reads; beyond that the device drops them (UD has no
//!   receiver-not-ready retries). Between rdma-async sockets the drops are counted
//!   ([`DatagramStats::dropped`]).
//! - A datagram longer than the buffer given to `recv_from` is truncated to it.
//! - A socket remembers at most [`RDatagramOptions::max_peers`] peers (routes, each with an
//!   address handle, and senders), forgetting the least recently used first.
//! - A datagram from a new sender only records the way back (its completion and header); the
//!   address handle that answers it is made when `send_to` first needs it, on a blocking thread,
//!   since on RoCE making it can resolve the sender's neighbour: senders cannot stall the
//!   runtime by appearing from new addresses.
//! - A group datagram from an rdma-async socket names its sender's bound port in its immediate
//!   data, so `recv_from` reports the sender's address and `send_to` answers it; C tools' group
//!   datagrams name no port (it is 0).
//! - The 40-byte Global Route Header the device writes in front of each received datagram is
//!   read for the sender's address and never handed to the application.
//!
//! | outcome | `io::ErrorKind` |
//! |---|---|
//! | datagram longer than [`RDatagram::max_datagram`] | `InvalidInput` |
//! | nothing bound at the destination (SIDR reply "unsupported") | `ConnectionRefused` |
//! | no SIDR reply | `TimedOut` |
//! | address or route resolution failed | as in [`crate::cm`] |
//! | sending to a group not joined | `NotConnected` |

mod address_handles;
pub(crate) mod grh;
pub(crate) mod hello;
mod lru;
mod multicast;
mod options;
pub(crate) mod peers;
mod responder;
mod route_slot;
mod sidr;
mod socket;
mod stats;

pub use options::RDatagramOptions;
pub use socket::RDatagram;
#[cfg(rdma_async_hooks)]
#[doc(hidden)]
pub use socket::hooks;
pub use stats::DatagramStats;
