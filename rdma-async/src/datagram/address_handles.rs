//! [`SocketHandles`]: where a datagram socket makes its address handles, and how many of them
//! are alive. They are the socket's device resources that peers make it create (one per route
//! and group), so the count is what the peer tables' bounds are checked against.

use std::io;
use std::ops::Deref;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::route_slot::ReplyPath;
use crate::verbs::{AddressHandle, AhAttr, ProtectionDomain};

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
    /// [`AddressHandle::reply_to`]), made on a blocking thread: on RoCE the kernel can resolve
    /// the sender's neighbour during the call, which must not stall a runtime thread. If this
    /// future is dropped first, the handle made meanwhile is destroyed uncounted with the
    /// blocking task's output.
    pub(crate) async fn reply_to(
        &self,
        path: ReplyPath,
        port_num: u8,
    ) -> io::Result<CountedHandle> {
        let pd = self.pd.clone();
        let made = tokio::task::spawn_blocking(move || {
            AddressHandle::reply_to(pd, &path.wc, &path.grh, port_num)
        })
        .await
        .map_err(|e| io::Error::other(format!("making an address handle did not finish: {e}")))??;
        Ok(self.counted(made))
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
