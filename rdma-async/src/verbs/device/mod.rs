//! The lowest floor: what there is before any rdma_cm id or verbs object. The device lists
//! (`ibv_get_device_list`, and `rdma_get_devices`, whose contexts librdmacm opens), what a device
//! and its ports can do, a device's asynchronous events, the limits that creating verbs objects
//! runs into (and the test hook that fakes running into them), and the registration of channel
//! descriptors with Tokio.

mod async_events;
mod async_fd;
mod cm_devices;
mod device_attr;
mod device_list;
#[cfg(rdma_async_hooks)]
pub(crate) mod fault_injection;
mod resource;
mod resource_limits;

pub(crate) use async_events::{AsyncEventFd, RawAsyncEvent, event_type_str, query_port_state};
pub(crate) use async_fd::{ChannelFd, register_readable};
pub(super) use async_fd::{OwnsFd, set_nonblocking};
pub(crate) use cm_devices::CmDevices;
pub(super) use device_attr::{device_name, query_device, query_port};
pub(crate) use device_list::DeviceList;
// `pub` so that the test hooks (`--cfg rdma_async_hooks`) can re-export it; without them it stays
// crate-private.
pub use resource::Resource;
pub(super) use resource_limits::{
    COMPLETION_QUEUES, DeviceLimits, MEMORY_REGIONS, Memlock, QUEUE_PAIRS, completion_queue_error,
    injected_failure, queue_pair_error, registration_error,
};
pub(crate) use resource_limits::{ResourceError, binding_memlock_limit};
