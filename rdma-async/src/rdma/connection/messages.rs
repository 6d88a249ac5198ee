//! The two-sided operations of an [`RdmaConnection`]: sends (with immediate, vectored) and
//! receives.

use std::io;
use std::ops::{Range, RangeBounds};

use super::RdmaConnection;
use super::posting::OpKind;
use crate::memory::{LocalRegion, RegisteredBytes};
use crate::rdma::received::Received;
use crate::verbs::{Opcode, WorkCompletion};

impl RdmaConnection {
    /// Sends the bytes `range` of `buf` as one message (`IBV_WR_SEND`), consuming one receive
    /// the peer posted. Returns once the peer acknowledged it.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a range outside the region or a region of another device context;
    /// `BrokenPipe` once the connection is closed; `TimedOut` when the peer never posted a
    /// receive or is unreachable (after the retry counts of [`crate::cm::ConnParams`]).
    ///
    /// # Cancel safety
    ///
    /// See the type's documentation: the buffer is released only after the completion.
    pub fn send<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        self.run_one(OpKind::Send, Some(Opcode::Send { imm: None }), buf, range)
            .succeeded()
    }

    /// As [`Self::send`], with 32 bits of immediate data the peer's receive reports.
    ///
    /// # Errors
    ///
    /// As [`Self::send`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::send`].
    pub fn send_with_imm<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        imm: u32,
    ) -> impl Future<Output = (io::Result<()>, B)> {
        let op = Some(Opcode::Send { imm: Some(imm) });
        self.run_one(OpKind::Send, op, buf, range).succeeded()
    }

    /// Gathers the given ranges of several regions into one message.
    ///
    /// # Errors
    ///
    /// As [`Self::send`]; `InvalidInput` for more segments than `max_send_sge`.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::send`].
    pub async fn send_vectored<B: RegisteredBytes>(
        &self,
        bufs: Vec<(B, Range<usize>)>,
    ) -> (io::Result<()>, Vec<B>) {
        let (r, b) = self
            .run(OpKind::Send, Some(Opcode::Send { imm: None }), bufs)
            .await;
        (r.map(drop), b)
    }

    /// Posts a receive into `range` of `buf` and waits for the peer's next send (or RDMA write
    /// with immediate) to consume it. Receives are consumed in the order they were posted.
    ///
    /// # Errors
    ///
    /// `InvalidData` when the message is longer than the range (the connection then fails);
    /// `ConnectionReset` once the peer disconnected; `InvalidInput` for a bad range.
    ///
    /// # Cancel safety
    ///
    /// Dropping the future leaves the receive posted: the next message may land in it and is
    /// then lost (freed with the buffer, never written to freed memory).
    pub async fn recv<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> (io::Result<Received>, B) {
        let (r, b) = self.run_one(OpKind::Recv, None, buf, range).await;
        (r.map(received), b)
    }

    /// Scatters the next message over the given ranges of several regions, in order.
    ///
    /// # Errors
    ///
    /// As [`Self::recv`]; `InvalidInput` for more segments than `max_recv_sge`.
    ///
    /// # Cancel safety
    ///
    /// As [`Self::recv`].
    pub async fn recv_vectored<B: RegisteredBytes>(
        &self,
        bufs: Vec<(B, Range<usize>)>,
    ) -> (io::Result<Received>, Vec<B>) {
        let (r, b) = self.run(OpKind::Recv, None, bufs).await;
        (r.map(received), b)
    }

    /// Posts a receive without memory and waits for it to be consumed: for RDMA writes with
    /// immediate, which deliver only the immediate (a send that carries bytes fails it with
    /// `InvalidData`).
    ///
    /// # Errors
    ///
    /// As [`Self::recv`].
    ///
    /// # Cancel safety
    ///
    /// As [`Self::recv`]: a write's immediate that lands in a dropped receive is lost.
    pub async fn recv_imm(&self) -> io::Result<Received> {
        let (r, _) = self
            .run::<LocalRegion>(OpKind::Recv, None, Vec::new())
            .await;
        r.map(received)
    }
}

fn received(wc: WorkCompletion) -> Received {
    Received::from_completion(&wc)
}
