//! [`SocketHandles`]: where a datagram socket makes its address handles, and how many of them
//! are alive. They are the socket's device resources that peers make it create (one per route
//! and group), so the count is what the peer tables' bounds are checked against.

use std::io;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::verbs::{AddressHandle, AhAttr, GRH_LEN, ProtectionDomain, WorkCompletion};

/// A socket's protection domain (perhaps shared with other sockets and connections) and the
/// count of the socket's own live address handles.
#[derive(Debug)]
pub(crate) struct SocketHandles {
    pd: Arc<ProtectionDomain>,
    live: Arc<AtomicUsize>,
}

/// An address handle of one socket, counted while it lives (in a route, a group, or a send
/// slot that still names it).
#[derive(Debug)]
pub(crate) struct CountedHandle {
    ah: AddressHandle,
    live: Arc<AtomicUsize>,
}

impl SocketHandles {
    pub(crate) fn new(pd: Arc<ProtectionDomain>) -> Self {
        SocketHandles {
            pd,
            live: Arc::default(),
        }
    }

    /// The protection domain the handles are made on.
    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// How many handles made here are alive.
    #[cfg_attr(not(rdma_async_hooks), allow(dead_code))]
    pub(crate) fn live(&self) -> usize {
        self.live.load(Ordering::Relaxed)
    }

    /// A handle from attributes rdma_cm reported (SIDR reply or multicast join).
    pub(crate) fn create(&self, attr: &AhAttr) -> io::Result<CountedHandle> {
        AddressHandle::new(self.pd.clone(), attr).map(|ah| self.counted(ah))
    }

    /// A handle that answers the sender of a received datagram (see
    /// [`AddressHandle::reply_to`]).
    pub(crate) fn reply_to(
        &self,
        wc: &WorkCompletion,
        grh: &[u8; GRH_LEN],
        port_num: u8,
    ) -> io::Result<CountedHandle> {
        AddressHandle::reply_to(self.pd.clone(), wc, grh, port_num).map(|ah| self.counted(ah))
    }

    fn counted(&self, ah: AddressHandle) -> CountedHandle {
        self.live.fetch_add(1, Ordering::Relaxed);
        CountedHandle {
            ah,
            live: self.live.clone(),
        }
    }
}

impl Deref for CountedHandle {
    type Target = AddressHandle;

    fn deref(&self) -> &AddressHandle {
        &self.ah
    }
}

impl Drop for CountedHandle {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::Relaxed);
    }
}
