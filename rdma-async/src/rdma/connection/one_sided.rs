//! The one-sided operations of an [`RdmaConnection`]: RDMA writes (with immediate, vectored)
//! and reads of the peer's memory.

use std::io;
use std::ops::{Range, RangeBounds};

use super::RdmaConnection;
use super::posting::{OneOperation, OpKind};
use crate::error;
use crate::memory::RegisteredBytes;
use crate::memory::RemoteSlice;
use crate::memory::span;
use crate::verbs::Opcode;

impl RdmaConnection {
    pub(super) fn check_remote(len: usize, remote: RemoteSlice, what: &str) -> io::Result<()> {
        if len > remote.len() as usize {
            return Err(error::invalid_input(format!(
                "an RDMA {what} of {len} bytes does not fit the {}-byte remote slice",
                remote.len()
            )));
        }
        Ok(())
    }

    /// Writes `range` of `buf` into the peer's memory at `remote` (`IBV_WR_RDMA_WRITE`); the
    /// range must not be longer than `remote`. The peer is not notified (see
    /// [`Self::write_with_imm`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let conn = RdmaConnection::connect("10.77.0.1:7471").await?;
    ///     // The peer sends a region it registered with `reg_write`, encoded by `to_bytes`.
    ///     let (got, msg) = conn.recv(conn.reg_msgs(RemoteRegion::ENCODED_LEN)?, ..).await;
    ///     let remote = RemoteRegion::from_bytes(&msg[..got?.len()])?;
    ///     let mut buf = conn.reg_msgs(4096)?;
    ///     buf.fill(7);
    ///     // The buffer moves into the operation and comes back with its result.
    ///     let (res, _buf) = conn.write(buf, .., remote.slice(0, 4096)?).await;
    ///     res?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the range does not fit `remote` or the region; `PermissionDenied`
    /// when the peer's device refuses the key or the bounds (the connection is then in the error
    /// state and later operations fail too); `BrokenPipe` once closed.
    ///
    /// # Cancel safety
    ///
    /// See the type's documentation: the write still happens; the buffer is released after it.
    pub fn write<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        self.write_inner(buf, range, remote, None)
    }

    /// As [`Self::write`], and consumes one of the peer's receives, which reports `imm` and the
    /// length (`IBV_WR_RDMA_WRITE_WITH_IMM`).
    ///
    /// # Errors
    ///
    /// As [`Self::write`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::write`].
    pub fn write_with_imm<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
        imm: u32,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        self.write_inner(buf, range, remote, Some(imm))
    }

    /// Not `async fn`s, down to the post (`one_sided`, `run_one`): each level of `async`
    /// nesting cost its polls and the moves of the buffer through its state on every write.
    fn write_inner<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
        imm: Option<u32>,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        let opcode = Opcode::Write {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            imm,
        };
        self.one_sided(OpKind::Write(remote), opcode, buf, range, remote)
    }

    /// An RDMA read or write of `range` of `buf`, checked against `remote` first.
    fn one_sided<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Opcode,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        let checked = span(buf.len(), range)
            .and_then(|(o, l)| Self::check_remote(l, remote, op.verb()).map(|()| o..o + l));
        let operation = match checked {
            Ok(range) => self.run_one(op, Some(opcode), buf, range),
            Err(e) => OneOperation::Refused(Some((e, buf))),
        };
        operation.succeeded()
    }

    /// The vectored form of [`Self::one_sided`].
    async fn one_sided_vectored<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Opcode,
        bufs: Vec<(B, Range<usize>)>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, Vec<B>) {
        let total: usize = bufs.iter().map(|(_, r)| r.len()).sum();
        if let Err(e) = Self::check_remote(total, remote, op.verb()) {
            return (Err(e), bufs.into_iter().map(|(b, _)| b).collect());
        }
        let (r, b) = self.run(op, Some(opcode), bufs).await;
        (r.map(drop), b)
    }

    /// Gathers the given ranges of several regions into the peer's memory at `remote`.
    ///
    /// # Errors
    ///
    /// As [`Self::write`]; `InvalidInput` for more segments than `max_send_sge`.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::write`].
    pub async fn write_vectored<B: RegisteredBytes>(
        &self,
        bufs: Vec<(B, Range<usize>)>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, Vec<B>) {
        let opcode = Opcode::Write {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
            imm: None,
        };
        self.one_sided_vectored(OpKind::Write(remote), opcode, bufs, remote)
            .await
    }

    /// Reads `range.len()` bytes of the peer's memory at `remote` into `range` of `buf`
    /// (`IBV_WR_RDMA_READ`); the range must not be longer than `remote`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let conn = RdmaConnection::connect("10.77.0.1:7471").await?;
    ///     // The peer sends a region it registered with `reg_read`, encoded by `to_bytes`.
    ///     let (got, msg) = conn.recv(conn.reg_msgs(RemoteRegion::ENCODED_LEN)?, ..).await;
    ///     let remote = RemoteRegion::from_bytes(&msg[..got?.len()])?;
    ///     let buf = conn.reg_msgs(remote.len() as usize)?;
    ///     // The buffer moves into the operation and comes back, filled, with its result.
    ///     let (res, buf) = conn.read(buf, .., remote.whole()).await;
    ///     res?;
    ///     println!("first byte: {}", buf[0]);
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Self::write`].
    ///
    /// # Cancel safety
    ///
    /// See the type's documentation: the buffer is released after the read landed in it.
    pub fn read<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        let opcode = Opcode::Read {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        };
        self.one_sided(OpKind::Read(remote), opcode, buf, range, remote)
    }

    /// Reads the peer's memory at `remote` and scatters it over the given ranges.
    ///
    /// # Errors
    ///
    /// As [`Self::read`]; `InvalidInput` for more segments than `max_send_sge`.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::read`].
    pub async fn read_vectored<B: RegisteredBytes>(
        &self,
        bufs: Vec<(B, Range<usize>)>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, Vec<B>) {
        let opcode = Opcode::Read {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        };
        self.one_sided_vectored(OpKind::Read(remote), opcode, bufs, remote)
            .await
    }
}
