//! `RListener`: accepts rsockets-compatible streams.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::{Arc, PoisonError};
use std::task::{Context, Poll, Waker, ready};

use futures_core::Stream;
use tokio::net::ToSocketAddrs;
use tokio::sync::Mutex;
use tokio::task::{self, JoinSet};
use tracing::Instrument;

use super::admission::{Admission, MAX_HANDSHAKES};
use super::driver::pinned_bytes;
use super::options::RStreamOptions;
use super::rstream::RStream;
use crate::cm::CmListener;
use crate::cm::accept_failure::{AcceptFailure, caused_by_peer, request_failed};
use crate::cm::listener::DEFAULT_BACKLOG;
use crate::cm::peer_warnings::peer_warning;
use crate::cm::reject_reason::refuse;
use crate::verbs::binding_memlock_limit;

/// A handshake's outcome: the stream, or the error and the peer it concerns.
type Handshake = Result<(RStream, SocketAddr), (io::Error, SocketAddr)>;

/// Listens for [`RStream`] connections: a drop-in for `tokio::net::TcpListener`.
///
/// Options set on the listener apply to every accepted stream (as rsockets' accepted sockets
/// inherit the listener's). Handshakes run concurrently in tasks of their own (up to 64 at a
/// time; later requests wait in rdma_cm's backlog), so a slow peer does not hold up the others,
/// and each is bounded by the options' `accept_timeout` (10 s by default), so silent peers
/// cannot hold the slots: a peer that sends a request and never completes the handshake is
/// rejected when it passes. A handshake that fails because of the peer (invalid connection
/// data, no answer in time, a peer that goes away) fails only that connection: `accept` logs it
/// and waits for the next one.
///
/// A handshake pins its stream's rings from the moment it answers the request (rsockets sends
/// the rings' keys in the answer) until the peer completes it, so peers that park requests
/// could pin the locked memory (`RLIMIT_MEMLOCK`) every registration of the process needs. Two
/// bounds keep that from one peer and from all of them together:
///
/// - one address may have in progress all but an eighth of the handshakes the listener can
///   run at once (56 of 64; 14 of the 15 that fit under an 8 MiB limit with 128 KiB rings), so
///   others always find room (see [`RStreamOptions::handshakes_per_source`]);
/// - under a locked-memory limit (not with `CAP_IPC_LOCK`), the rings of handshakes in progress
///   pin at most half of it (read once, when the listener is bound), so established
///   connections and the application's own registrations keep the other half.
///
/// A request past either bound is rejected at once with the reason (the client's connect fails
/// with `ConnectionRefused`, "... N connection handshakes in progress, the most one address may
/// have" or "... would pass their budget"), logged as peers' failures are (a few warnings per
/// window, the rest at `debug`), and `accept` goes on. Several addresses that park requests
/// together can still fill the slots or the budget, and new clients are then refused until
/// `accept_timeout` ends the parked handshakes; what is established, and the other half of the
/// limit, stay untouched. Queue memory is not counted: Soft-RoCE does not pin it; devices that
/// pin queues in user memory need more room than the budget leaves.
#[derive(Debug)]
pub struct RListener {
    accepting: Arc<Accepting>,
    /// The accept [`Self::poll_accept`] drives, kept between its calls.
    polled: std::sync::Mutex<Option<PolledAccept>>,
}

/// What accepting needs, shared with the accepts that outlive a call ([`Incoming`]'s and
/// [`RListener::poll_accept`]'s).
#[derive(Debug)]
struct Accepting {
    cm: Arc<CmListener>,
    options: RStreamOptions,
    /// Handshakes in progress, and finished ones not yet returned by `accept`.
    handshakes: Mutex<Handshakes>,
}

/// An accept started by [`RListener::poll_accept`], and the task that polled it last.
struct PolledAccept {
    accept: AcceptFuture,
    waker: Waker,
}

impl std::fmt::Debug for PolledAccept {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolledAccept").finish_non_exhaustive()
    }
}

/// The handshake tasks, the address each serves, and what they may hold together.
#[derive(Debug)]
struct Handshakes {
    tasks: JoinSet<Handshake>,
    sources: HashMap<task::Id, IpAddr>,
    admission: Admission,
}

impl Handshakes {
    /// Task `id` ended: its slot, its address's share and its rings are free again.
    fn ended(&mut self, id: task::Id) {
        if let Some(source) = self.sources.remove(&id) {
            self.admission.release(source);
        }
    }
}

impl RListener {
    /// Binds to `addr` and listens, with the default stream options.
    ///
    /// # Errors
    ///
    /// As [`CmListener::bind`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind<A: ToSocketAddrs>(addr: A) -> io::Result<Self> {
        Self::bind_with(addr, &RStreamOptions::default()).await
    }

    /// Binds to `addr` and listens; accepted streams use `options`. Their `id_options` apply as
    /// on [`CmListener::bind_with`]: address reuse, IPv6-only and type of service to the listening
    /// id, the ACK timeout to every accepted stream. With a `device` in the options, it listens
    /// on that device only, as with [`ListenerOptions::device`](crate::cm::ListenerOptions::device)
    /// (`addr` may then be a wildcard).
    ///
    /// # Errors
    ///
    /// As [`CmListener::bind_with`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn bind_with<A: ToSocketAddrs>(
        addr: A,
        options: &RStreamOptions,
    ) -> io::Result<Self> {
        let accepting = Accepting {
            cm: Arc::new(
                CmListener::bind_choosing(
                    addr,
                    DEFAULT_BACKLOG,
                    &options.dial.id,
                    options.dial.device.as_ref(),
                )
                .await?,
            ),
            handshakes: Mutex::new(Handshakes {
                tasks: JoinSet::new(),
                sources: HashMap::new(),
                admission: Admission::new(
                    pinned_bytes(options),
                    binding_memlock_limit(),
                    options.handshakes_per_source,
                ),
            }),
            options: options.clone(),
        };
        Ok(RListener {
            accepting: Arc::new(accepting),
            polled: std::sync::Mutex::new(None),
        })
    }

    /// The address the listener is bound to.
    ///
    /// # Errors
    ///
    /// Never fails today; the `Result` mirrors `TcpListener::local_addr`.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.accepting.cm.local_addr()
    }

    /// Waits for the next connection whose handshake has completed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// use rdma_async::stream::RListener;
    /// use tokio::io::{AsyncReadExt, AsyncWriteExt};
    ///
    /// #[tokio::main]
    /// async fn main() -> std::io::Result<()> {
    ///     let listener = RListener::bind("10.77.0.1:7471").await?;
    ///     loop {
    ///         let (mut stream, peer) = listener.accept().await?;
    ///         tokio::spawn(async move {
    ///             // Echo until the peer closes its side.
    ///             let mut buf = vec![0; 4096];
    ///             loop {
    ///                 let n = stream.read(&mut buf).await?;
    ///                 if n == 0 {
    ///                     println!("{peer} closed");
    ///                     return Ok::<_, std::io::Error>(());
    ///                 }
    ///                 stream.write_all(&buf[..n]).await?;
    ///             }
    ///         });
    ///     }
    /// }
    /// ```
    ///
    /// # Errors
    ///
    /// `NetworkDown` when the device went away: the listener is unusable. A connection request
    /// that this host could not set up (out of file descriptors, `EMFILE`; out of memory or
    /// queue pairs) is rejected and its error returned, and the listener stays usable: the next
    /// `accept` takes the next request, as with `TcpListener::accept` after `EMFILE`. Handshakes
    /// that fail because of the peer (invalid rsockets connection data, no answer within
    /// `accept_timeout`, a peer that gives up) are logged and skipped, as a TCP listener never
    /// returns connections that did not complete. ([`Self::into_incoming`], for servers, skips
    /// every failure of a single request and ends only with the listener.)
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: handshakes run in their own tasks, so a connection whose handshake
    /// finishes after the future was dropped is returned by the next `accept`. They end when
    /// the listener is dropped.
    pub async fn accept(&self) -> io::Result<(RStream, SocketAddr)> {
        self.stop_polled_accept();
        self.accepting
            .next_connection()
            .await
            .map_err(AcceptFailure::into_error)
    }

    /// Polls to accept the next connection whose handshake has completed: `Ready` with it (or
    /// an error, as [`Self::accept`]), else `Pending` with the waker of `cx` stored, as
    /// `TcpListener::poll_accept` does.
    ///
    /// The listener keeps the accept this starts between calls, so a caller that stops polling
    /// (a dropped `poll_fn` future) loses no connection: the next `poll_accept` or `accept`
    /// returns it. Only the waker of the most recent call is woken. An `accept` called
    /// meanwhile goes first: the pending `poll_accept` caller is woken, and its next call
    /// waits behind that `accept`.
    ///
    /// # Errors
    ///
    /// As [`Self::accept`].
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(RStream, SocketAddr)>> {
        let mut polled = self.polled.lock().unwrap_or_else(PoisonError::into_inner);
        let current = polled.get_or_insert_with(|| PolledAccept {
            accept: self.accepting.accept_future(),
            waker: cx.waker().clone(),
        });
        current.waker.clone_from(cx.waker());
        let result = ready!(current.accept.as_mut().poll(cx));
        *polled = None;
        Poll::Ready(result.map_err(AcceptFailure::into_error))
    }

    /// Drops the accept [`Self::poll_accept`] started, which may hold the turn to accept
    /// while nobody polls it, and wakes its caller to start another behind the caller of this.
    /// Dropping it loses nothing: an accept takes a connection only when it returns it.
    fn stop_polled_accept(&self) {
        let stopped = self
            .polled
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(PolledAccept { accept, waker }) = stopped {
            drop(accept);
            waker.wake();
        }
    }
}

impl Accepting {
    /// [`Self::next_connection`] as a future that owns what it needs.
    fn accept_future(self: &Arc<Self>) -> AcceptFuture {
        let accepting = self.clone();
        Box::pin(async move { accepting.next_connection().await })
    }

    /// As [`RListener::accept`], telling the listener's own failures from a request's.
    async fn next_connection(&self) -> Result<(RStream, SocketAddr), AcceptFailure> {
        let mut handshakes = self.handshakes.lock().await;
        loop {
            tokio::select! {
                // Finished handshakes first, so that a flood of requests cannot starve them.
                biased;
                Some(done) = handshakes.tasks.join_next_with_id(), if !handshakes.tasks.is_empty() => {
                    handshakes.ended(done.as_ref().map_or_else(|e| e.id(), |(id, _)| *id));
                    match done {
                        Ok((_, Ok(accepted))) => return Ok(accepted),
                        Ok((_, Err((e, peer)))) if caused_by_peer(&e) => {
                            peer_warning!(parent: self.cm.span(), %peer, error = %e, "rsocket handshake failed");
                        }
                        Ok((_, Err((e, peer)))) => {
                            tracing::warn!(parent: self.cm.span(), %peer, error = %e, "could not set up a connection: rejected");
                            return Err(AcceptFailure::Request(request_failed(peer, e)));
                        }
                        Err(e) => tracing::error!(parent: self.cm.span(), error = %e, "rsocket handshake task failed"),
                    }
                },
                request = self.cm.request(), if handshakes.tasks.len() < MAX_HANDSHAKES => {
                    let request = request?;
                    let source = request.peer().ip();
                    if let Err(refusal) = handshakes.admission.admit(source) {
                        let _span = self.cm.span().enter();
                        refuse(request, &refusal.into_error());
                        continue;
                    }
                    let options = self.options.clone();
                    let handshake = async move {
                        let peer = request.peer();
                        match RStream::accept(request, &options).await {
                            Ok(stream) => Ok((stream, peer)),
                            Err(e) => Err((e, peer)),
                        }
                    };
                    let task = handshakes.tasks.spawn(handshake.instrument(self.cm.span().clone()));
                    handshakes.sources.insert(task.id(), source);
                }
            }
        }
    }
}

impl RListener {
    /// The accepted connections as a [`Stream`] (for `serve_with_incoming`-style APIs, such as
    /// tonic's). A failure of one request (one this host could not set up, such as `EMFILE`, or
    /// one the peer broke) is logged and skipped, so it never stops a server; an error of the
    /// listener itself (its device went away) is yielded once, then the stream ends, so a
    /// consumer that retries errors does not spin on a dead listener.
    pub fn into_incoming(self) -> Incoming {
        let accepting = self.accepting;
        Incoming::new(Box::new(move || accepting.accept_future()))
    }
}

type AcceptFuture =
    Pin<Box<dyn Future<Output = Result<(RStream, SocketAddr), AcceptFailure>> + Send>>;

/// The connections of an [`RListener`], from [`RListener::into_incoming`].
pub struct Incoming {
    /// Starts the next accept (on the listener it owns).
    next: Box<dyn FnMut() -> AcceptFuture + Send>,
    accept: Option<AcceptFuture>,
    done: bool,
}

impl Incoming {
    fn new(next: Box<dyn FnMut() -> AcceptFuture + Send>) -> Self {
        Incoming {
            next,
            accept: None,
            done: false,
        }
    }
}

impl std::fmt::Debug for Incoming {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Incoming")
            .field("accepting", &self.accept.is_some())
            .field("done", &self.done)
            .finish()
    }
}

impl Stream for Incoming {
    type Item = io::Result<RStream>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        if self.done {
            return Poll::Ready(None);
        }
        let this = &mut *self;
        let accept = this.accept.get_or_insert_with(&mut this.next);
        let result = ready!(accept.as_mut().poll(cx));
        this.accept = None;
        match result {
            Ok((stream, _peer)) => Poll::Ready(Some(Ok(stream))),
            // Logged where it happened. Yield before the next accept, so that a burst of
            // failing requests cannot keep the task busy.
            Err(AcceptFailure::Request(_)) => {
                cx.waker().wake_by_ref();
                Poll::Pending
            }
            Err(AcceptFailure::Listener(e)) => {
                this.done = true;
                Poll::Ready(Some(Err(e)))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listener_error_is_yielded_once_then_the_stream_ends() {
        let mut accepts = 0;
        let mut incoming = Incoming::new(Box::new(move || {
            accepts += 1;
            assert_eq!(accepts, 1, "accept was retried after the listener failed");
            Box::pin(async {
                Err(AcceptFailure::Listener(io::Error::new(
                    io::ErrorKind::NetworkDown,
                    "device removed",
                )))
            })
        }));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        let mut incoming = Pin::new(&mut incoming);
        match incoming.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Err(e))) => assert_eq!(e.kind(), io::ErrorKind::NetworkDown),
            other => panic!("expected the listener's error, got {other:?}"),
        }
        for _ in 0..3 {
            assert!(matches!(
                incoming.as_mut().poll_next(&mut cx),
                Poll::Ready(None)
            ));
        }
    }

    #[test]
    fn request_failures_are_skipped_and_the_stream_goes_on() {
        let mut accepts = 0;
        let mut incoming = Incoming::new(Box::new(move || {
            accepts += 1;
            let n = accepts;
            Box::pin(async move {
                Err(if n <= 3 {
                    AcceptFailure::Request(io::Error::from_raw_os_error(libc::EMFILE))
                } else {
                    AcceptFailure::Listener(io::Error::new(io::ErrorKind::NetworkDown, "gone"))
                })
            })
        }));
        let woken = std::sync::Arc::new(WakeCount::default());
        let waker = std::task::Waker::from(woken.clone());
        let mut cx = Context::from_waker(&waker);
        let mut incoming = Pin::new(&mut incoming);
        // Each failed request: nothing yielded, the task asked to be polled again.
        for round in 1..=3 {
            assert!(incoming.as_mut().poll_next(&mut cx).is_pending());
            assert_eq!(woken.0.load(std::sync::atomic::Ordering::Relaxed), round);
        }
        // Only the listener's own failure reaches the consumer, and ends the stream.
        match incoming.as_mut().poll_next(&mut cx) {
            Poll::Ready(Some(Err(e))) => assert_eq!(e.kind(), io::ErrorKind::NetworkDown),
            other => panic!("expected the listener's error, got {other:?}"),
        }
        assert!(matches!(
            incoming.as_mut().poll_next(&mut cx),
            Poll::Ready(None)
        ));
    }

    #[derive(Default)]
    struct WakeCount(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for WakeCount {
        fn wake(self: std::sync::Arc<Self>) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    }
}
