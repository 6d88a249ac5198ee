//! [`SharedReceiveQueue`]: one pool of posted receives that many connections consume.

use std::io;
use std::net::IpAddr;
use std::ops::RangeBounds;
use std::sync::Arc;

use super::completion_task::{Ring, lost_buffer, post_and_wait};
use super::queue_slots::QueueSlots;
use super::received::Received;
use crate::device::DeviceContext;
use crate::memory::sealed::Carried;
use crate::memory::span;
use crate::memory::{LocalRegion, RegisteredBytes, foreign_region};
use crate::verbs::{Held, ProtectionDomain, Segment, SharedRecvQueue};

/// A shared receive queue (`ibv_srq`): receives posted here are consumed by the sends of any
/// connection created with [`super::RdmaOptions::shared_receive_queue`], so a server with many
/// mostly idle connections keeps one pool of receive buffers instead of one per connection.
///
/// It has its own protection domain on the device of the address it was created for; the
/// connections that use it register their memory there too, so regions of one of them work
/// with all (and with the queue). Receives complete through the completion task of whichever
/// connection received the message; [`Received::qp_num`] tells which. Cheap to clone.
///
/// ```no_run
/// use rdma_async::cm::CmListener;
/// use rdma_async::rdma::{RdmaConnection, RdmaOptions, SharedReceiveQueue};
///
/// # async fn demo() -> std::io::Result<()> {
/// let srq = SharedReceiveQueue::new("10.77.0.1".parse().unwrap(), 256)?;
/// let opts = RdmaOptions::new().shared_receive_queue(&srq);
/// let listener = CmListener::bind("10.77.0.1:7471").await?;
/// let a = RdmaConnection::accept(listener.accept_request().await?, &opts).await?;
/// let b = RdmaConnection::accept(listener.accept_request().await?, &opts).await?;
/// let (got, msg) = srq.recv(srq.reg_msgs(4096)?, ..).await;
/// let got = got?;
/// let from_a = got.qp_num() == a.qp_num();
/// # let _ = (msg, b, from_a);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct SharedReceiveQueue {
    pub(super) inner: Arc<SrqInner>,
}

#[derive(Debug)]
pub(super) struct SrqInner {
    pub(super) srq: Arc<SharedRecvQueue>,
    pub(super) slots: QueueSlots,
    pub(super) depth: u32,
    pub(super) pd: Arc<ProtectionDomain>,
}

impl SharedReceiveQueue {
    /// Creates a queue of `depth` receives on the RDMA device that carries `local` (the address
    /// the connections will use), in that device's shared [`DeviceContext`], with up to 4
    /// scatter entries per receive.
    ///
    /// # Errors
    ///
    /// `AddrNotAvailable` when `local` is not an address of this host, `NotFound` when it is
    /// not on an RDMA device; the OS error of `ibv_create_srq` (e.g. a depth beyond the
    /// device's `max_srq_wr`).
    pub fn new(local: IpAddr, depth: u32) -> io::Result<Self> {
        Self::in_context(&DeviceContext::for_local_addr(local)?, depth)
    }

    /// Creates a queue of `depth` receives in `context`; the connections that use it must work
    /// in the same context ([`RdmaOptions::context`](super::RdmaOptions::context)).
    ///
    /// # Errors
    ///
    /// The OS error of `ibv_create_srq` (e.g. a depth beyond the device's `max_srq_wr`).
    pub fn in_context(context: &DeviceContext, depth: u32) -> io::Result<Self> {
        let pd = context.pd().clone();
        let srq = Arc::new(SharedRecvQueue::new(pd.clone(), depth, 4)?);
        Ok(SharedReceiveQueue {
            inner: Arc::new(SrqInner {
                srq,
                slots: QueueSlots::new(depth.max(1) as usize),
                depth: depth.max(1),
                pd,
            }),
        })
    }

    /// The device context of the queue.
    pub fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.inner.pd.clone())
    }

    /// Allocates `len` zeroed bytes for receives (as [`DeviceContext::reg_msgs`]).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_msgs(&self, len: usize) -> io::Result<LocalRegion> {
        self.context().reg_msgs(len)
    }

    /// Registers `bytes`, taking ownership (as [`DeviceContext::register`]).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register(&self, bytes: Vec<u8>) -> io::Result<LocalRegion> {
        self.context().register(bytes)
    }

    /// Posts a receive into `range` of `buf` and waits for a message from any connection on the
    /// queue. At most `depth` receives are posted; more wait for a slot.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a bad range or a region of another device context; `InvalidData`
    /// when the message is longer than the range.
    ///
    /// # Cancel safety
    ///
    /// As [`super::RdmaConnection::recv`]: a dropped receive stays posted; the message that
    /// lands in it is lost (never written to freed memory). Receives still posted when the last
    /// clone and the last connection are dropped are freed after the queue is destroyed.
    pub async fn recv<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> (io::Result<Received>, B) {
        let (offset, len) = match span(buf.len(), range) {
            Ok(s) => s,
            Err(e) => return (Err(e), buf),
        };
        let registered = buf.user().0.registered();
        let pd = registered.pd();
        if !Arc::ptr_eq(pd, &self.inner.pd) {
            return (Err(foreign_region(pd, &self.inner.pd)), buf);
        }
        if !registered.locally_writable() {
            let e = crate::error::invalid_input(
                "receive: the region is read-only (a mapped file) and cannot take a message",
            );
            return (Err(e), buf);
        }
        let segments = [Segment {
            buffer: 0,
            offset,
            len,
        }];
        let srq = &self.inner.srq;
        let (result, held) = post_and_wait(
            srq.table(),
            &self.inner.slots,
            Held::One(buf.into_user().0),
            |h, _| srq.post_recv_caller(h, &segments).map(|t| (t, Ring::Rung)),
            None,
        )
        .await;
        let buf = match held {
            Held::One(b) => B::from_user(Carried(b)),
            // The table gives back exactly what it was given.
            _ => return lost_buffer(),
        };
        let result = result.and_then(|wc| {
            if wc.status.is_success() {
                Ok(Received::from_completion(&wc))
            } else {
                Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    format!(
                        "receive on the shared receive queue failed: {} (status {})",
                        wc.status.describe(),
                        wc.status.0
                    ),
                ))
            }
        });
        (result, buf)
    }
}
