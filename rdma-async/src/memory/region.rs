//! Registered memory owned by the caller: [`LocalRegion`] (no peer can reach it) and
//! [`SharedRegion`] (a peer may read, write or apply atomics to it through its remote key).

use std::io;
use std::ops::{BitOr, Deref, DerefMut};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::remote::RemoteRegion;
use crate::error;
use crate::verbs::{Access, ProtectionDomain, RegisteredBuffer, UserBuffer};

/// Registered memory an operation can take: [`LocalRegion`] or [`SharedRegion`].
///
/// Operations take the region by value and hand it back with their result, so the memory cannot
/// be touched while the device owns it. The trait is sealed.
pub trait RegisteredBytes: sealed::SealedRegion + Send + 'static {
    /// The registered length in bytes.
    fn len(&self) -> usize;

    /// Whether the region is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

pub(crate) mod sealed {
    use crate::verbs::UserBuffer;

    /// The verbs layer's caller-owned buffer, in a type outside code can hold but not open.
    #[derive(Debug)]
    pub struct Carried(pub(crate) UserBuffer);

    /// Conversions to and from the verbs layer's caller-owned buffer.
    pub trait SealedRegion {
        fn into_user(self) -> Carried;
        fn from_user(buffer: Carried) -> Self;
        fn user(&self) -> &Carried;
    }
}

/// What a peer may do with a [`SharedRegion`]; combine with `|`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAccess(Access);

impl RemoteAccess {
    /// The peer may RDMA-read the memory (`IBV_ACCESS_REMOTE_READ`; `rdma_reg_read`).
    pub const READ: RemoteAccess = RemoteAccess(Access {
        remote_read: true,
        remote_write: false,
        remote_atomic: false,
        mw_bind: false,
    });
    /// The peer may RDMA-write the memory (`IBV_ACCESS_REMOTE_WRITE`; `rdma_reg_write`).
    pub const WRITE: RemoteAccess = RemoteAccess(Access {
        remote_read: false,
        remote_write: true,
        remote_atomic: false,
        mw_bind: false,
    });
    /// The peer may compare-and-swap and fetch-and-add 8-byte words (`IBV_ACCESS_REMOTE_ATOMIC`).
    pub const ATOMIC: RemoteAccess = RemoteAccess(Access {
        remote_read: false,
        remote_write: false,
        remote_atomic: true,
        mw_bind: false,
    });

    pub(crate) fn access(self) -> Access {
        self.0
    }

    /// Whether reads are allowed.
    pub fn can_read(self) -> bool {
        self.0.remote_read
    }

    /// Whether writes are allowed.
    pub fn can_write(self) -> bool {
        self.0.remote_write
    }

    /// Whether atomics are allowed.
    pub fn can_atomic(self) -> bool {
        self.0.remote_atomic
    }
}

impl BitOr for RemoteAccess {
    type Output = RemoteAccess;

    fn bitor(self, other: RemoteAccess) -> RemoteAccess {
        RemoteAccess(Access {
            remote_read: self.0.remote_read || other.0.remote_read,
            remote_write: self.0.remote_write || other.0.remote_write,
            remote_atomic: self.0.remote_atomic || other.0.remote_atomic,
            mw_bind: false,
        })
    }
}

/// Largest region a peer can reach: its remote descriptor ([`RemoteRegion`], in rping's encoding)
/// carries a 32-bit length. Local regions may be larger; each work request covers at most
/// `u32::MAX` bytes of one.
const MAX_SHARED_REGION: usize = u32::MAX as usize;

/// Checks the length of a region registered with `access`.
pub(crate) fn check_len(len: usize, access: Access) -> io::Result<()> {
    if len == 0 {
        return Err(error::invalid_input(
            "a registered region must have at least 1 byte",
        ));
    }
    if access.is_remote() && len > MAX_SHARED_REGION {
        return Err(error::invalid_input(format!(
            "a region a peer can reach must have at most {MAX_SHARED_REGION} bytes (its remote \
             descriptor carries a 32-bit length), not {len}; register a larger region without \
             remote access, or several regions"
        )));
    }
    if len > isize::MAX as usize {
        return Err(error::invalid_input(format!(
            "a region of {len} bytes is larger than an allocation can be"
        )));
    }
    Ok(())
}

pub(crate) fn allocate(
    pd: &Arc<ProtectionDomain>,
    len: usize,
    access: Access,
) -> io::Result<UserBuffer> {
    check_len(len, access)?;
    let buffer = RegisteredBuffer::new(pd.clone(), len, access)?;
    Ok(UserBuffer::new(buffer))
}

pub(crate) fn adopt(
    pd: &Arc<ProtectionDomain>,
    vec: Vec<u8>,
    access: Access,
) -> io::Result<UserBuffer> {
    check_len(vec.len(), access)?;
    Ok(UserBuffer::new(RegisteredBuffer::from_vec(
        pd.clone(),
        vec,
        access,
    )?))
}

/// The error for a region of protection domain `region` used where `target` is needed.
pub(crate) fn foreign_region(region: &ProtectionDomain, target: &ProtectionDomain) -> io::Error {
    if region.context() == target.context() {
        error::invalid_input(format!(
            "the region is registered in another device context (protection domain) of RDMA \
             device {} than this one's; register it through the same DeviceContext",
            target.device_name()
        ))
    } else {
        error::invalid_input(format!(
            "the region is registered on RDMA device {}, but this is on {}",
            region.device_name(),
            target.device_name()
        ))
    }
}

/// `BytesMut` → `Vec<u8>` without a copy when the `BytesMut` is the only owner of its memory.
pub(crate) fn bytes_mut_to_vec(bytes: BytesMut) -> Vec<u8> {
    Vec::from(bytes)
}

/// Registered memory no peer can reach (`rdma_reg_msgs`): the buffers of sends and receives, the
/// local side of RDMA reads and writes, the 8-byte result of an atomic.
///
/// While you hold it no work request uses it (operations take it by value), so it derefs to
/// `[u8]`. Dropping it deregisters and frees the memory. Allocated regions are page-aligned and
/// zeroed.
#[derive(Debug)]
pub struct LocalRegion {
    buffer: sealed::Carried,
}

impl LocalRegion {
    pub(crate) fn new(buffer: UserBuffer) -> Self {
        LocalRegion {
            buffer: sealed::Carried(buffer),
        }
    }

    /// Deregisters the memory and returns it (the vector it was registered from, or a copy of an
    /// allocated region).
    pub fn into_vec(self) -> Vec<u8> {
        self.buffer.0.into_vec()
    }

    /// Deregisters the memory and returns it as `BytesMut`.
    pub fn into_bytes_mut(self) -> BytesMut {
        BytesMut::from(Bytes::from(self.into_vec()))
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // A LocalRegion is registered without remote access, so the view always exists.
        self.buffer.0.as_slice().unwrap_or_default()
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        self.buffer.0.as_mut_slice().unwrap_or_default()
    }
}

impl Deref for LocalRegion {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        self.as_slice()
    }
}

impl DerefMut for LocalRegion {
    fn deref_mut(&mut self) -> &mut [u8] {
        self.as_mut_slice()
    }
}

impl sealed::SealedRegion for LocalRegion {
    fn into_user(self) -> sealed::Carried {
        self.buffer
    }

    fn from_user(buffer: sealed::Carried) -> Self {
        LocalRegion { buffer }
    }

    fn user(&self) -> &sealed::Carried {
        &self.buffer
    }
}

impl RegisteredBytes for LocalRegion {
    fn len(&self) -> usize {
        self.buffer.0.registered().len()
    }
}

/// Registered memory a peer may access through its remote key (`rdma_reg_read`,
/// `rdma_reg_write`): send [`Self::remote`] to the peer.
///
/// A peer may write it at any moment (with [`RemoteAccess::WRITE`] or
/// [`RemoteAccess::ATOMIC`]), so there is no `&[u8]` into it: bytes move in and out by copying
/// ([`Self::read_at`], [`Self::write_at`], [`Self::to_vec`]). Coordinate with the peer (a message
/// after its write) to copy out a consistent state. Dropping it deregisters the memory first: from
/// then on the peer's accesses fail with a remote access error.
#[derive(Debug)]
pub struct SharedRegion {
    buffer: sealed::Carried,
}

impl SharedRegion {
    pub(crate) fn new(buffer: UserBuffer) -> Self {
        SharedRegion {
            buffer: sealed::Carried(buffer),
        }
    }

    /// The descriptor to send to the peer: address, length and remote key of the whole region.
    pub fn remote(&self) -> RemoteRegion {
        let reg = self.buffer.0.registered();
        RemoteRegion::registered(reg.addr(0), reg.len() as u32, reg.rkey())
    }

    /// What the peer may do with the region.
    pub fn access(&self) -> RemoteAccess {
        RemoteAccess(self.buffer.0.registered().access())
    }

    /// Copies `dst.len()` bytes at `offset` out of the region.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is outside the region.
    pub fn read_at(&self, offset: usize, dst: &mut [u8]) -> io::Result<()> {
        self.buffer.0.registered().read_at(offset, dst)
    }

    /// Copies `src` into the region at `offset`.
    ///
    /// It takes `&mut self`: two threads copying into the same bytes at once would be a data
    /// race. Readers ([`Self::read_at`]) may share the region; a writer has it to itself.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range is outside the region.
    pub fn write_at(&mut self, offset: usize, src: &[u8]) -> io::Result<()> {
        self.buffer.0.registered().write_at(offset, src)
    }

    /// A copy of the whole region.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = vec![0; self.buffer.0.registered().len()];
        // The range is the whole region, so the copy cannot fail.
        let _ = self.read_at(0, &mut out);
        out
    }

    /// Deregisters the memory (the peer loses access) and returns it.
    pub fn into_vec(self) -> Vec<u8> {
        self.buffer.0.into_vec()
    }
}

impl sealed::SealedRegion for SharedRegion {
    fn into_user(self) -> sealed::Carried {
        self.buffer
    }

    fn from_user(buffer: sealed::Carried) -> Self {
        SharedRegion { buffer }
    }

    fn user(&self) -> &sealed::Carried {
        &self.buffer
    }
}

impl RegisteredBytes for SharedRegion {
    fn len(&self) -> usize {
        self.buffer.0.registered().len()
    }
}
