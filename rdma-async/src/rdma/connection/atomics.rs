//! The atomic operations of an [`RdmaConnection`] on an 8-byte word of the peer's memory:
//! compare-and-swap and fetch-and-add.

use std::io;

use super::RdmaConnection;
use super::posting::OpKind;
use crate::error;
use crate::memory::RegisteredBytes;
use crate::memory::RemoteSlice;
use crate::verbs::Opcode;

impl RdmaConnection {
    /// Atomically compares the peer's 8-byte word at `remote` with `compare` and, if equal,
    /// replaces it with `swap` (`IBV_WR_ATOMIC_CMP_AND_SWP`). Returns the word's previous value,
    /// which the device also leaves in `buf` at `offset` (8 bytes, native byte order). The
    /// word is in the peer's native byte order; the peer must register it with
    /// [`RemoteAccess::ATOMIC`](crate::rdma::RemoteAccess::ATOMIC).
    ///
    /// # Errors
    ///
    /// `Unsupported` when the device has no atomics; `InvalidInput` when `remote` is not an
    /// 8-byte-aligned word of at least 8 bytes, or `buf` has no 8-byte-aligned room at `offset`;
    /// otherwise as [`Self::write`].
    ///
    /// # Cancel safety
    ///
    /// See the type's documentation: the atomic still happens.
    pub async fn compare_and_swap<B: RegisteredBytes>(
        &self,
        buf: B,
        offset: usize,
        remote: RemoteSlice,
        compare: u64,
        swap: u64,
    ) -> (io::Result<u64>, B) {
        let opcode = Opcode::CompareSwap {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            compare,
            swap,
        };
        self.atomic("compare-and-swap", opcode, buf, offset, remote)
            .await
    }

    /// Atomically adds `add` to the peer's 8-byte word at `remote`
    /// (`IBV_WR_ATOMIC_FETCH_AND_ADD`); returns the previous value, as
    /// [`Self::compare_and_swap`].
    ///
    /// # Errors
    ///
    /// As [`Self::compare_and_swap`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::compare_and_swap`].
    pub async fn fetch_and_add<B: RegisteredBytes>(
        &self,
        buf: B,
        offset: usize,
        remote: RemoteSlice,
        add: u64,
    ) -> (io::Result<u64>, B) {
        let opcode = Opcode::FetchAdd {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            add,
        };
        self.atomic("fetch-and-add", opcode, buf, offset, remote)
            .await
    }

    async fn atomic<B: RegisteredBytes>(
        &self,
        name: &'static str,
        opcode: Opcode,
        buf: B,
        offset: usize,
        remote: RemoteSlice,
    ) -> (io::Result<u64>, B) {
        if !self.supports_atomics() {
            let e = io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "atomic {name}: RDMA device {} has no atomic operations (atomic_cap is \
                     IBV_ATOMIC_NONE)",
                    self.device_name()
                ),
            );
            return (Err(e), buf);
        }
        if !remote.addr().is_multiple_of(8) || remote.len() < 8 {
            let e = error::invalid_input(format!(
                "atomic {name}: the remote word at {:#x} ({} bytes) must be 8 bytes, 8-byte aligned",
                remote.addr(),
                remote.len()
            ));
            return (Err(e), buf);
        }
        let reg = buf.user().0.registered();
        if offset.checked_add(8).is_none_or(|end| end > reg.len())
            || !reg.addr(offset).is_multiple_of(8)
        {
            let e = error::invalid_input(format!(
                "atomic {name}: the result needs 8 bytes, 8-byte aligned, at offset {offset} of \
                 the {}-byte region",
                reg.len()
            ));
            return (Err(e), buf);
        }
        let (r, buf) = self
            .run_one(
                OpKind::Atomic(name, remote),
                Some(opcode),
                buf,
                offset..offset + 8,
            )
            .await;
        let r = r.and_then(|_| {
            let mut word = [0; 8];
            buf.user().0.registered().read_at(offset, &mut word)?;
            Ok(u64::from_ne_bytes(word))
        });
        (r, buf)
    }
}
