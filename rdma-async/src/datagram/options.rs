//! Sizes and timeouts of an [`RDatagram`](super::RDatagram).

use crate::device::{DeviceChoice, DeviceContext};
use std::io;
use std::time::Duration;

use crate::cm::IdOptions;
use crate::cm::queue_setters::{QueueOptions, queue_setters};
use crate::error;

/// Options for [`RDatagram::bind_with`](super::RDatagram::bind_with).
///
/// The receive depth is the socket's receive buffer: that many datagrams are kept while nobody
/// reads, and further ones are dropped by the device (as a full UDP socket buffer drops them).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RDatagramOptions {
    pub(crate) queue: QueueOptions,
    pub(crate) max_datagram: Option<usize>,
    pub(crate) resolve_timeout: Duration,
    pub(crate) id: IdOptions,
    pub(crate) max_peers: usize,
    pub(crate) context: Option<DeviceContext>,
    pub(crate) device: Option<DeviceChoice>,
}

/// The default of [`RDatagramOptions::max_peers`].
const DEFAULT_MAX_PEERS: usize = 1024;

impl Default for RDatagramOptions {
    fn default() -> Self {
        RDatagramOptions {
            queue: QueueOptions::new(64, 128, 0),
            max_datagram: None,
            resolve_timeout: Duration::from_secs(2),
            id: IdOptions::default(),
            max_peers: DEFAULT_MAX_PEERS,
            context: None,
            device: None,
        }
    }
}

impl RDatagramOptions {
    /// The defaults: 128 receive buffers, 64 sends in flight, datagrams up to the port's MTU,
    /// 2 s address and route resolution timeouts (as `udaddy`), 10 µs busy-poll, 1024 peers
    /// remembered.
    pub fn new() -> Self {
        Self::default()
    }

    queue_setters! {
        /// Receive buffers kept posted: datagrams kept while nobody reads.
        recv_depth;
        /// Sends in flight before `send_to` waits for the device.
        send_depth;
        /// Adaptive as [`RStreamOptions::busy_poll`](crate::stream::RStreamOptions::busy_poll)
        /// is: stretched up to 8 × `time` when completions arrive just after the window.
        busy_poll;
    }

    /// The largest datagram this socket sends or receives; by default, and at most, the active
    /// MTU of the device port (UD messages are one packet). A smaller value saves memory.
    pub fn max_datagram(mut self, bytes: usize) -> Self {
        self.max_datagram = Some(bytes);
        self
    }

    /// Timeout of address and of route resolution, and of the SIDR exchange, each, when
    /// reaching a new peer (2 s by default).
    pub fn resolve_timeout(mut self, time: Duration) -> Self {
        self.resolve_timeout = time;
        self
    }

    /// `rdma_set_option` options of the socket's rdma_cm ids: the bound one (address reuse)
    /// and those that resolve its peers and join its groups (type of service, which the routes
    /// to them carry). The ACK timeout does not apply to datagrams.
    pub fn id_options(mut self, options: IdOptions) -> Self {
        self.id = options;
        self
    }

    /// How many peers the socket remembers (1024 by default, at least 1): at most this many
    /// routes are cached (each holds an address handle of the device), and at most this many
    /// senders are known by their bound address (and as many anonymous SIDR ports), each table
    /// forgetting the peer it used least recently to make room for a new one. Every new
    /// sender, and every SIDR request introducing a new port, adds a peer, so without a bound
    /// peers could make a socket hold memory and address handles without limit.
    ///
    /// A forgotten route costs the next [`send_to`](super::RDatagram::send_to) to that peer a
    /// new SIDR exchange, or is learned again from the peer's next datagram. A forgotten sender
    /// is known again when it next resolves the socket; until then its datagrams are
    /// attributed to its IP address with the port of the latest SIDR request from that address
    /// that did not introduce itself, or 0. An address handle lives on after its route is
    /// forgotten until the sends that name it complete, so a socket holds at most
    /// `max_peers + send_depth` address handles, plus one per group joined.
    pub fn max_peers(mut self, n: usize) -> Self {
        self.max_peers = n.max(1);
        self
    }

    /// The device context to work in (see [`DeviceContext`]): by default the shared context of
    /// the device the bound address is on. A context of another device than the bound
    /// address's fails the bind with `InvalidInput`.
    pub fn context(mut self, context: DeviceContext) -> Self {
        self.context = Some(context);
        self
    }

    /// The RDMA device to bind on, by name (`"rxe0"`), or a device, port and GID index
    /// ([`DeviceChoice`], which says how the address is picked from the port's GID table). The
    /// bind address may then be a wildcard (`0.0.0.0:port`, `[::]:port`): it gives its port and
    /// family. Any other bind address must be an address of the chosen GIDs, or binding fails
    /// with `InvalidInput`; an unknown device, port or GID index is `NotFound`.
    pub fn device(mut self, choice: impl Into<DeviceChoice>) -> Self {
        self.device = Some(choice.into());
        self
    }

    /// The datagram size limit given the port's MTU.
    pub(crate) fn datagram_limit(&self, port_mtu: usize) -> io::Result<usize> {
        match self.max_datagram {
            None => Ok(port_mtu),
            Some(n) if n <= port_mtu => Ok(n),
            Some(n) => Err(error::invalid_input(format!(
                "max_datagram of {n} bytes exceeds the port MTU of {port_mtu} bytes \
                 (an RDMA datagram is one packet)"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_is_the_mtu_unless_smaller() {
        assert_eq!(RDatagramOptions::new().datagram_limit(1024).unwrap(), 1024);
        let small = RDatagramOptions::new().max_datagram(100);
        assert_eq!(small.datagram_limit(1024).unwrap(), 100);
        let big = RDatagramOptions::new().max_datagram(4096);
        let err = big.datagram_limit(1024).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("1024"), "{err}");
    }

    #[test]
    fn depths_are_at_least_one() {
        let o = RDatagramOptions::new()
            .recv_depth(0)
            .send_depth(0)
            .max_peers(0);
        assert_eq!(
            (o.queue.recv_depth, o.queue.send_depth, o.max_peers),
            (1, 1, 1)
        );
        assert_eq!(RDatagramOptions::new().max_peers, 1024);
    }
}
