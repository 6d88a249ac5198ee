//! How an [`RdmaConnection`]'s operations post their work requests: the checks of their
//! buffers and ranges, the post and the wait for the completion (through
//! [`ConnShared::execute`](crate::rdma::completion_task::ConnShared::execute)), and the
//! errors of failed completions.

use std::io;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ops::{Range, RangeBounds};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use super::RdmaConnection;
use crate::error;
use crate::memory::RemoteSlice;
use crate::memory::sealed::Carried;
use crate::memory::span;
use crate::memory::{RegisteredBytes, foreign_region};
use crate::rdma::completion_task::lost_buffer;
use crate::verbs::{
    Held, Opcode, Posted, Segment, WcStatus, WindowBinding, WindowOp, WorkCompletion, WorkQueue,
};
use crate::verbs::{completion_error, wc_error};

/// What an operation was, for its error messages.
#[derive(Debug, Clone, Copy)]
pub(super) enum OpKind {
    Send,
    Recv,
    Write(RemoteSlice),
    /// A batch of this many RDMA writes ([`RdmaConnection::write_batch`]).
    WriteBatch(usize),
    Read(RemoteSlice),
    Atomic(&'static str, RemoteSlice),
    BindWindow,
    InvalidateWindow,
}

impl OpKind {
    /// Refuses memory the device may not write (a read-only file mapping) as the destination of
    /// a receive, an RDMA read or an atomic's result.
    #[inline]
    fn check_destination<B: RegisteredBytes>(self, buf: &B) -> io::Result<()> {
        let writes_local = matches!(self, OpKind::Recv | OpKind::Read(_) | OpKind::Atomic(..));
        if writes_local && !buf.user().0.registered().locally_writable() {
            return Err(error::invalid_input(format!(
                "{}: the region is read-only (a mapped file); it can be the source of sends, \
                 writes and remote reads, not a destination",
                self.describe()
            )));
        }
        Ok(())
    }

    fn describe(self) -> String {
        match self {
            OpKind::Send => "send".to_owned(),
            OpKind::Recv => "receive".to_owned(),
            OpKind::Write(r) => format!("RDMA write to {:#x} (rkey {:#x})", r.addr(), r.rkey()),
            OpKind::WriteBatch(n) => format!("batch of {n} RDMA writes"),
            OpKind::Read(r) => format!("RDMA read of {:#x} (rkey {:#x})", r.addr(), r.rkey()),
            OpKind::Atomic(name, r) => {
                format!("atomic {name} at {:#x} (rkey {:#x})", r.addr(), r.rkey())
            }
            OpKind::BindWindow => "memory window bind".to_owned(),
            OpKind::InvalidateWindow => "memory window invalidation".to_owned(),
        }
    }

    /// The verb for length errors ("an RDMA write of N bytes ...").
    pub(super) fn verb(self) -> &'static str {
        match self {
            OpKind::Write(_) | OpKind::WriteBatch(_) => "write",
            OpKind::Read(_) => "read",
            _ => "operation",
        }
    }

    fn sending(self) -> bool {
        !matches!(self, OpKind::Recv)
    }
}

impl RdmaConnection {
    fn own<B: RegisteredBytes>(&self, buf: &B) -> io::Result<()> {
        let pd = buf.user().0.registered().pd();
        if Arc::ptr_eq(pd, &self.shared.pd) {
            Ok(())
        } else {
            Err(foreign_region(pd, &self.shared.pd))
        }
    }

    /// Runs one send-queue or receive operation over `bufs` and maps its completion.
    pub(super) async fn run<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Option<Opcode>,
        bufs: Vec<(B, Range<usize>)>,
    ) -> (io::Result<WorkCompletion>, Vec<B>) {
        let mut segments = Vec::with_capacity(bufs.len());
        let mut users = Vec::with_capacity(bufs.len());
        let mut bad = None;
        for (i, (buf, range)) in bufs.into_iter().enumerate() {
            if bad.is_none() {
                bad = self.admit(op, &buf).err();
            }
            segments.push(Segment {
                buffer: i,
                offset: range.start,
                len: range.end.saturating_sub(range.start),
            });
            users.push(buf.into_user().0);
        }
        let held = match users.len() {
            0 => Held::Nothing,
            1 => users.pop().map_or(Held::Nothing, Held::One),
            _ => Held::Many(users),
        };
        let back = |held: Held| -> Vec<B> {
            match held {
                Held::Nothing => Vec::new(),
                Held::One(b) => vec![B::from_user(Carried(b))],
                Held::Many(v) | Held::Batch(v) => {
                    v.into_iter().map(|b| B::from_user(Carried(b))).collect()
                }
                // Only window operations hold a window.
                Held::Window(_) => lost_buffer(),
                #[cfg(any(test, rdma_async_fuzzing))]
                Held::Probe(_) => lost_buffer(),
            }
        };
        if let Some(e) = bad {
            return (Err(e), back(held));
        }
        let (result, held) = self.post_on_queue(opcode, held, segments).await;
        (self.check_completion(result, op), back(held))
    }

    /// Whether `buf` may take part in `op` on this connection.
    #[inline]
    pub(super) fn admit<B: RegisteredBytes>(&self, op: OpKind, buf: &B) -> io::Result<()> {
        self.own(buf).and_then(|()| op.check_destination(buf))
    }

    /// Posts `held` over `segments` on the queue `opcode` says (a receive without one) and
    /// waits for the completion.
    fn post_on_queue<'a, S: AsRef<[Segment]> + 'a>(
        &'a self,
        opcode: Option<Opcode>,
        held: Held,
        segments: S,
    ) -> impl Future<Output = (io::Result<WorkCompletion>, Held)> + Unpin + 'a {
        let qp = &self.shared.qp;
        let queue = match opcode {
            Some(_) => WorkQueue::Send,
            None => WorkQueue::Recv,
        };
        self.shared
            .execute(queue, true, held, move |h, defer, waker| match opcode {
                Some(opcode) => qp.post_caller(opcode, h, segments.as_ref(), defer, Some(waker)),
                None => qp.post_recv_caller(h, segments.as_ref()).map(Posted::from),
            })
    }

    /// `result`, or the error of `op`'s failed completion. Inlined: with a second caller
    /// (batches) it went out of line, a call on every write.
    #[inline]
    pub(super) fn check_completion(
        &self,
        result: io::Result<WorkCompletion>,
        op: OpKind,
    ) -> io::Result<WorkCompletion> {
        result.and_then(|wc| {
            if wc.status.is_success() {
                Ok(wc)
            } else {
                Err(self.completion_error(&wc, op))
            }
        })
    }

    fn completion_error(&self, wc: &WorkCompletion, op: OpKind) -> io::Error {
        let what = op.describe();
        if wc.status == WcStatus::FLUSH {
            return self.shared.flush_error(&what, op.sending());
        }
        if wc.status == WcStatus::REMOTE_ACCESS {
            return completion_error(
                io::ErrorKind::PermissionDenied,
                wc,
                format!(
                    "{what} failed: remote access error: the peer's memory key does not allow this \
                     access to these bytes (wrong rkey, outside the registered region, or not \
                     registered for it); the connection is now in the error state"
                ),
            );
        }
        let err = wc_error(wc, self.shared.link.peer_addr(), op.sending());
        completion_error(err.kind(), wc, format!("{what} failed: {err}"))
    }

    /// Posts a bind or invalidation of `binding`'s window, waits for its completion and
    /// returns the binding (it sat in the in-flight table meanwhile, so a dropped future leaves
    /// the window and its region there until the completion).
    pub(in crate::rdma) async fn run_window(
        &self,
        op: WindowOp,
        binding: Box<WindowBinding>,
    ) -> (io::Result<()>, Box<WindowBinding>) {
        let kind = match op {
            WindowOp::Bind { .. } => OpKind::BindWindow,
            WindowOp::Invalidate => OpKind::InvalidateWindow,
        };
        // Window requests are posted at once: the writes polled before go first.
        self.shared.ring();
        let qp = &self.shared.qp;
        let (result, held) = self
            .shared
            .execute(WorkQueue::Send, false, Held::Window(binding), |h, _, _| {
                qp.post_window(op, h).map(Posted::from)
            })
            .await;
        let result = result.and_then(|wc| {
            if wc.status.is_success() {
                Ok(())
            } else {
                Err(self.completion_error(&wc, kind))
            }
        });
        match held {
            Held::Window(binding) => (result, binding),
            // The table gives back exactly what it was given.
            _ => lost_buffer(),
        }
    }

    /// The connection's protection domain, for the windows allocated on it.
    pub(in crate::rdma) fn pd(&self) -> &Arc<crate::verbs::ProtectionDomain> {
        &self.shared.pd
    }

    /// Runs one operation over `range` of one buffer and maps its completion. Not an `async fn`:
    /// every single-buffer operation (each write) goes through it, and the one state machine
    /// it returns ([`OneOperation`]) saves the levels of `async` nesting (their polls, and the
    /// moves of the buffer through each).
    pub(super) fn run_one<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Option<Opcode>,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> OneOperation<'_, B, impl Future<Output = (io::Result<WorkCompletion>, Held)> + Unpin + '_>
    {
        let checked = span(buf.len(), range)
            .map(|(offset, len)| offset..offset + len)
            .and_then(|range| self.admit(op, &buf).map(|()| range));
        let range = match checked {
            Ok(range) => range,
            Err(e) => return OneOperation::Refused(Some((e, buf))),
        };
        // One buffer needs none of `run`'s vectors: no allocation on the per-message path.
        let segment = [Segment {
            buffer: 0,
            offset: range.start,
            len: range.end - range.start,
        }];
        let held = Held::One(buf.into_user().0);
        OneOperation::Running {
            conn: self,
            op,
            posted: self.post_on_queue(opcode, held, segment),
            buf: PhantomData,
        }
    }
}

/// The future of an operation on one buffer ([`RdmaConnection::run_one`]): refused before it
/// was posted, or posted and waiting for its completion (`posted`).
pub(super) enum OneOperation<'a, B, F> {
    Refused(Option<(io::Error, B)>),
    Running {
        conn: &'a RdmaConnection,
        op: OpKind,
        posted: F,
        buf: PhantomData<fn() -> B>,
    },
}

impl<'a, B, F> OneOperation<'a, B, F>
where
    B: RegisteredBytes + 'a,
    F: Future<Output = (io::Result<WorkCompletion>, Held)> + Unpin + 'a,
{
    /// The operation with only whether it succeeded (writes, reads and sends report no more).
    pub(super) fn succeeded(self) -> impl Future<Output = (io::Result<()>, B)> + 'a {
        Succeeded {
            operation: ManuallyDrop::new(self),
            finished: false,
        }
    }
}

/// [`OneOperation::succeeded`]'s future. Once the operation returned its output, nothing is
/// left in it to drop (the buffer went out with the output; `F`, a `PostAndWait`, has given
/// its buffers back and its claim is done), so it is dropped only if it never finished: the
/// out-of-line call to its drop glue, which found nothing to do, was on every write.
pub(super) struct Succeeded<'a, B, F> {
    operation: ManuallyDrop<OneOperation<'a, B, F>>,
    /// The operation returned its output.
    finished: bool,
}

impl<'a, B, F> Future for Succeeded<'a, B, F>
where
    B: RegisteredBytes + 'a,
    F: Future<Output = (io::Result<WorkCompletion>, Held)> + Unpin + 'a,
{
    type Output = (io::Result<()>, B);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let (result, buf) = ready!(Pin::new(&mut *this.operation).poll(cx));
        this.finished = true;
        Poll::Ready((result.map(drop), buf))
    }
}

impl<B, F> Drop for Succeeded<'_, B, F> {
    #[inline]
    fn drop(&mut self) {
        if !self.finished {
            self.drop_unfinished();
        }
    }
}

impl<B, F> Succeeded<'_, B, F> {
    /// An operation dropped before it finished (its buffer, or its claim on the table slot,
    /// still in it) is dropped as usual; an empty one takes its place.
    #[cold]
    #[inline(never)]
    fn drop_unfinished(&mut self) {
        let empty = ManuallyDrop::new(OneOperation::Refused(None));
        drop(ManuallyDrop::into_inner(std::mem::replace(
            &mut self.operation,
            empty,
        )));
    }
}

// Nothing in it is pinned in place: `posted` is `Unpin`, and the refused buffer is only moved
// out.
impl<B, F: Unpin> Unpin for OneOperation<'_, B, F> {}

impl<B, F> Future for OneOperation<'_, B, F>
where
    B: RegisteredBytes,
    F: Future<Output = (io::Result<WorkCompletion>, Held)> + Unpin,
{
    type Output = (io::Result<WorkCompletion>, B);

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            OneOperation::Refused(refused) => {
                let (e, buf) = refused
                    .take()
                    .expect("`OneOperation` polled after it completed");
                Poll::Ready((Err(e), buf))
            }
            OneOperation::Running {
                conn, op, posted, ..
            } => {
                let (result, held) = ready!(Pin::new(posted).poll(cx));
                match held {
                    Held::One(user) => Poll::Ready((
                        conn.check_completion(result, *op),
                        B::from_user(Carried(user)),
                    )),
                    // The table gives back exactly what it was given.
                    _ => lost_buffer(),
                }
            }
        }
    }
}
