//! [`IdDevice`]: the device and port an rdma_cm id is bound to, with their attributes
//! (`ibv_query_device`, `ibv_query_port`), queried once the id has resolved an address or bound
//! to one.

use std::io;

use rdma_async_sys as sys;

use super::cm_id::CmId;
use crate::verbs::device::{device_name, query_device, query_port};

/// An open device's attributes and the port an rdma_cm id is bound to.
#[derive(Clone)]
pub(crate) struct IdDevice {
    pub(crate) name: String,
    pub(crate) port_num: u8,
    pub(crate) attr: sys::ibv_device_attr,
    pub(crate) port: sys::ibv_port_attr,
}

impl std::fmt::Debug for IdDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IdDevice")
            .field("name", &self.name)
            .field("port_num", &self.port_num)
            .finish_non_exhaustive()
    }
}

impl IdDevice {
    /// The device and port an id is bound to (after address resolution or a bind).
    pub(crate) fn of(id: &CmId) -> io::Result<Self> {
        let ctx = id.verbs()?;
        // SAFETY: the id is live; `port_num` is a plain field librdmacm set when it bound the id.
        let port_num = unsafe { (*id.as_ptr()).port_num };
        Ok(IdDevice {
            name: device_name(ctx),
            port_num,
            attr: query_device(ctx)?,
            port: query_port(ctx, port_num)?,
        })
    }
}
