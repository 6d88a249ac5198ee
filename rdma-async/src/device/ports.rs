//! A device's ports and their GID tables, with the RoCE version, netdev and IP address of each
//! GID (what `ibv_devinfo -v` and `rdma link` show together).
//!
//! The state, MTU and link layer come from `ibv_query_port`; the GID table from sysfs
//! (`/sys/class/infiniband/<dev>/ports/<p>/gids/<i>`, `gid_attrs/types/<i>`,
//! `gid_attrs/ndevs/<i>`), which is where libibverbs reads it too and the only place the GID
//! type and netdev are published without the extended verbs.

use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv6Addr};
use std::path::Path;

use super::{Device, PortAttributes};

/// Where the kernel publishes RDMA devices.
pub(crate) const SYSFS_ROOT: &str = "/sys/class/infiniband";

/// The state of a port (`enum ibv_port_state`), as `ibv_devinfo` and `rdma link` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum PortState {
    /// `PORT_DOWN`: no link (on RoCE, the netdev is down).
    Down,
    /// `PORT_INIT`: link up, not yet configured by the subnet manager (InfiniBand).
    Init,
    /// `PORT_ARMED`: configured, not yet active (InfiniBand).
    Armed,
    /// `PORT_ACTIVE`: carries traffic.
    Active,
    /// `PORT_ACTIVE_DEFER`.
    ActiveDefer,
    /// Anything else the device reports (`PORT_NOP`).
    Unknown,
}

impl PortState {
    /// From `ibv_devinfo`'s spelling (`PORT_ACTIVE`, ...), as [`PortAttributes::state`] holds it.
    pub(crate) fn from_devinfo(state: &str) -> Self {
        match state {
            "PORT_DOWN" => PortState::Down,
            "PORT_INIT" => PortState::Init,
            "PORT_ARMED" => PortState::Armed,
            "PORT_ACTIVE" => PortState::Active,
            "PORT_ACTIVE_DEFER" => PortState::ActiveDefer,
            _ => PortState::Unknown,
        }
    }
}

impl fmt::Display for PortState {
    /// `rdma link`'s spelling: `DOWN`, `INIT`, `ARMED`, `ACTIVE`, `ACTIVE_DEFER`, `NOP`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            PortState::Down => "DOWN",
            PortState::Init => "INIT",
            PortState::Armed => "ARMED",
            PortState::Active => "ACTIVE",
            PortState::ActiveDefer => "ACTIVE_DEFER",
            PortState::Unknown => "NOP",
        })
    }
}

/// The link layer of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkLayer {
    /// InfiniBand: GIDs are a subnet prefix and a port GUID, not IP addresses.
    InfiniBand,
    /// Ethernet (RoCE, iWARP): GIDs are IP addresses of the port's netdevs.
    Ethernet,
}

/// What kind of address a GID is (sysfs `gid_attrs/types/<i>`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum GidKind {
    /// An InfiniBand GID (`IB/RoCE v1` on an InfiniBand port).
    InfiniBand,
    /// RoCE v1: Ethernet frames with ethertype 0x8915, not routable across IP subnets.
    RoceV1,
    /// RoCE v2: RDMA in UDP/IP (port 4791), routable; what rdma_cm uses by default.
    RoceV2,
}

impl fmt::Display for GidKind {
    /// As sysfs and `ibv_devinfo -v` spell it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GidKind::InfiniBand => "IB",
            GidKind::RoceV1 => "RoCE v1",
            GidKind::RoceV2 => "RoCE v2",
        })
    }
}

/// One entry of a port's GID table.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Gid {
    /// The GID index (what `ibv_devinfo -v` prints as `GID[  i]`).
    pub index: u32,
    /// The 16 bytes of the GID, in network order.
    pub gid: [u8; 16],
    /// Its kind.
    pub kind: GidKind,
    /// The netdev the GID belongs to (RoCE), e.g. `eth0`; `None` on InfiniBand.
    pub netdev: Option<String>,
    /// The IP address the GID stands for: IPv4 for an IPv4-mapped GID (`::ffff:a.b.c.d`),
    /// otherwise the IPv6 address (link-local `fe80::` for the default GID of a RoCE port);
    /// `None` on InfiniBand, where GIDs are not IP addresses.
    pub ip: Option<IpAddr>,
}

impl Gid {
    /// The GID as `ibv_devinfo` prints it: eight groups of four hex digits.
    pub fn to_hex(&self) -> String {
        self.gid
            .chunks(2)
            .map(|pair| format!("{:02x}{:02x}", pair[0], pair[1]))
            .collect::<Vec<_>>()
            .join(":")
    }
}

/// One port of a device: its state, MTU, link layer and GID table.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Port {
    /// The port number (from 1).
    pub number: u8,
    /// Its state when listed.
    pub state: PortState,
    /// The MTU in use, in bytes.
    pub active_mtu: u32,
    /// The link layer.
    pub link_layer: LinkLayer,
    /// The netdev of the port (RoCE; `rdma link`'s `netdev`), when the kernel names one.
    pub netdev: Option<String>,
    /// The valid entries of the GID table, by index (empty entries are left out).
    pub gids: Vec<Gid>,
}

impl Port {
    /// The entry at GID index `index`, if it is valid.
    pub fn gid(&self, index: u32) -> Option<&Gid> {
        self.gids.iter().find(|g| g.index == index)
    }
}

impl Device {
    /// The device's ports with their state, MTU, link layer, netdev and GID table, each GID with
    /// its RoCE version, netdev and IP address (`ibv_devinfo -v` and `rdma link` in one).
    ///
    /// # Errors
    ///
    /// As [`Device::attributes`]. GID entries sysfs does not show (no sysfs mounted) are left
    /// out rather than failing.
    pub fn ports(&self) -> io::Result<Vec<Port>> {
        let attrs = self.attributes()?;
        Ok(ports_of(Path::new(SYSFS_ROOT), self.name(), &attrs.ports))
    }
}

/// The IP address a RoCE GID stands for.
pub(crate) fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Parses sysfs' `gids/<i>` (`fe80:0000:...:6d7c`).
fn parse_gid(text: &str) -> Option<[u8; 16]> {
    let groups: Vec<&str> = text.trim().split(':').collect();
    if groups.len() != 8 {
        return None;
    }
    let mut gid = [0u8; 16];
    for (i, group) in groups.iter().enumerate() {
        let value = u16::from_str_radix(group, 16).ok()?;
        gid[2 * i..2 * i + 2].copy_from_slice(&value.to_be_bytes());
    }
    Some(gid)
}

fn read_trimmed(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_owned())
}

/// The valid GID entries of port `port` of `device`, read under `root` (sysfs' infiniband class).
pub(crate) fn read_gids(root: &Path, device: &str, port: u8, ethernet: bool) -> Vec<Gid> {
    let dir = root.join(device).join("ports").join(port.to_string());
    let Ok(entries) = std::fs::read_dir(dir.join("gids")) else {
        return Vec::new();
    };
    let mut indices: Vec<u32> = entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect();
    indices.sort_unstable();
    indices
        .into_iter()
        .filter_map(|index| {
            let gid = parse_gid(&read_trimmed(&dir.join("gids").join(index.to_string()))?)?;
            if gid == [0; 16] {
                return None;
            }
            // An empty entry's attributes fail to read (EINVAL): skip the entry then.
            let kind_text = read_trimmed(&dir.join("gid_attrs/types").join(index.to_string()));
            let kind = match kind_text.as_deref() {
                _ if !ethernet => GidKind::InfiniBand,
                Some("RoCE v2") => GidKind::RoceV2,
                Some(_) => GidKind::RoceV1,
                None => return None,
            };
            let netdev = read_trimmed(&dir.join("gid_attrs/ndevs").join(index.to_string()))
                .filter(|n| !n.is_empty());
            Some(Gid {
                index,
                gid,
                kind,
                netdev,
                ip: ethernet.then(|| gid_ip(gid)),
            })
        })
        .collect()
}

/// The ports of `device` from its queried attributes and the GID tables under `root`.
pub(crate) fn ports_of(root: &Path, device: &str, attrs: &[PortAttributes]) -> Vec<Port> {
    attrs
        .iter()
        .map(|a| {
            let gids = read_gids(root, device, a.port_num, a.ethernet);
            // `rdma link`'s netdev is the netdev of the port's default GID.
            let netdev = gids.iter().find_map(|g| g.netdev.clone());
            Port {
                number: a.port_num,
                state: PortState::from_devinfo(&a.state),
                active_mtu: a.active_mtu,
                link_layer: if a.ethernet {
                    LinkLayer::Ethernet
                } else {
                    LinkLayer::InfiniBand
                },
                netdev,
                gids,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use std::path::PathBuf;

    /// An IPv4 address as a RoCE GID carries it.
    fn mapped(v4: Ipv4Addr) -> [u8; 16] {
        v4.to_ipv6_mapped().octets()
    }

    /// A fake sysfs tree with one RoCE port: a link-local, an IPv4 and an IPv6 GID, and an empty
    /// entry in between.
    fn fake_tree(name: &str) -> PathBuf {
        let root =
            std::env::temp_dir().join(format!("rdma-async-ports-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let port = root.join("rxe9/ports/1");
        for d in ["gids", "gid_attrs/types", "gid_attrs/ndevs"] {
            std::fs::create_dir_all(port.join(d)).unwrap();
        }
        let entries: [(u32, &str, Option<&str>); 4] = [
            (
                0,
                "fe80:0000:0000:0000:6848:aaff:fe7b:6d7c",
                Some("RoCE v2"),
            ),
            (
                1,
                "0000:0000:0000:0000:0000:ffff:0a4d:0001",
                Some("RoCE v2"),
            ),
            (2, "0000:0000:0000:0000:0000:0000:0000:0000", None),
            (
                3,
                "fd77:0000:0000:0000:0000:0000:0000:0001",
                Some("IB/RoCE v1"),
            ),
        ];
        for (i, gid, kind) in entries {
            std::fs::write(port.join(format!("gids/{i}")), format!("{gid}\n")).unwrap();
            if let Some(kind) = kind {
                std::fs::write(port.join(format!("gid_attrs/types/{i}")), kind).unwrap();
                std::fs::write(port.join(format!("gid_attrs/ndevs/{i}")), "rdma0\n").unwrap();
            }
        }
        root
    }

    #[test]
    fn gids_are_read_with_their_kind_netdev_and_ip() {
        let root = fake_tree("read");
        let gids = read_gids(&root, "rxe9", 1, true);
        let _ = std::fs::remove_dir_all(&root);
        let summary: Vec<_> = gids
            .iter()
            .map(|g| (g.index, g.kind, g.netdev.as_deref(), g.ip))
            .collect();
        assert_eq!(
            summary,
            [
                (
                    0,
                    GidKind::RoceV2,
                    Some("rdma0"),
                    Some("fe80::6848:aaff:fe7b:6d7c".parse().unwrap())
                ),
                (
                    1,
                    GidKind::RoceV2,
                    Some("rdma0"),
                    Some("10.77.0.1".parse().unwrap())
                ),
                (
                    3,
                    GidKind::RoceV1,
                    Some("rdma0"),
                    Some("fd77::1".parse().unwrap())
                ),
            ]
        );
        assert_eq!(gids[1].gid, mapped(Ipv4Addr::new(10, 77, 0, 1)));
        assert_eq!(gids[1].to_hex(), "0000:0000:0000:0000:0000:ffff:0a4d:0001");
    }

    #[test]
    fn infiniband_gids_have_no_ip() {
        let root = fake_tree("ib");
        let gids = read_gids(&root, "rxe9", 1, false);
        let _ = std::fs::remove_dir_all(&root);
        assert!(gids.iter().all(|g| g.ip.is_none()));
        assert!(gids.iter().all(|g| g.kind == GidKind::InfiniBand));
    }

    #[test]
    fn a_missing_port_has_no_gids() {
        assert!(read_gids(Path::new("/nonexistent"), "rxe9", 1, true).is_empty());
    }

    #[test]
    fn port_states_parse_from_both_spellings() {
        assert_eq!(PortState::from_devinfo("PORT_ACTIVE"), PortState::Active);
        assert_eq!(PortState::Active.to_string(), "ACTIVE");
    }
}
