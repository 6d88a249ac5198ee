//! [`DeviceChoice`]: naming the device, port and GID a connection, listener or datagram socket
//! uses, instead of (or as well as) a local IP address.
//!
//! rdma_cm addresses by IP: an id goes through the device whose netdev carries its source
//! address. A choice is therefore turned into a source address from the port's GID table (RoCE
//! GIDs are IP addresses), and after rdma_cm bound or resolved the id, the device and port it
//! picked are checked against the choice.

use std::fmt;
use std::io;
use std::net::{IpAddr, SocketAddr, SocketAddrV6};

use super::ports::{Gid, GidKind, LinkLayer, Port, PortState};
use super::{Device, devices};
use crate::error;
use crate::verbs::{CmId, IdDevice};

/// A device by name, optionally one of its ports and a GID index on that port: where a
/// connection, listener or datagram socket goes through (`device(...)` on every options type,
/// [`crate::cm::ListenerOptions::device`]).
///
/// **How it picks the local address.** rdma_cm binds ids to IP addresses, so the choice names
/// the IP address of a GID of the port (RoCE GIDs are the IP addresses of the port's netdev):
/// - with a GID index: that GID's address;
/// - otherwise, among the GIDs of the port (of every port, active ones first, when no port is
///   named): one of the address family of the peer (when dialing) or of the bind address (when
///   it is a wildcard such as `0.0.0.0` or `[::]`), RoCE v2 before RoCE v1, a global address
///   before a link-local one, then the lowest index.
///
/// A GID index without a port means port 1. Which RoCE version the connection then uses is the
/// kernel's default for the port (rdma_cm's `default_roce_mode`, RoCE v2 unless configured
/// otherwise): rdma_cm picks the GID entry of the address with that type, so a GID index
/// selects an address, and the RoCE version only where the entries of one address differ.
///
/// **With an explicit bind address too** (`bind(...)` when dialing, the address of a listener
/// or datagram socket): a wildcard address takes its port (and family) from it and the address
/// from the choice; any other address must be one of the chosen GIDs' addresses, or it is an
/// `InvalidInput` error that says so.
///
/// **Errors.** An unknown device, port or GID index is `NotFound`, naming what there is; a port
/// without an address of the needed family is `AddrNotAvailable`; an InfiniBand port (whose
/// GIDs are not IP addresses: bind to its IPoIB address instead) is `Unsupported`. After
/// rdma_cm bound or resolved the id, a device or port other than the chosen one is
/// `AddrNotAvailable` (another device carrying the same address, for instance).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct DeviceChoice {
    device: String,
    port: Option<u8>,
    gid_index: Option<u32>,
}

impl DeviceChoice {
    /// The device called `device` (as `ibv_devices` shows it: `mlx5_0`, `rxe0`), any port.
    pub fn new(device: impl Into<String>) -> Self {
        DeviceChoice {
            device: device.into(),
            port: None,
            gid_index: None,
        }
    }

    /// Only port `port` (numbered from 1).
    pub fn port(mut self, port: u8) -> Self {
        self.port = Some(port);
        self
    }

    /// The address of the GID at `index` of the port (port 1 unless [`Self::port`] names one).
    pub fn gid_index(mut self, index: u32) -> Self {
        self.gid_index = Some(index);
        self
    }

    /// The device's name.
    pub fn device(&self) -> &str {
        &self.device
    }

    /// The port, if one is named.
    pub fn port_number(&self) -> Option<u8> {
        self.port
    }

    /// The GID index, if one is named.
    pub fn gid(&self) -> Option<u32> {
        self.gid_index
    }

    /// The local address an id dialing `peer` (when known) binds to, given the explicit bind
    /// address `bind` (kept when it agrees; a wildcard gives its port and family).
    pub(crate) fn local_addr(
        &self,
        bind: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    ) -> io::Result<SocketAddr> {
        let all = devices()?;
        let device = all
            .iter()
            .find(|d| d.name() == self.device)
            .ok_or_else(|| {
                let names: Vec<&str> = all.iter().map(Device::name).collect();
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "no RDMA device is called {:?} (the devices are: {})",
                        self.device,
                        if names.is_empty() {
                            "none".to_owned()
                        } else {
                            names.join(", ")
                        }
                    ),
                )
            })?;
        self.pick(&device.ports()?, bind, peer)
    }

    /// [`Self::local_addr`] on the listed `ports` of the device.
    pub(crate) fn pick(
        &self,
        ports: &[Port],
        bind: Option<SocketAddr>,
        peer: Option<SocketAddr>,
    ) -> io::Result<SocketAddr> {
        let candidates = self.candidates(ports)?;
        let shown = || describe(&candidates);
        let port = bind.map_or(0, |b| b.port());
        if let Some(bind) = bind.filter(|b| !b.ip().is_unspecified()) {
            return if candidates.iter().any(|g| g.ip == Some(bind.ip())) {
                Ok(bind)
            } else {
                Err(error::invalid_input(format!(
                    "the bind address {} is not an address of the chosen {self} (its addresses \
                     are: {}): name the device's address, or leave out one of the two",
                    bind.ip(),
                    shown()
                )))
            };
        }
        // The family the address must have: the peer's (an IPv4 source cannot reach an IPv6
        // peer), or the wildcard's.
        let family = peer.or(bind).map(|a| a.is_ipv4());
        let (best, ip) = candidates
            .iter()
            .filter_map(|g| Some((*g, g.ip?)))
            .filter(|(_, ip)| family.is_none_or(|v4| ip.is_ipv4() == v4))
            .min_by_key(|(g, ip)| (g.kind != GidKind::RoceV2, is_link_local(*ip), g.index))
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::AddrNotAvailable,
                    format!(
                        "the chosen {self} has no {} address{} (its addresses are: {})",
                        if family == Some(true) { "IPv4" } else { "IPv6" },
                        peer.map(|p| format!(" to reach {p}")).unwrap_or_default(),
                        shown()
                    ),
                )
            })?;
        Ok(socket_addr(best, ip, port))
    }

    /// The GIDs the choice allows, in the order of `ports`, active ports first.
    fn candidates<'a>(&self, ports: &'a [Port]) -> io::Result<Vec<&'a Gid>> {
        let numbers = || {
            ports
                .iter()
                .map(|p| p.number.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        let wanted = self.port.or(self.gid_index.map(|_| 1));
        let chosen: Vec<&Port> = match wanted {
            Some(number) => vec![ports.iter().find(|p| p.number == number).ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "RDMA device {} has no port {number} (its ports are: {})",
                        self.device,
                        numbers()
                    ),
                )
            })?],
            None => {
                let mut all: Vec<&Port> = ports.iter().collect();
                all.sort_by_key(|p| p.state != PortState::Active);
                all
            }
        };
        if chosen.iter().all(|p| p.link_layer == LinkLayer::InfiniBand) {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "the ports of the chosen {self} are InfiniBand ports, whose GIDs are not IP \
                     addresses: bind to the port's IPoIB address instead"
                ),
            ));
        }
        let gids: Vec<&Gid> = chosen
            .iter()
            .flat_map(|p| &p.gids)
            .filter(|g| g.ip.is_some())
            .collect();
        match self.gid_index {
            None => Ok(gids),
            Some(index) => match gids.iter().find(|g| g.index == index) {
                Some(gid) => Ok(vec![gid]),
                None => Err(io::Error::new(
                    io::ErrorKind::NotFound,
                    format!(
                        "port {} of RDMA device {} has no GID at index {index} (its GIDs are: {})",
                        wanted.unwrap_or(1),
                        self.device,
                        describe(&gids)
                    ),
                )),
            },
        }
    }

    /// Checks that rdma_cm bound or resolved `id` to the chosen device and port.
    pub(crate) fn verify(&self, id: &CmId) -> io::Result<()> {
        let bound = IdDevice::of(id)?;
        let port_ok = self.port.or(self.gid_index.map(|_| 1));
        if bound.name == self.device && port_ok.is_none_or(|p| p == bound.port_num) {
            return Ok(());
        }
        let local = id
            .local_addr()
            .map(|a| a.to_string())
            .unwrap_or_else(|_| "the address".to_owned());
        Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!(
                "rdma_cm put {local} on RDMA device {} port {}, not on the chosen {self}",
                bound.name, bound.port_num
            ),
        ))
    }
}

impl fmt::Display for DeviceChoice {
    /// `RDMA device rxe0`, `RDMA device rxe0 port 1`, `... GID index 1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "RDMA device {}", self.device)?;
        if let Some(port) = self.port {
            write!(f, " port {port}")?;
        }
        if let Some(index) = self.gid_index {
            write!(f, " GID index {index}")?;
        }
        Ok(())
    }
}

impl From<&str> for DeviceChoice {
    fn from(device: &str) -> Self {
        DeviceChoice::new(device)
    }
}

impl From<String> for DeviceChoice {
    fn from(device: String) -> Self {
        DeviceChoice::new(device)
    }
}

/// Where an id of `choice` binds (see [`DeviceChoice`]): `bind` unchanged without a choice.
pub(crate) fn source_addr(
    choice: Option<&DeviceChoice>,
    bind: Option<SocketAddr>,
    peer: Option<SocketAddr>,
) -> io::Result<Option<SocketAddr>> {
    match choice {
        None => Ok(bind),
        Some(choice) => choice.local_addr(bind, peer).map(Some),
    }
}

/// Checks `id` against `choice`, if any.
pub(crate) fn verify(choice: Option<&DeviceChoice>, id: &CmId) -> io::Result<()> {
    choice.map_or(Ok(()), |c| c.verify(id))
}

fn is_link_local(ip: IpAddr) -> bool {
    matches!(ip, IpAddr::V6(v6) if v6.segments()[0] & 0xffc0 == 0xfe80)
}

/// The socket address of `gid`'s address `ip`: a link-local IPv6 address gets its netdev's
/// scope.
fn socket_addr(gid: &Gid, ip: IpAddr, port: u16) -> SocketAddr {
    match ip {
        IpAddr::V6(v6) if is_link_local(IpAddr::V6(v6)) => {
            let scope = gid
                .netdev
                .as_deref()
                .and_then(|n| std::fs::read_to_string(format!("/sys/class/net/{n}/ifindex")).ok())
                .and_then(|s| s.trim().parse().ok())
                .unwrap_or(0);
            SocketAddr::V6(SocketAddrV6::new(v6, port, 0, scope))
        }
        ip => SocketAddr::new(ip, port),
    }
}

/// `1 10.77.0.1 (RoCE v2), 2 fd77::1 (RoCE v2)`.
fn describe(gids: &[&Gid]) -> String {
    if gids.is_empty() {
        return "none".to_owned();
    }
    gids.iter()
        .map(|g| match g.ip {
            Some(ip) => format!("{} {ip} ({})", g.index, g.kind),
            None => format!("{} {} ({})", g.index, g.to_hex(), g.kind),
        })
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gid(index: u32, ip: &str, kind: GidKind) -> Gid {
        let ip: IpAddr = ip.parse().unwrap();
        let gid = match ip {
            IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
            IpAddr::V6(v6) => v6.octets(),
        };
        Gid {
            index,
            gid,
            kind,
            netdev: Some("nonexistent0".to_owned()),
            ip: Some(ip),
        }
    }

    fn ports() -> Vec<Port> {
        vec![Port {
            number: 1,
            state: PortState::Active,
            active_mtu: 1024,
            link_layer: LinkLayer::Ethernet,
            netdev: Some("nonexistent0".to_owned()),
            gids: vec![
                gid(0, "fe80::1", GidKind::RoceV2),
                gid(1, "10.77.0.1", GidKind::RoceV1),
                gid(2, "fd77::1", GidKind::RoceV2),
                gid(3, "10.77.0.1", GidKind::RoceV2),
            ],
        }]
    }

    fn pick(choice: DeviceChoice, bind: Option<&str>, peer: Option<&str>) -> io::Result<String> {
        choice
            .pick(
                &ports(),
                bind.map(|b| b.parse().unwrap()),
                peer.map(|p| p.parse().unwrap()),
            )
            .map(|a| a.to_string())
    }

    fn rxe() -> DeviceChoice {
        DeviceChoice::new("rxe9")
    }

    #[test]
    fn the_peer_family_then_roce_v2_then_global_addresses_win() {
        assert_eq!(
            pick(rxe(), None, Some("10.77.0.2:1")).unwrap(),
            "10.77.0.1:0"
        );
        assert_eq!(
            pick(rxe(), None, Some("[fd77::2]:1")).unwrap(),
            "[fd77::1]:0"
        );
        // No peer, no family: RoCE v2, global, lowest index.
        assert_eq!(pick(rxe(), None, None).unwrap(), "[fd77::1]:0");
        // A wildcard gives its family and port.
        assert_eq!(
            pick(rxe(), Some("0.0.0.0:7471"), None).unwrap(),
            "10.77.0.1:7471"
        );
        assert_eq!(
            pick(rxe(), Some("[::]:7471"), None).unwrap(),
            "[fd77::1]:7471"
        );
    }

    #[test]
    fn a_gid_index_picks_its_address() {
        assert_eq!(pick(rxe().gid_index(1), None, None).unwrap(), "10.77.0.1:0");
        assert_eq!(
            pick(rxe().port(1).gid_index(0), None, None).unwrap(),
            "[fe80::1]:0"
        );
    }

    #[test]
    fn an_agreeing_bind_address_is_kept_and_a_contradicting_one_refused() {
        assert_eq!(
            pick(rxe(), Some("10.77.0.1:9"), None).unwrap(),
            "10.77.0.1:9"
        );
        let err = pick(rxe(), Some("10.99.0.1:9"), None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
        assert!(err.to_string().contains("10.99.0.1"), "{err}");
        assert!(err.to_string().contains("10.77.0.1 (RoCE v2)"), "{err}");
        let err = pick(rxe().gid_index(2), Some("10.77.0.1:9"), None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput, "{err}");
    }

    #[test]
    fn unknown_ports_and_gids_are_not_found_naming_what_exists() {
        let err = pick(rxe().port(2), None, None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("ports are: 1"), "{err}");
        let err = pick(rxe().gid_index(7), None, None).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::NotFound, "{err}");
        assert!(err.to_string().contains("2 fd77::1 (RoCE v2)"), "{err}");
    }

    #[test]
    fn a_missing_family_is_addr_not_available() {
        let err = pick(rxe().gid_index(1), None, Some("[fd77::2]:1")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable, "{err}");
        assert!(err.to_string().contains("no IPv6 address"), "{err}");
    }
}
