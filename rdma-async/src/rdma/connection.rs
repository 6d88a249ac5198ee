//! [`RdmaConnection`]: a reliable connected queue pair with send/receive, RDMA read/write and
//! atomics on caller-owned registered memory.

use std::io;
use std::net::SocketAddr;
use std::ops::{Range, RangeBounds};
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::ToSocketAddrs;

use super::completion_task::{ConnParts, ConnShared, lost_buffer, run_completion_task};
use super::options::RdmaOptions;
use super::received::Received;
use crate::cm::ConnectRequest;
use crate::cm::handshake;
use crate::cm::link::CmLink;
use crate::device::DeviceContext;
use crate::error::{self, completion_error, wc_error};
use crate::memory::sealed::Carried;
use crate::memory::{LocalRegion, RegisteredBytes, RemoteAccess, SharedRegion, foreign_region};
use crate::memory::{RemoteSlice, span};
use crate::reactor::AsyncCq;
use crate::verbs::{
    CallerMemoryQueuePair, CmId, Held, IdDevice, InFlightTable, Opcode, Posted, QpCaps, Segment,
    WcStatus, WindowBinding, WindowOp, WorkCompletion, WorkQueue,
};

/// A connected RDMA queue pair (reliable connected, `RDMA_PS_TCP`) for verbs-level operations on
/// registered memory: sends and receives (with immediate data), one-sided RDMA reads and writes
/// (with immediate), atomic compare-and-swap and fetch-and-add, and their vectored forms.
///
/// Memory comes from the connection ([`Self::reg_msgs`], [`Self::reg_read`],
/// [`Self::reg_write`], [`Self::register`]) and is registered with its protection domain. Every
/// operation takes its buffer **by value** and returns it with the result, like `tokio-uring`:
/// while the device owns the memory, nothing else can reach it.
///
/// Up to `send_depth` send-queue operations (sends, writes, reads, atomics) and `recv_depth`
/// receives may be in flight at once, from any number of tasks (the methods take `&self`); one
/// more waits for a slot. A completion wakes exactly the operation it belongs to.
///
/// ```no_run
/// use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};
///
/// # async fn demo() -> std::io::Result<()> {
/// let conn = RdmaConnection::connect("10.77.0.1:7471", &RdmaOptions::new()).await?;
/// // The peer advertised a region in a message: receive it.
/// let (got, msg) = conn.recv(conn.reg_msgs(64)?, ..).await;
/// let remote = RemoteRegion::from_bytes(&msg[..got?.len()])?;
/// // Write 4 KiB into it, then read it back.
/// let mut buf = conn.reg_msgs(4096)?;
/// buf.fill(7);
/// let (res, buf) = conn.write(buf, .., remote.slice(0, 4096)?).await;
/// res?;
/// let (res, buf) = conn.read(buf, ..4096, remote.whole()).await;
/// res?;
/// assert!(buf.iter().all(|&b| b == 7));
/// # Ok(()) }
/// ```
///
/// # Cancel safety
///
/// Every operation is cancel safe in the memory sense: dropping its future before the
/// completion leaves the buffer in the connection's table of outstanding work requests, which
/// frees it (deregisters, then deallocates) only when the completion has been polled. The
/// operation itself still happens (a dropped send is still sent, a dropped write still lands);
/// only its result and the buffer are lost to the caller. A dropped **receive** stays posted: the
/// next message the peer sends may land in it and is then dropped with the buffer — it is never
/// written to freed memory, but it is lost to the application.
///
/// An operation's `Ok` means its completion arrived: for a send or an RDMA write, the peer's
/// device acknowledged the data (it is in the peer's memory); for a read or an atomic, the
/// result is in your region. An operation whose future was dropped, or that was still in
/// flight when the connection was dropped, promises nothing.
///
/// Dropping the connection disconnects, moves the queue pair to the error state so every
/// outstanding work request completes as flushed, and frees the buffers once those completions
/// have been polled (by the connection's task, which lingers for that; at most 10 s, after which
/// the queue pair is destroyed before its buffers are freed, which is equally safe).
///
/// The completion task runs on the Tokio runtime the connection was created on. If that task
/// cannot go on (polling the completion queue fails, or the runtime is shut down while the
/// connection is still in use), the connection ends: its queue pair is destroyed, every pending
/// operation ends with the cause and gets its buffers back, and every later one is refused with
/// it.
#[derive(Debug)]
pub struct RdmaConnection {
    shared: Arc<ConnShared>,
    /// The completion task; it ends after a close has drained the queue pair.
    completion_task: Option<tokio::task::JoinHandle<()>>,
}

fn build(id: &Arc<CmId>, opts: &RdmaOptions) -> io::Result<ConnParts> {
    let device = IdDevice::of(id)?;
    let (pd, srq_depth) = match &opts.srq {
        Some(srq) => {
            let pd = srq.inner.pd.clone();
            if !pd.is_device_of(id)? {
                return Err(error::invalid_input(format!(
                    "the shared receive queue is on RDMA device {}, but the connection goes \
                     through {}",
                    pd.device_name(),
                    device.name
                )));
            }
            if opts
                .dial
                .context
                .as_ref()
                .is_some_and(|c| !Arc::ptr_eq(c.pd(), &pd))
            {
                return Err(error::invalid_input(
                    "the shared receive queue belongs to another device context than the one \
                     the options name",
                ));
            }
            (pd, srq.inner.depth)
        }
        None => (opts.dial.context_for(id)?.pd().clone(), 0),
    };
    // The completion queue has room for this connection's work requests and, with a shared
    // receive queue, for every receive of that queue (any of them may complete here).
    let entries = opts.send_depth + opts.recv_depth + srq_depth;
    // Its completion task polls the queue and wakes the operations that wait: a longer spin
    // there would keep a CPU busy without waking them sooner (msg_rate's depth-1 writes: 14.5k
    // -> 8.7k/s). Operations that poll for themselves have a growing window (`reaping`).
    let async_cq = AsyncCq::create_fixed_window(id, entries, opts.busy_poll)?;
    let cq = async_cq.queue();
    let table = Arc::new(InFlightTable::new(entries as usize, false));
    let caps = QpCaps {
        max_send_wr: opts.send_depth,
        max_recv_wr: opts.recv_depth,
        max_inline_data: opts.max_inline,
        max_send_sge: opts.max_send_sge,
    };
    let qp = CallerMemoryQueuePair::new(
        id.clone(),
        pd.clone(),
        cq.clone(),
        caps,
        opts.max_recv_sge,
        table.clone(),
        opts.srq.as_ref().map(|srq| srq.inner.srq.clone()),
    )?;
    Ok(ConnParts {
        qp,
        cq: async_cq,
        table,
        pd,
        device,
    })
}

/// What an operation was, for its error messages.
#[derive(Debug, Clone, Copy)]
enum OpKind {
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
    fn verb(self) -> &'static str {
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

/// Posts a keepalive (a 0-byte RDMA write to address 0 with rkey 0, as rsockets does) every
/// `interval` while the connection lives; a dead peer fails it, which fails the connection and
/// flushes every pending operation with that cause. Holds the connection only while a probe is
/// in flight.
async fn keepalive(shared: std::sync::Weak<ConnShared>, interval: Duration) {
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        ticks.tick().await;
        let Some(shared) = shared.upgrade() else {
            return;
        };
        let qp = &shared.qp;
        let probe = Opcode::Write {
            remote_addr: 0,
            rkey: 0,
            imm: None,
        };
        let (result, _) = shared
            .execute(WorkQueue::Send, Held::Nothing, |held, defer| {
                qp.post_caller(probe, held, &[], defer)
            })
            .await;
        if let Err(e) = result {
            tracing::debug!(parent: shared.link.span(), error = %e, "keepalive stopped");
            return;
        }
    }
}

impl RdmaConnection {
    /// Connects to `addr`, trying each resolved address in turn like `TcpStream::connect`.
    ///
    /// # Errors
    ///
    /// `NotFound` without an RDMA device; `ConnectionRefused` when nothing listens or the peer
    /// rejects (with its private data in a [`crate::cm::CmError`]); `TimedOut` when the peer
    /// does not answer; `InvalidInput` for bad options; `OutOfMemory` when creating the queues
    /// hits a limit of the device (the message names it).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the half-built connection.
    pub async fn connect<A: ToSocketAddrs>(addr: A, options: &RdmaOptions) -> io::Result<Self> {
        options.check()?;
        handshake::connect(
            addr,
            &options.dial,
            &options.params,
            |id| Ok((build(id, options)?, None)),
            |parts, link| Ok(Self::assemble(parts, link, options)),
        )
        .await
    }

    /// Accepts `request`; returns once the connection is established.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` when the peer gives up during the handshake; `TimedOut` (the request
    /// rejected) when the peer does not complete it within the options' `accept_timeout`;
    /// `InvalidInput` for bad options or oversized private data; verbs errors creating the
    /// queue pair (`OutOfMemory` naming the limit when the device is out of them; the request is
    /// then rejected with the reason, which the client's error shows).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything created for the connection.
    pub async fn accept(request: ConnectRequest, options: &RdmaOptions) -> io::Result<Self> {
        options.check()?;
        handshake::accept(
            request,
            &options.dial,
            &options.params,
            |id| Ok((build(id, options)?, None)),
            |parts, link| Ok(Self::assemble(parts, link, options)),
        )
        .await
    }

    fn assemble(parts: ConnParts, link: CmLink, options: &RdmaOptions) -> Self {
        tracing::debug!(peer = %link.peer_addr(), qp = parts.qp.qp_num(), "RDMA connection established");
        let shared = Arc::new(ConnShared::new(
            link,
            parts,
            options.srq.clone(),
            (options.send_depth, options.recv_depth),
            options.busy_poll,
        ));
        // connect/accept run inside Tokio (the rdma_cm channel is on its reactor).
        let completion_task = tokio::spawn(run_completion_task(shared.clone()));
        if let Some(interval) = options.keepalive {
            tokio::spawn(keepalive(Arc::downgrade(&shared), interval));
        }
        RdmaConnection {
            shared,
            completion_task: Some(completion_task),
        }
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.shared.link.peer_addr()
    }

    /// The local address.
    pub fn local_addr(&self) -> SocketAddr {
        self.shared.link.local_addr()
    }

    /// The private data the peer sent in the handshake (zero-padded on IB/RoCE).
    pub fn peer_private_data(&self) -> &[u8] {
        self.shared.link.peer_private_data()
    }

    /// The local queue pair number.
    pub fn qp_num(&self) -> u32 {
        self.shared.qp.qp_num()
    }

    /// Sends and writes of up to this many bytes go inline: [`RdmaOptions::max_inline`],
    /// capped by what the device granted.
    pub fn max_inline(&self) -> u32 {
        self.shared.qp.inline_limit()
    }

    /// How many sends and writes of this connection went out inline.
    pub fn inline_sends(&self) -> u64 {
        self.shared.qp.inline_posts()
    }

    /// How many `ibv_post_send` calls (doorbells) the connection's send-queue operations took.
    /// An operation alone on the send queue rings its own. Operations posted while others are
    /// outstanding leave their requests to be posted together: the first of them lets the
    /// tasks of the same scheduler pass add theirs, then posts all of them with one call (and
    /// the connection's completion task posts what waits before it polls). On Soft-RoCE each
    /// call is a system call; on a NIC, an MMIO write.
    pub fn post_send_calls(&self) -> u64 {
        self.shared.qp.send_posts()
    }

    /// Test hook: the ACK timeout exponent of the queue pair (`ibv_query_qp`), to check that an
    /// id option reached it.
    ///
    /// # Errors
    ///
    /// The error of `ibv_query_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __ack_timeout(&self) -> io::Result<u8> {
        self.shared.link.qp_ack_timeout()
    }

    /// Test hook: the RNR timer of the queue pair (`ibv_query_qp`), to check that
    /// `ConnParams::min_rnr_timer` reached it.
    ///
    /// # Errors
    ///
    /// The error of `ibv_query_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __min_rnr_timer(&self) -> io::Result<u8> {
        self.shared.link.qp_min_rnr_timer()
    }

    /// Test hook: the completion task's next wait fails as if `ibv_poll_cq` had failed, which
    /// ends the connection: every pending operation ends with that cause, as does every later
    /// one. The task waits only when woken, so the next completion (or disconnect) triggers it.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __fail_next_poll(&self) {
        self.shared.cq.fail_next_poll();
    }

    /// Test hook: the next `ibv_post_send` of requests that several operations left to share a
    /// doorbell fails (`ENOMEM`, as a provider refusing the chain would), and none of them is
    /// posted.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __fail_next_chained_post(&self) {
        self.shared.qp.fail_next_ring();
    }

    /// Test hook: this end goes silent without telling the peer (its queue pair moves to the
    /// error state, no rdma_cm disconnect is sent), so the peer sees a host that vanished.
    ///
    /// # Errors
    ///
    /// The error of `ibv_modify_qp`.
    #[cfg(feature = "test-hooks")]
    #[doc(hidden)]
    pub fn __vanish(&self) -> io::Result<()> {
        self.shared.qp.set_error()
    }

    /// The name of the RDMA device the connection runs on (picked by the route to the peer or
    /// the bound address).
    pub fn device_name(&self) -> &str {
        &self.shared.device.name
    }

    /// The device port the connection runs on.
    pub fn port_num(&self) -> u8 {
        self.shared.device.port_num
    }

    /// The attributes of the connection's device and of the port it uses (the only entry of
    /// `ports`), as [`crate::device::Device::attributes`] reads them.
    pub fn device_attributes(&self) -> crate::device::DeviceAttributes {
        let dev = &self.shared.device;
        let mut attrs = crate::device::DeviceAttributes::from_sys(&dev.attr, &[]);
        attrs.ports.push(crate::device::PortAttributes::from_sys(
            dev.port_num,
            &dev.port,
        ));
        attrs
    }

    /// Whether the device supports atomic operations (`atomic_cap` other than
    /// `IBV_ATOMIC_NONE`).
    pub fn supports_atomics(&self) -> bool {
        self.shared.device.attr.atomic_cap != rdma_async_sys::ibv_atomic_cap::IBV_ATOMIC_NONE
    }

    // ---- memory -------------------------------------------------------------------------

    /// The device context the connection works in: regions registered through it (or through
    /// any connection of it) can be used here.
    pub fn context(&self) -> DeviceContext {
        DeviceContext::from_pd(self.shared.pd.clone())
    }

    /// Allocates `len` zeroed, page-aligned bytes for sends, receives and the local side of
    /// RDMA operations, with no remote access (`rdma_reg_msgs`), in the connection's
    /// [context](Self::context).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_msgs(&self, len: usize) -> io::Result<LocalRegion> {
        self.context().reg_msgs(len)
    }

    /// Allocates `len` bytes the peer may RDMA-read (`rdma_reg_read`).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_read(&self, len: usize) -> io::Result<SharedRegion> {
        self.context().reg_read(len)
    }

    /// Allocates `len` bytes the peer may RDMA-write (`rdma_reg_write`).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_write(&self, len: usize) -> io::Result<SharedRegion> {
        self.context().reg_write(len)
    }

    /// Allocates `len` bytes with the given remote access.
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn reg_shared(&self, len: usize, access: RemoteAccess) -> io::Result<SharedRegion> {
        self.context().reg_shared(len, access)
    }

    /// Registers `bytes` (its length, not its spare capacity), taking ownership until
    /// [`LocalRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register(&self, bytes: Vec<u8>) -> io::Result<LocalRegion> {
        self.context().register(bytes)
    }

    /// Registers `bytes` for remote access, taking ownership until [`SharedRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register_shared(
        &self,
        bytes: Vec<u8>,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        self.context().register_shared(bytes, access)
    }

    /// Registers the bytes of a `BytesMut` (without a copy when it is the only owner of its
    /// memory).
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::reg_msgs`].
    pub fn register_bytes_mut(&self, bytes: BytesMut) -> io::Result<LocalRegion> {
        self.context().register_bytes_mut(bytes)
    }

    // ---- operations ---------------------------------------------------------------------

    fn own<B: RegisteredBytes>(&self, buf: &B) -> io::Result<()> {
        let pd = buf.user().0.registered().pd();
        if Arc::ptr_eq(pd, &self.shared.pd) {
            Ok(())
        } else {
            Err(foreign_region(pd, &self.shared.pd))
        }
    }

    /// Runs one send-queue or receive operation over `bufs` and maps its completion.
    async fn run<B: RegisteredBytes>(
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
        let err = wc_error(wc, self.peer_addr(), op.sending());
        completion_error(err.kind(), wc, format!("{what} failed: {err}"))
    }

    /// Posts a bind or invalidation of `binding`'s window, waits for its completion and
    /// returns the binding (it sat in the in-flight table meanwhile, so a dropped future leaves
    /// the window and its region there until the completion).
    pub(super) async fn run_window(
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
    pub(super) fn pd(&self) -> &Arc<crate::verbs::ProtectionDomain> {
        &self.shared.pd
    }

    async fn run_one<B: RegisteredBytes>(
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
    pub async fn send<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
    ) -> (io::Result<()>, B) {
        let (r, b) = self
            .run_one(OpKind::Send, Some(Opcode::Send { imm: None }), buf, range)
            .await;
        (r.map(drop), b)
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
    pub async fn send_with_imm<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        imm: u32,
    ) -> (io::Result<()>, B) {
        let op = Some(Opcode::Send { imm: Some(imm) });
        let (r, b) = self.run_one(OpKind::Send, op, buf, range).await;
        (r.map(drop), b)
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

    fn check_remote(len: usize, remote: RemoteSlice, what: &str) -> io::Result<()> {
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
    ///     let conn = RdmaConnection::connect("10.77.0.1:7471", &RdmaOptions::new()).await?;
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
    pub async fn write<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, B) {
        self.write_inner(buf, range, remote, None).await
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
    pub async fn write_with_imm<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
        imm: u32,
    ) -> (io::Result<()>, B) {
        self.write_inner(buf, range, remote, Some(imm)).await
    }

    /// Not an `async fn`: returning `one_sided`'s future saves a layer of state machine (the
    /// moves into it, and a dispatch at every poll) on each write.
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
    async fn one_sided<B: RegisteredBytes>(
        &self,
        op: OpKind,
        opcode: Opcode,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, B) {
        let checked = span(buf.len(), range)
            .and_then(|(o, l)| Self::check_remote(l, remote, op.verb()).map(|()| o..o + l));
        let range = match checked {
            Ok(r) => r,
            Err(e) => return (Err(e), buf),
        };
        let (r, b) = self.run_one(op, Some(opcode), buf, range).await;
        (r.map(drop), b)
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
    ///     let conn = RdmaConnection::connect("10.77.0.1:7471", &RdmaOptions::new()).await?;
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
    pub async fn read<B: RegisteredBytes>(
        &self,
        buf: B,
        range: impl RangeBounds<usize>,
        remote: RemoteSlice,
    ) -> (io::Result<()>, B) {
        let opcode = Opcode::Read {
            remote_addr: remote.addr(),
            rkey: remote.rkey(),
        };
        self.one_sided(OpKind::Read(remote), opcode, buf, range, remote)
            .await
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

    /// Atomically compares the peer's 8-byte word at `remote` with `compare` and, if equal,
    /// replaces it with `swap` (`IBV_WR_ATOMIC_CMP_AND_SWP`). Returns the word's previous value,
    /// which the device also leaves in `buf` at `offset` (8 bytes, native byte order). The
    /// word is in the peer's native byte order; the peer must register it with
    /// [`RemoteAccess::ATOMIC`].
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

    /// Disconnects: outstanding operations complete as flushed (`BrokenPipe`/`ConnectionReset`)
    /// and the peer's operations fail. Memory stays registered until dropped.
    ///
    /// # Errors
    ///
    /// The OS error of `rdma_disconnect`.
    pub fn disconnect(&self) -> io::Result<()> {
        self.shared.link.disconnect()
    }

    /// Disconnects, waits until every outstanding operation completed or was flushed, and frees
    /// the queue pair and the memory of those operations. (Dropping the connection does the same
    /// in the background.)
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the rest of the close happens in the background.
    pub async fn close(mut self) {
        let _ = self.shared.link.disconnect();
        self.shared.begin_close();
        if let Some(completion_task) = self.completion_task.take() {
            // The task only ends; a panic in it would be a bug reported by the runtime.
            let _ = completion_task.await;
        }
    }

    /// Waits until the connection is closed by either side.
    ///
    /// # Errors
    ///
    /// The OS error of reading the event channel.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn closed(&self) -> io::Result<()> {
        self.shared.link.closed().await
    }
}

fn received(wc: WorkCompletion) -> Received {
    Received::from_completion(&wc)
}

impl Drop for RdmaConnection {
    fn drop(&mut self) {
        let _ = self.shared.link.disconnect();
        self.shared.begin_close();
    }
}
