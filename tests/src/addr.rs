//! The addresses of the RDMA netdev the device tests run on.

use std::net::{IpAddr, SocketAddr};

/// The address of the RDMA netdev, as `scripts/softroce` exports it.
pub fn test_ip() -> IpAddr {
    ip_from_env("RDMA_ASYNC_TEST_ADDR")
}

/// The IPv6 address of the RDMA netdev.
pub fn test_ip6() -> IpAddr {
    ip_from_env("RDMA_ASYNC_TEST_ADDR6")
}

/// `port` on [`test_ip`] (0: an ephemeral port).
pub fn test_addr(port: u16) -> SocketAddr {
    SocketAddr::new(test_ip(), port)
}

/// `port` on [`test_ip6`] (0: an ephemeral port).
pub fn test_addr6(port: u16) -> SocketAddr {
    SocketAddr::new(test_ip6(), port)
}

fn ip_from_env(var: &str) -> IpAddr {
    let value = std::env::var(var).unwrap_or_else(|_| {
        panic!("{var} is not set: run the device tests through scripts/softroce")
    });
    value
        .parse()
        .unwrap_or_else(|e| panic!("{var}={value:?} is not an IP address: {e}"))
}
