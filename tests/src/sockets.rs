//! Listeners and datagram sockets bound on the test address, each on an ephemeral port.

use std::net::IpAddr;

use rdma_async::cm::CmListener;
use rdma_async::datagram::RDatagram;
use rdma_async::stream::{RListener, RStreamOptions};

use crate::addr::test_addr;

/// An rdma_cm listener on the test address.
pub async fn listener() -> CmListener {
    CmListener::bind(test_addr(0))
        .await
        .expect("bind listener on the RDMA test address")
}

/// An `RListener` on the test address.
pub async fn rlistener() -> RListener {
    rlistener_with(RStreamOptions::new()).await
}

/// An `RListener` on the test address whose connections use `options`.
pub async fn rlistener_with(options: RStreamOptions) -> RListener {
    RListener::bind_with(test_addr(0), &options)
        .await
        .expect("bind RListener")
}

/// A datagram socket on `ip` (the test address, IPv4 or IPv6).
pub async fn datagram(ip: IpAddr) -> RDatagram {
    RDatagram::bind(std::net::SocketAddr::new(ip, 0))
        .await
        .expect("bind a datagram socket on the RDMA test address")
}
