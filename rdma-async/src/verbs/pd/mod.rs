//! Protection domains (`ibv_pd`), allocated on the device context an rdma_cm id or librdmacm's
//! device list holds open, and the address handles made on them (`ibv_ah`), which may answer
//! the sender of a received datagram from its work completion: so this floor is above both
//! rdma_cm and the completions.

mod address_handle;
mod protection_domain;
#[cfg(rdma_async_hooks)]
pub(crate) mod reply_handle_hold;

pub(crate) use address_handle::{AddressHandle, GRH_LEN};
pub(crate) use protection_domain::ProtectionDomain;
