//! `ListenerOptions`: how a [`CmListener`](super::CmListener) listens (backlog, device, id
//! options).

use super::id_options::IdOptions;
use super::listener::DEFAULT_BACKLOG;
use crate::device::DeviceChoice;

/// How a [`CmListener`](super::CmListener) listens: the listen backlog (1024 by default, as
/// `TcpListener::bind`'s), the device it listens on (any, by default) and the rdma_cm id
/// options. Passed by reference, as every options type of the crate is (the crate root says
/// why).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenerOptions {
    pub(crate) backlog: i32,
    pub(crate) device: Option<DeviceChoice>,
    pub(crate) id: IdOptions,
}

impl Default for ListenerOptions {
    fn default() -> Self {
        ListenerOptions {
            backlog: DEFAULT_BACKLOG,
            device: None,
            id: IdOptions::default(),
        }
    }
}

impl ListenerOptions {
    /// A backlog of 1024, any device, no id options set.
    pub fn new() -> Self {
        Self::default()
    }

    /// The listen backlog: connection requests rdma_cm queues until they are accepted.
    pub fn backlog(mut self, backlog: i32) -> Self {
        self.backlog = backlog;
        self
    }

    /// Listens only on the chosen device (port, GID): a wildcard address (`0.0.0.0:port`,
    /// `[::]:port`) gives its port and family and the address comes from the port's GID table;
    /// any other address must be one of the chosen GIDs'. See [`DeviceChoice`] for how the
    /// address is picked.
    pub fn device(mut self, choice: impl Into<DeviceChoice>) -> Self {
        self.device = Some(choice.into());
        self
    }

    /// `rdma_set_option` options: address reuse, IPv6-only and type of service are set on the
    /// listening id; the ACK timeout on every accepted id whose accepting type's options do not
    /// set one.
    pub fn id_options(mut self, options: IdOptions) -> Self {
        self.id = options;
        self
    }
}
