//! How an [`RdmaConnection`]'s operations post their work requests: the checks of their
//! buffers and ranges, the post and the wait for the completion (through
//! [`ConnShared::execute`](crate::rdma::completion_task::ConnShared::execute)), and the
//! errors of failed completions.

use std::io;
use std::ops::{Range, RangeBounds};
use std::sync::Arc;

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
    Read(RemoteSlice),
    Atomic(&'static str, RemoteSlice),
    BindWindow,
    InvalidateWindow,
}

impl OpKind {
    /// Refuses memory the device may not write (a read-only file mapping) as the destination of
    /// a receive, an RDMA read or an atomic's result.
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
            OpKind::Write(_) => "write",
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
                Held::Many(v) => v.into_iter().map(|b| B::from_user(Carried(b))).collect(),
                // Only window operations hold a window.
                Held::Window(_) => lost_buffer(),
                #[cfg(any(test, rdma_async_fuzzing))]
                Held::Probe(_) => lost_buffer(),
            }
        };
        if let Some(e) = bad {
            return (Err(e), back(held));
        }
        let (result, held) = self.post_held(op, opcode, held, &segments).await;
        (result, back(held))
    }

    /// Whether `buf` may take part in `op` on this connection.
    fn admit<B: RegisteredBytes>(&self, op: OpKind, buf: &B) -> io::Result<()> {
        self.own(buf).and_then(|()| op.check_destination(buf))
    }

    /// Posts `held` over `segments` on the queue `opcode` says (a receive without one), waits
    /// for the completion and maps it.
    async fn post_held(
        &self,
        op: OpKind,
        opcode: Option<Opcode>,
        held: Held,
        segments: &[Segment],
    ) -> (io::Result<WorkCompletion>, Held) {
        let qp = &self.shared.qp;
        let (result, held) = match opcode {
            Some(opcode) => {
                self.shared
                    .execute(WorkQueue::Send, held, |h, defer| {
                        qp.post_caller(opcode, h, segments, defer)
                    })
                    .await
            }
            None => {
                self.shared
                    .execute(WorkQueue::Recv, held, |h, _| {
                        qp.post_recv_caller(h, segments).map(Posted::from)
                    })
                    .await
            }
        };
        let result = result.and_then(|wc| {
            if wc.status.is_success() {
                Ok(wc)
            } else {
                Err(self.completion_error(&wc, op))
            }
        });
        (result, held)
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
            .execute(WorkQueue::Send, Held::Window(binding), |h, _| {
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

    pub(super) async fn run_one<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Option<Opcode>,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> (io::Result<WorkCompletion>, B) {
        let range = match span(buf.len(), range) {
            Ok((offset, len)) => offset..offset + len,
            Err(e) => return (Err(e), buf),
        };
        // One buffer needs none of `run`'s vectors: no allocation on the per-message path.
        if let Err(e) = self.admit(op, &buf) {
            return (Err(e), buf);
        }
        let segment = [Segment {
            buffer: 0,
            offset: range.start,
            len: range.end - range.start,
        }];
        let held = Held::One(buf.into_user().0);
        match self.post_held(op, opcode, held, &segment).await {
            (result, Held::One(user)) => (result, B::from_user(Carried(user))),
            // The table gives back exactly what it was given.
            _ => lost_buffer(),
        }
    }
}
