//! One completion channel shared by the completion queues of many connections: one descriptor
//! and one reactor registration per device context and Tokio runtime, however many queues
//! report to it.
//!
//! A task of the runtime (the dispatcher) reads the channel whenever it is readable. Each
//! event names its queue, whose `cq_context` is that queue's [`CqSignal`]: the dispatcher
//! acks the event and hands it to that signal alone, which wakes the few tasks waiting on that
//! queue. The waiting tasks never read the channel themselves; for them, the signal's pending
//! event is what the event in a channel of their own would be ([`RoutedWaiter::poll_event`]).
//! The cost is a dispatch per event: the reactor wakes the dispatcher, which wakes the waiting
//! task.
//!
//! **Runtimes.** A registration belongs to the runtime it was made on, so channels are keyed by
//! the device context and the runtime's [`Id`] (`tokio::runtime::Handle::id`), current when the
//! queue is created. The channel lives as long as the runtime (its dispatcher is a task of it)
//! or the last queue on it, whichever is longer. When that runtime shuts down, its dispatcher
//! is dropped: the channel is closed, every task waiting on one of its queues is woken and
//! every wait on them fails from then on (`ConnectionAborted`, as for a connection with a
//! channel of its own); queues created later on other runtimes use those runtimes' channels,
//! unaffected.

use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::task::{Context, Poll};

use rdma_async_sys as sys;
use tokio::io::unix::AsyncFd;
use tokio::runtime::{Handle, Id};

use super::cq_waiter::ChannelRead;
use super::fd_waiter::{Fanout, FanoutSlot, HasFanout, runtime_gone};
use crate::verbs::{
    ChannelFd, CmDevices, CmId, CompletionChannel, CompletionQueue, CqEventSink, register_readable,
};

/// Events the dispatcher reads before it lets the runtime's other tasks run.
const DISPATCH_BATCH: usize = 256;

/// The shared channels that are open, by device context and runtime.
static CHANNELS: Mutex<Vec<Keyed>> = Mutex::new(Vec::new());

/// One entry of [`CHANNELS`].
struct Keyed {
    context: usize,
    runtime: Id,
    channel: Weak<RoutedChannel>,
}

/// A completion channel read by a dispatcher task that routes each event to its queue.
#[derive(Debug)]
pub(crate) struct RoutedChannel {
    channel: Arc<CompletionChannel>,
    queues: Arc<RoutedQueues>,
}

/// The queues of a shared channel, and whether it still routes their events.
#[derive(Debug, Default)]
struct RoutedQueues {
    /// Set once the dispatcher is gone: no event will be routed any more.
    closed: AtomicBool,
    /// Every queue's signal, to wake when the channel closes.
    signals: Mutex<Signals>,
}

#[derive(Debug, Default)]
struct Signals {
    live: Vec<Weak<CqSignal>>,
    /// Dead entries are dropped when `live` grows to this length.
    compact_at: usize,
}

/// Where one queue's events go: its waiting tasks.
#[derive(Debug)]
pub(crate) struct CqSignal {
    queues: Arc<RoutedQueues>,
    /// An event of the queue was routed and no waiter has taken it yet.
    pending: AtomicBool,
    fanout: Fanout,
}

/// One task's place among the waiters of a routed queue.
#[derive(Debug)]
pub(crate) struct RoutedWaiter {
    slot: FanoutSlot<CqSignal>,
}

impl HasFanout for CqSignal {
    fn fanout(&self) -> &Fanout {
        &self.fanout
    }
}

impl RoutedChannel {
    /// The shared channel of `id`'s device context on the current runtime, made (with its
    /// dispatcher) if there is none.
    ///
    /// # Errors
    ///
    /// `Other` outside a Tokio runtime; the errors of making the channel and registering it.
    fn current(id: &CmId) -> io::Result<Arc<Self>> {
        let ctx = id.verbs()?;
        let runtime = Handle::try_current().map_err(|e| {
            io::Error::other(format!(
                "shared completion channels are made on the current Tokio runtime: {e}"
            ))
        })?;
        let mut channels = CHANNELS.lock().unwrap_or_else(PoisonError::into_inner);
        channels.retain(|k| k.channel.strong_count() > 0);
        let found = channels
            .iter()
            .filter(|k| k.context == ctx.as_ptr().addr() && k.runtime == runtime.id())
            .find_map(|k| k.channel.upgrade())
            .filter(|c| !c.queues.closed.load(Ordering::Acquire));
        if let Some(found) = found {
            return Ok(found);
        }
        let routed = Self::open(ctx, &runtime)?;
        channels.push(Keyed {
            context: ctx.as_ptr().addr(),
            runtime: runtime.id(),
            channel: Arc::downgrade(&routed),
        });
        Ok(routed)
    }

    /// A new channel on `ctx`, registered with `runtime`'s reactor, and its dispatcher.
    fn open(ctx: NonNull<sys::ibv_context>, runtime: &Handle) -> io::Result<Arc<Self>> {
        let devices = Arc::new(CmDevices::new()?);
        let channel = Arc::new(CompletionChannel::on_device(devices, ctx)?);
        let fd = {
            let _entered = runtime.enter();
            register_readable(ChannelFd::new(channel.clone()))?
        };
        let routed = Arc::new(RoutedChannel {
            channel,
            queues: Arc::default(),
        });
        runtime.spawn(dispatch(CloseOnDrop(routed.clone()), fd));
        Ok(routed)
    }
}

impl RoutedQueues {
    fn signals(&self) -> MutexGuard<'_, Signals> {
        // A list of weak references: nothing a panic could leave half-updated.
        self.signals.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A signal for one more queue.
    fn signal(self: &Arc<Self>) -> Arc<CqSignal> {
        let signal = Arc::new(CqSignal {
            queues: self.clone(),
            pending: AtomicBool::new(false),
            fanout: Fanout::default(),
        });
        let mut signals = self.signals();
        if signals.live.len() >= signals.compact_at {
            signals.live.retain(|s| s.strong_count() > 0);
            signals.compact_at = (signals.live.len() * 2).max(64);
        }
        signals.live.push(Arc::downgrade(&signal));
        signal
    }

    /// No event will be routed any more: wakes every waiter of every queue, to fail.
    fn close(&self) {
        self.closed.store(true, Ordering::Release);
        let signals = std::mem::take(&mut self.signals().live);
        for signal in signals.iter().filter_map(Weak::upgrade) {
            signal.fanout.wake_all();
        }
    }
}

/// Closes the channel when the dispatcher ends: when its runtime shuts down (which drops the
/// task), or when reading the channel fails.
struct CloseOnDrop(Arc<RoutedChannel>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        self.0.queues.close();
    }
}

/// The dispatcher: reads every event of the channel and routes it to its queue's signal.
async fn dispatch(routed: CloseOnDrop, fd: AsyncFd<ChannelFd>) {
    let channel = &routed.0.channel;
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(e) => {
                tracing::warn!(error = %e, "shared completion channel: the reactor failed");
                return;
            }
        };
        for _ in 0..DISPATCH_BATCH {
            match guard.try_io(|_| channel.dispatch_event()) {
                Ok(Ok(())) => {}
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "shared completion channel: reading it failed");
                    return;
                }
                // try_io cleared the readiness: wait for the next edge.
                Err(_would_block) => break,
            }
        }
    }
}

impl CqSignal {
    /// A completion queue of `entries` on the shared channel of `id`'s device context and the
    /// current runtime, and its signal.
    ///
    /// # Errors
    ///
    /// As [`RoutedChannel::current`], and those of `ibv_create_cq`.
    pub(crate) fn create_queue(
        id: &CmId,
        entries: u32,
    ) -> io::Result<(Arc<CompletionQueue>, Arc<CqSignal>)> {
        let routed = RoutedChannel::current(id)?;
        let signal = routed.queues.signal();
        let cq = CompletionQueue::routed(routed.channel.clone(), entries, signal.clone())?;
        Ok((Arc::new(cq), signal))
    }

    /// A slot for one more waiting task.
    pub(crate) fn waiter(self: &Arc<Self>) -> RoutedWaiter {
        RoutedWaiter {
            slot: FanoutSlot::take(self),
        }
    }
}

impl CqEventSink for CqSignal {
    fn cq_event(&self) {
        // Set before the waiters are taken (under their lock): a waiter that registers after
        // the wake-up sees it.
        self.pending.store(true, Ordering::Release);
        self.fanout.wake_all();
    }
}

impl RoutedWaiter {
    /// Takes the queue's routed event, or registers `cx`'s waker to be woken when one comes.
    ///
    /// # Errors
    ///
    /// `ConnectionAborted` once the channel's runtime is gone.
    pub(crate) fn poll_event(&self, cx: &mut Context<'_>) -> Poll<io::Result<ChannelRead>> {
        let signal = &*self.slot.owner;
        // This slot first, then the flag: an event routed in between wakes the slot's task.
        self.slot.set(cx.waker());
        if signal.pending.swap(false, Ordering::AcqRel) {
            return Poll::Ready(Ok(ChannelRead::Event));
        }
        if signal.queues.closed.load(Ordering::Acquire) {
            return Poll::Ready(Err(runtime_gone(
                &"the shared completion channel's dispatcher is gone",
            )));
        }
        Poll::Pending
    }

    /// Takes the queue's routed event if one came, without registering a task: a look outside
    /// a wait.
    pub(crate) fn try_event(&self) -> ChannelRead {
        if self.slot.owner.pending.swap(false, Ordering::AcqRel) {
            ChannelRead::Event
        } else {
            ChannelRead::Empty
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wake_count::counting_waker as counter;

    #[test]
    fn an_event_wakes_only_its_own_queues_waiters_and_one_of_them_takes_it() {
        let queues = Arc::new(RoutedQueues::default());
        let (a, b) = (queues.signal(), queues.signal());
        let (a_reader, a_writer, b_reader) = (a.waiter(), a.waiter(), b.waiter());
        let counts: Vec<_> = [&a_reader, &a_writer, &b_reader]
            .iter()
            .map(|waiter| {
                let (count, waker) = counter();
                let polled = waiter.poll_event(&mut Context::from_waker(&waker));
                assert!(polled.is_pending(), "no event yet");
                count
            })
            .collect();
        a.cq_event();
        let woken: Vec<usize> = counts.iter().map(|c| c.get()).collect();
        assert_eq!(woken, [1, 1, 0], "queue a's two waiters, not queue b's");
        let (_, waker) = counter();
        let mut cx = Context::from_waker(&waker);
        assert!(matches!(
            a_writer.poll_event(&mut cx),
            Poll::Ready(Ok(ChannelRead::Event))
        ));
        assert!(
            a_reader.poll_event(&mut cx).is_pending(),
            "one event is taken once"
        );
        assert!(b_reader.poll_event(&mut cx).is_pending());
    }

    #[test]
    fn an_event_routed_before_its_waiter_registers_is_still_taken() {
        let queues = Arc::new(RoutedQueues::default());
        let signal = queues.signal();
        signal.cq_event();
        let (count, waker) = counter();
        let read = signal.waiter().poll_event(&mut Context::from_waker(&waker));
        assert!(matches!(read, Poll::Ready(Ok(ChannelRead::Event))));
        assert_eq!(count.get(), 0);
    }

    #[test]
    fn closing_the_channel_wakes_every_waiter_and_fails_its_wait() {
        let queues = Arc::new(RoutedQueues::default());
        let signals: Vec<_> = (0..3).map(|_| queues.signal()).collect();
        let waiters: Vec<_> = signals.iter().map(CqSignal::waiter).collect();
        let counts: Vec<_> = waiters
            .iter()
            .map(|waiter| {
                let (count, waker) = counter();
                assert!(
                    waiter
                        .poll_event(&mut Context::from_waker(&waker))
                        .is_pending()
                );
                count
            })
            .collect();
        queues.close();
        assert!(counts.iter().all(|c| c.get() == 1), "every waiter is woken");
        let (_, waker) = counter();
        for waiter in &waiters {
            match waiter.poll_event(&mut Context::from_waker(&waker)) {
                Poll::Ready(Err(e)) => assert_eq!(e.kind(), io::ErrorKind::ConnectionAborted),
                other => panic!("a wait on a closed channel returned {other:?}"),
            }
        }
    }
}
