//! rdma_cm, above the devices: ids (`rdma_cm_id`, the analogue of a socket) and the event
//! channels they report on (`rdma_event_channel`), the socket addresses they take, multicast
//! joins, what rdma_cm reports for a datagram peer or group, and the device an id is bound to.

mod ah_attr;
mod cm_id;
mod event_channel;
mod id_device;
mod multicast;
mod sockaddr;

pub(crate) use ah_attr::AhAttr;
pub(crate) use cm_id::{CmId, PortSpace, RawConnParam};
pub(crate) use event_channel::{CmEvent, EventChannel, IncomingId, UdParam};
pub(crate) use id_device::IdDevice;
