//! Setting up an [`RdmaConnection`]: building its queue pair and completion queue once the
//! route names the device, the handshake, and starting its completion task and keepalive.

use std::io;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::ToSocketAddrs;

use super::RdmaConnection;
use crate::cm::handshake::DialOptions;
use crate::cm::link::CmLink;
use crate::cm::{ConnParams, ConnectRequest};
use crate::error;
use crate::rdma::completion_task::{ConnParts, ConnShared, run_completion_task};
use crate::rdma::dialing::{self, HandshakeOptions};
use crate::rdma::options::RdmaOptions;
use crate::reactor::AsyncCq;
use crate::verbs::{
    CallerMemoryQueuePair, CmId, Held, IdDevice, InFlightTable, Opcode, QpCaps, WorkQueue,
};

impl HandshakeOptions for RdmaOptions {
    fn for_handshake(&self) -> io::Result<(&DialOptions, &ConnParams)> {
        self.check()?;
        Ok((&self.dial, &self.params))
    }
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
    let entries = opts.queue.send_depth + opts.queue.recv_depth + srq_depth;
    // Its completion task polls the queue and wakes the operations that wait: a longer spin
    // there would keep a CPU busy without waking them sooner (msg_rate's depth-1 writes: 14.5k
    // -> 8.7k/s). Operations that poll for themselves have a growing window (`reaping`).
    let async_cq = AsyncCq::create_fixed_window(id, entries, opts.queue.busy_poll)?;
    let cq = async_cq.queue();
    let table = Arc::new(InFlightTable::new(entries as usize, false));
    let caps = QpCaps {
        max_send_wr: opts.queue.send_depth,
        max_recv_wr: opts.queue.recv_depth,
        max_inline_data: opts.queue.max_inline,
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
            .execute(
                WorkQueue::Send,
                true,
                Held::Nothing,
                |held, defer, waker| qp.post_caller(probe, held, &[], defer, Some(waker)),
            )
            .await;
        if let Err(e) = result {
            tracing::debug!(parent: shared.link.span(), error = %e, "keepalive stopped");
            return;
        }
    }
}

impl RdmaConnection {
    /// Connects to `addr` with the default options, trying each resolved address in turn like
    /// `TcpStream::connect`.
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
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Self::connect_with(addr, &RdmaOptions::default()).await
    }

    /// As [`Self::connect`], with `options`.
    ///
    /// # Errors
    ///
    /// As [`Self::connect`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`Self::connect`].
    pub async fn connect_with<A: ToSocketAddrs>(
        addr: A,
        options: &RdmaOptions,
    ) -> io::Result<Self> {
        dialing::connect(addr, options, build, Self::assemble).await
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
        dialing::accept(request, options, build, Self::assemble).await
    }

    /// Never fails: the `Result` is what [`dialing`] takes.
    fn assemble(parts: ConnParts, link: CmLink, options: &RdmaOptions) -> io::Result<Self> {
        tracing::debug!(peer = %link.peer_addr(), qp = parts.qp.qp_num(), "RDMA connection established");
        let shared = Arc::new(ConnShared::new(
            link,
            parts,
            options.srq.clone(),
            (options.queue.send_depth, options.queue.recv_depth),
            options.queue.busy_poll,
        ));
        // connect/accept run inside Tokio (the rdma_cm channel is on its reactor).
        let completion_task = tokio::spawn(run_completion_task(shared.clone()));
        if let Some(interval) = options.queue.keepalive {
            tokio::spawn(keepalive(Arc::downgrade(&shared), interval));
        }
        Ok(RdmaConnection {
            shared,
            completion_task: Some(completion_task),
        })
    }
}
