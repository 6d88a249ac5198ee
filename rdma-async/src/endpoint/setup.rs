//! Setting up an [`Endpoint`]: its queue pair, completion queues, registered buffers and
//! first receives, built once the route names the device, and the handshake.

use std::io;
use std::sync::Arc;

use tokio::net::ToSocketAddrs;

use super::caller_memory::post_receive;
use super::sending::signal_interval;
use super::{Endpoint, EndpointOptions};
use crate::cm::SlotQueue;
use crate::cm::handshake::DialOptions;
use crate::cm::link::CmLink;
use crate::cm::{ConnParams, ConnectRequest};
use crate::rdma::dialing::{self, HandshakeOptions};
use crate::reactor::AsyncCq;
use crate::verbs::{Access, CmId, OwnedBufferQueuePair, QpCaps, RegisteredBuffer};

impl HandshakeOptions for EndpointOptions {
    fn for_handshake(&self) -> io::Result<(&DialOptions, &ConnParams)> {
        self.check()?;
        Ok((&self.dial, &self.params))
    }
}

/// What `build` creates between route resolution and connect/accept.
struct EndpointParts {
    qp: OwnedBufferQueuePair,
    send_cq: AsyncCq,
    recv_cq: AsyncCq,
    /// The attach id of each receive slot posted in a pool buffer.
    recv_attached: Vec<Option<u64>>,
}

fn build(id: &Arc<CmId>, opts: &EndpointOptions) -> io::Result<EndpointParts> {
    let max = opts.max_message_size;
    let pd = opts.dial.context_for(id)?.pd().clone();
    let async_send_cq = AsyncCq::create(id, opts.queue.send_depth, opts.queue.busy_poll)?;
    let async_recv_cq = AsyncCq::create(id, opts.queue.recv_depth, opts.queue.busy_poll)?;
    let (send_cq, recv_cq) = (async_send_cq.queue(), async_recv_cq.queue());
    let send_buf = RegisteredBuffer::new(
        pd.clone(),
        max * opts.queue.send_depth as usize,
        Access::default(),
    )?;
    let recv_buf = RegisteredBuffer::new(
        pd.clone(),
        max * opts.queue.recv_depth as usize,
        Access::default(),
    )?;
    let caps = QpCaps {
        max_send_wr: opts.queue.send_depth,
        max_recv_wr: opts.queue.recv_depth,
        max_inline_data: opts.queue.max_inline,
        max_send_sge: 1,
    };
    let qp = OwnedBufferQueuePair::new(
        id.clone(),
        pd,
        send_cq.clone(),
        recv_cq.clone(),
        caps,
        vec![send_buf, recv_buf],
        Vec::new(),
    )?;
    // Receives are posted before the handshake, so the peer may send as soon as it is connected.
    let recv_attached = (0..opts.queue.recv_depth as usize)
        .map(|slot| post_receive(&qp, opts.recv_pool.as_ref(), slot, max))
        .collect::<io::Result<_>>()?;
    Ok(EndpointParts {
        qp,
        send_cq: async_send_cq,
        recv_cq: async_recv_cq,
        recv_attached,
    })
}

impl Endpoint {
    /// Connects to `addr` with the default options, trying each resolved address in turn and
    /// returning the last error, like `TcpStream::connect`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::endpoint::Endpoint;
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let endpoint = Endpoint::connect("10.77.0.1:7471").await?;
    ///     // Each send arrives as one message.
    ///     endpoint.send(b"ping").await?;
    ///     let reply = endpoint.recv().await?;
    ///     println!("{} bytes back", reply.len());
    ///     endpoint.disconnect().await?;
    ///     Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// `NotFound` when this machine has no RDMA device; `ConnectionRefused` when nothing listens
    /// or the peer rejects (the [`crate::cm::CmError`] inside carries the peer's private data);
    /// `TimedOut` when the peer does not answer or `connect_timeout` passes; the resolver's error
    /// when a name does not resolve; `InvalidInput` for bad options.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases the half-built connection (queue pair, memory,
    /// rdma_cm id); the peer sees the attempt fail.
    pub async fn connect<A: ToSocketAddrs>(addr: A) -> io::Result<Endpoint> {
        Self::connect_with(addr, &EndpointOptions::default()).await
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
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        dialing::connect(addr, options, build, Self::assemble).await
    }

    /// Accepts `request` and returns once the connection is established.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` when the peer gives up during the handshake; `TimedOut` (the request
    /// rejected) when the peer does not complete it within the options' `accept_timeout`;
    /// `InvalidInput` for bad options or oversized private data; verbs errors creating the
    /// queue pair.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future releases everything created for the connection.
    pub async fn accept(
        request: ConnectRequest,
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        dialing::accept(request, options, build, Self::assemble).await
    }

    fn assemble(
        parts: EndpointParts,
        link: CmLink,
        options: &EndpointOptions,
    ) -> io::Result<Endpoint> {
        let max_inline = parts.qp.max_inline_data() as usize;
        let recv = SlotQueue::new(
            parts.recv_cq,
            options.queue.recv_depth as usize,
            Some(&link),
        )?;
        recv.try_lock()?.held = parts.recv_attached;
        Ok(Endpoint {
            send: SlotQueue::new(
                parts.send_cq,
                options.queue.send_depth as usize,
                Some(&link),
            )?,
            recv,
            recv_pool: options.recv_pool.clone(),
            abandoned: Default::default(),
            link,
            qp: parts.qp,
            max_message_size: options.max_message_size,
            max_inline,
            keepalive: options.queue.keepalive,
            signal_interval: signal_interval(options.queue.send_depth),
            #[cfg(rdma_async_hooks)]
            send_completions: Default::default(),
        })
    }
}
