//! Listing devices, ports and GIDs (`Device::ports`), checked against the guest's own
//! `ibv_devinfo -v`, `rdma link` and `ip addr`.

use std::net::{Ipv4Addr, Ipv6Addr};

use rdma_async::device::{DeviceContext, GidKind, LinkLayer, PortState, devices};
use rdma_async_device_tests::tools::output_of;
use rdma_async_device_tests::{test_ip, test_ip6};

/// `ibv_devinfo -v -d <dev>`'s GID lines of port 1: (index, GID as printed, type).
fn devinfo_gids(text: &str) -> Vec<(u32, String, String)> {
    text.lines()
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("GID[")?;
            let (index, rest) = rest.split_once("]:")?;
            let (gid, kind) = rest.trim().split_once(", ")?;
            Some((
                index.trim().parse().ok()?,
                gid.trim().to_owned(),
                kind.trim().to_owned(),
            ))
        })
        .collect()
}

/// The bytes of a GID as `ibv_devinfo` shows it.
fn gid_bytes(shown: &str) -> [u8; 16] {
    if let Ok(v6) = shown.parse::<Ipv6Addr>() {
        return v6.octets();
    }
    if let Ok(v4) = shown.parse::<Ipv4Addr>() {
        return v4.to_ipv6_mapped().octets();
    }
    let groups: Vec<u16> = shown
        .split(':')
        .map(|g| u16::from_str_radix(g, 16).unwrap_or_else(|e| panic!("GID {shown:?}: {e}")))
        .collect();
    assert_eq!(groups.len(), 8, "GID {shown:?}");
    let mut bytes = [0; 16];
    for (i, g) in groups.iter().enumerate() {
        bytes[2 * i..2 * i + 2].copy_from_slice(&g.to_be_bytes());
    }
    bytes
}

#[rdma_async::test]
async fn ports_and_gids_match_ibv_devinfo_rdma_link_and_ip_addr() {
    // The device of the test address (rxe0 in the Soft-RoCE guest).
    let name = DeviceContext::for_local_addr(test_ip())
        .unwrap()
        .device_name()
        .to_owned();
    let all = devices().unwrap();
    let device = all
        .iter()
        .find(|d| d.name() == name)
        .unwrap_or_else(|| panic!("no {name} among {all:?}"));
    let ports = device.ports().unwrap();
    assert_eq!(ports.len(), 1, "{ports:?}");
    let port = &ports[0];
    assert_eq!(port.number, 1);
    assert_eq!(port.state, PortState::Active);
    assert_eq!(port.link_layer, LinkLayer::Ethernet);
    assert!(port.active_mtu >= 256, "{port:?}");

    // rdma link: state and netdev.
    let link = output_of("rdma", &["link", "show", &format!("{name}/1")]).await;
    assert!(
        link.contains(&format!("state {}", port.state)),
        "rdma link says {link:?}, we say {port:?}"
    );
    let netdev = port.netdev.clone().expect("a RoCE port has a netdev");
    assert!(
        link.contains(&format!("netdev {netdev} ")) || link.trim_end().ends_with(&netdev),
        "rdma link says {link:?}, we say netdev {netdev}"
    );

    // ibv_devinfo -v: every GID with its index and type, nothing more, nothing less.
    let devinfo = output_of("ibv_devinfo", &["-v", "-d", &name, "-i", "1"]).await;
    let theirs = devinfo_gids(&devinfo);
    assert!(!theirs.is_empty(), "no GID lines in {devinfo}");
    // ibv_devinfo prints a GID as an IPv6 address (`::ffff:10.77.0.1`), as an IPv4 address or
    // as eight hex groups, depending on its version: compare the 16 bytes.
    let theirs: Vec<(u32, [u8; 16], String)> = theirs
        .into_iter()
        .map(|(index, shown, kind)| (index, gid_bytes(&shown), kind))
        .collect();
    let ours: Vec<(u32, [u8; 16], String)> = port
        .gids
        .iter()
        .map(|g| (g.index, g.gid, g.kind.to_string()))
        .collect();
    assert_eq!(ours, theirs, "ours vs ibv_devinfo -v:\n{devinfo}");

    // ip addr: the test addresses are GIDs of the port, and every GID's IP but the default's is
    // on its netdev. RoCE's default GID (index 0) is the link-local address made from the
    // netdev's MAC address (EUI-64), not one of its addresses: the netdev's own link-local
    // address can differ from it.
    let addrs = output_of("ip", &["-o", "addr", "show", "dev", &netdev]).await;
    for wanted in [test_ip(), test_ip6()] {
        let gid = port
            .gids
            .iter()
            .find(|g| g.ip == Some(wanted))
            .unwrap_or_else(|| panic!("no GID for {wanted} among {:?}", port.gids));
        if name.starts_with("rxe") {
            assert_eq!(gid.kind, GidKind::RoceV2, "Soft-RoCE's GIDs are RoCE v2");
        }
        assert_eq!(gid.netdev.as_deref(), Some(netdev.as_str()));
    }
    for gid in port.gids.iter().filter(|g| g.index != 0) {
        let Some(ip) = gid.ip else { continue };
        assert!(
            addrs.contains(&format!(" {ip}/")),
            "GID address {ip} (index {}) is not on {netdev}: {addrs}",
            gid.index
        );
    }
    let default = port
        .gids
        .iter()
        .find(|g| g.index == 0)
        .unwrap_or_else(|| panic!("no default GID (index 0) among {:?}", port.gids));
    let bytes = default.gid;
    assert!(
        bytes[..8] == [0xfe, 0x80, 0, 0, 0, 0, 0, 0] && bytes[11..13] == [0xff, 0xfe],
        "the default GID (index 0) is an EUI-64 link-local address: {default:?}"
    );
}
