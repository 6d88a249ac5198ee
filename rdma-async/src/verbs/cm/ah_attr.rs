//! [`AhAttr`]: where a datagram goes, as rdma_cm reports it for a peer (a SIDR reply) or a
//! multicast group (a join): the attributes an address handle is made from.

use std::fmt;

use rdma_async_sys as sys;

/// Address handle attributes (`struct ibv_ah_attr`) as rdma_cm reports them for a peer or group.
#[derive(Clone, Copy)]
pub(crate) struct AhAttr(pub(in crate::verbs) sys::ibv_ah_attr);

impl AhAttr {
    /// The destination GID (for a group: the multicast GID to attach a queue pair to).
    pub(crate) fn dgid(&self) -> [u8; 16] {
        // SAFETY: every bit pattern is a valid `raw` view of the GID union.
        unsafe { self.0.grh.dgid.raw }
    }

    /// The traffic class of the global route header (on RoCE, the id's type of service).
    #[cfg(rdma_async_hooks)]
    pub(crate) fn traffic_class(&self) -> u8 {
        self.0.grh.traffic_class
    }

    /// The destination LID (InfiniBand; zero on RoCE).
    pub(crate) fn dlid(&self) -> u16 {
        self.0.dlid
    }
}

impl fmt::Debug for AhAttr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AhAttr")
            .field("dgid", &std::net::Ipv6Addr::from(self.dgid()))
            .field("dlid", &self.0.dlid)
            .field("is_global", &self.0.is_global)
            .field("port_num", &self.0.port_num)
            .finish()
    }
}
