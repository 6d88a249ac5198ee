//! How memory is registered: the access rights a registration grants ([`Access`]) and whether
//! the device may write the memory or faults its pages in itself ([`RegFlags`]).

use rdma_async_sys as sys;

/// Access rights of a registration.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Access {
    pub(crate) remote_read: bool,
    pub(crate) remote_write: bool,
    /// `IBV_ACCESS_REMOTE_ATOMIC`: the peer may compare-and-swap and fetch-and-add 8-byte words.
    pub(crate) remote_atomic: bool,
    /// `IBV_ACCESS_MW_BIND`: memory windows may be bound over the memory (which grants the peer
    /// access only through them).
    pub(crate) mw_bind: bool,
}

/// How a registration is made, besides its remote access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RegFlags {
    /// `IBV_ACCESS_LOCAL_WRITE`: the device may write the memory (receives, RDMA read results).
    pub(crate) local_write: bool,
    /// `IBV_ACCESS_ON_DEMAND`: pages are faulted in by the device rather than pinned.
    pub(crate) on_demand: bool,
}

impl RegFlags {
    pub(crate) const PINNED: RegFlags = RegFlags {
        local_write: true,
        on_demand: false,
    };
}

impl Access {
    /// Whether a peer can reach the memory at all.
    pub(crate) fn is_remote(self) -> bool {
        self.remote_read || self.remote_write || self.remote_atomic
    }

    /// The remote-access flags alone (`ibv_access_flags`), as a memory window bind takes them.
    pub(crate) fn remote_flags(self) -> u32 {
        let no_local = RegFlags {
            local_write: false,
            on_demand: false,
        };
        Access {
            mw_bind: false,
            ..self
        }
        .flags(no_local) as u32
    }

    pub(super) fn flags(self, reg: RegFlags) -> i32 {
        let mut flags = 0;
        if reg.local_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        }
        if reg.on_demand {
            flags |= sys::ibv_access_flags::IBV_ACCESS_ON_DEMAND;
        }
        if self.remote_read {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ;
        }
        if self.remote_write {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE;
        }
        if self.remote_atomic {
            flags |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC;
        }
        if self.mw_bind {
            flags |= sys::ibv_access_flags::IBV_ACCESS_MW_BIND;
        }
        flags as i32
    }
}
