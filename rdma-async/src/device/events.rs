//! Device asynchronous events (`ibv_get_async_event`) on the Tokio reactor: port up and down,
//! GID table changes, fatal queue pair errors and the like.
//!
//! One reader per device per process, started lazily (by [`events()`] or by the first connection
//! made on a runtime) as a task on the current Tokio runtime: it reads the event descriptor of
//! librdmacm's context of the device (the one every id, queue pair and completion queue of the
//! crate uses), so it sees the events of every connection of the process. Each event is logged
//! with `tracing` (target `rdma_async::device::events`, fields `device`, `event`, `port`, `qp`),
//! acknowledged at once, counted ([`event_counts`]) and broadcast to the subscribers of
//! [`events()`]. A queue pair event that means the queue pair is broken (`IBV_EVENT_QP_FATAL`,
//! `IBV_EVENT_QP_REQ_ERR`, `IBV_EVENT_QP_ACCESS_ERR`) ends the connection that owns the queue
//! pair: it is disconnected, and its operations fail with `ConnectionAborted` naming the event.
//!
//! When the runtime the reader runs on shuts down, the reader ends with it; the next
//! subscription or connection on a runtime starts it again there (events that arrived meanwhile
//! wait in the kernel and are read then).

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rdma_async_sys::ibv_event_type as t;
use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast;

use super::Device;
use super::event::{DeviceEvent, DeviceEventKind};
use super::ports::PortState;
use crate::verbs::{AsyncEventFd, RawAsyncEvent, event_type_str, register_readable};

/// How many events a slow subscriber may fall behind before it misses some.
const CHANNEL_CAPACITY: usize = 256;

/// A subscription to every device's asynchronous events, from [`events()`].
#[derive(Debug)]
pub struct DeviceEvents {
    rx: broadcast::Receiver<DeviceEvent>,
}

impl DeviceEvents {
    /// The next event of any device.
    ///
    /// # Errors
    ///
    /// Never today (the broadcast is process-wide and never closed). A subscriber that fell
    /// more than 256 events behind skips the oldest ones (logged with a warning).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: an event is taken only when returned.
    pub async fn recv(&mut self) -> io::Result<DeviceEvent> {
        loop {
            match self.rx.recv().await {
                Ok(event) => return Ok(event),
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::warn!(
                        target: "rdma_async::device::events",
                        missed,
                        "a device event subscriber fell behind: events skipped"
                    );
                }
                Err(broadcast::error::RecvError::Closed) => {
                    return Err(io::Error::other("the device event broadcast closed"));
                }
            }
        }
    }

    /// The next event without waiting, if one is there.
    pub fn try_recv(&mut self) -> Option<DeviceEvent> {
        loop {
            match self.rx.try_recv() {
                Ok(event) => return Some(event),
                Err(broadcast::error::TryRecvError::Lagged(_)) => continue,
                Err(_) => return None,
            }
        }
    }
}

/// Subscribes to the asynchronous events of every RDMA device of the process, starting the
/// readers on the current Tokio runtime if they do not run (see the module docs). Devices
/// added since the readers started are watched from this call on.
///
/// # Errors
///
/// `NotFound` when there is no RDMA device; `Other` outside a Tokio runtime; the OS error of
/// making an event descriptor non-blocking or registering it with the reactor.
pub fn events() -> io::Result<DeviceEvents> {
    let watcher = watcher();
    // Subscribe first: nothing read after the readers start is missed.
    let rx = watcher.tx.subscribe();
    watcher.start(true)?;
    Ok(DeviceEvents { rx })
}

/// How many events of each kind each device reported since the process started reading them,
/// by device name and kind.
pub fn event_counts() -> BTreeMap<(String, DeviceEventKind), u64> {
    lock(&watcher().counts).clone()
}

/// The state of each port as its last port event left it, by device name and port number:
/// `Active` after `IBV_EVENT_PORT_ACTIVE`, `Down` after `IBV_EVENT_PORT_ERR` (on InfiniBand
/// the port may be `Init` or `Armed` then; [`Device::port_state`] asks the device). Kept by
/// the event readers (see [`events()`]) while they run, without a system call; ports without an
/// event since the readers started are not in it.
pub fn port_states() -> BTreeMap<(String, u8), PortState> {
    lock(&watcher().ports).clone()
}

impl Device {
    /// The state of port `port` now, asked of the device (`ibv_query_port` on librdmacm's
    /// context of the device, which stays open in the process). Port events ([`events()`]) say
    /// when to look again.
    ///
    /// # Errors
    ///
    /// `NotFound` when the device is gone or has no such port (the message names its ports);
    /// the OS error of `ibv_query_device` or `ibv_query_port`.
    pub fn port_state(&self, port: u8) -> io::Result<PortState> {
        Ok(port_state_of(crate::verbs::query_port_state(
            self.name(),
            port,
        )?))
    }
}

fn port_state_of(state: rdma_async_sys::ibv_port_state::Type) -> PortState {
    use rdma_async_sys::ibv_port_state as s;
    match state {
        s::IBV_PORT_DOWN => PortState::Down,
        s::IBV_PORT_INIT => PortState::Init,
        s::IBV_PORT_ARMED => PortState::Armed,
        s::IBV_PORT_ACTIVE => PortState::Active,
        s::IBV_PORT_ACTIVE_DEFER => PortState::ActiveDefer,
        _ => PortState::Unknown,
    }
}

/// Ends a connection whose queue pair an event broke (implemented by the connection's link).
pub(crate) trait QueuePairOwner: Send + Sync {
    /// Records `event` as the reason the connection ended and disconnects it; `false` when the
    /// connection is already gone.
    fn abort(&self, event: &DeviceEvent) -> bool;
}

/// A queue pair's owner and its registration.
type Owner = (Registration, Box<dyn QueuePairOwner>);

/// The process-wide readers, subscribers, counts and queue pair owners.
struct Watcher {
    tx: broadcast::Sender<DeviceEvent>,
    /// The running readers, by context address, each with its liveness flag.
    readers: Mutex<HashMap<usize, Arc<AtomicBool>>>,
    counts: Mutex<BTreeMap<(String, DeviceEventKind), u64>>,
    /// What the last port event of each (device, port) said.
    ports: Mutex<BTreeMap<(String, u8), PortState>>,
    /// The connections, by (context address, queue pair number), each with its registration.
    owners: Mutex<HashMap<(usize, u32), Owner>>,
}

fn watcher() -> &'static Watcher {
    static WATCHER: OnceLock<Watcher> = OnceLock::new();
    WATCHER.get_or_init(|| Watcher {
        tx: broadcast::channel(CHANNEL_CAPACITY).0,
        readers: Mutex::new(HashMap::new()),
        counts: Mutex::new(BTreeMap::new()),
        ports: Mutex::new(BTreeMap::new()),
        owners: Mutex::new(HashMap::new()),
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // Maps updated by single inserts and removes: a panic elsewhere cannot leave them torn.
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Watcher {
    /// Starts a reader for every device without a live one. Unless `relist`, returns at once
    /// when some reader runs (the connection path: no device listing per connection).
    fn start(&self, relist: bool) -> io::Result<()> {
        let mut readers = lock(&self.readers);
        readers.retain(|_, alive| alive.load(Ordering::Acquire));
        if !relist && !readers.is_empty() {
            return Ok(());
        }
        let handle = tokio::runtime::Handle::try_current().map_err(|_| {
            io::Error::other("device events are read on a Tokio runtime: call this inside one")
        })?;
        for fd in AsyncEventFd::all()? {
            let key = fd.context().as_ptr() as usize;
            if readers.contains_key(&key) {
                continue;
            }
            let device = fd.device_name().to_owned();
            let fd = register_readable(fd)?;
            let alive = Arc::new(AtomicBool::new(true));
            readers.insert(key, alive.clone());
            tracing::debug!(target: "rdma_async::device::events", %device, "reading the device's asynchronous events");
            handle.spawn(read_events(fd, Alive(alive)));
        }
        Ok(())
    }

    fn dispatch(&self, fd: &AsyncEventFd, raw: RawAsyncEvent) {
        self.dispatch_from(fd.device_name(), fd.context().as_ptr() as usize, raw);
    }

    /// Handles `raw`, an event of device `device` whose context is at address `ctx`.
    fn dispatch_from(&self, device: &str, ctx: usize, raw: RawAsyncEvent) {
        let event = DeviceEvent {
            device: device.to_owned(),
            kind: DeviceEventKind::from_raw(raw.kind),
            port: raw.port,
            qp_num: raw.qp_num,
        };
        log(&event, raw.kind);
        *lock(&self.counts)
            .entry((event.device.clone(), event.kind))
            .or_default() += 1;
        let state = match event.kind {
            DeviceEventKind::PortActive => Some(PortState::Active),
            DeviceEventKind::PortError => Some(PortState::Down),
            _ => None,
        };
        if let (Some(state), Some(port)) = (state, event.port) {
            lock(&self.ports).insert((event.device.clone(), port), state);
        }
        if event.kind.breaks_queue_pair()
            && let Some(qp) = event.qp_num
        {
            self.abort_owner(ctx, qp, &event);
        }
        // No subscriber is not an error.
        let _ = self.tx.send(event);
    }

    fn abort_owner(&self, ctx: usize, qp: u32, event: &DeviceEvent) {
        let owner = lock(&self.owners).remove(&(ctx, qp));
        match owner {
            Some((_, owner)) if owner.abort(event) => {
                tracing::warn!(target: "rdma_async::device::events", %event, "connection ended by a device event");
            }
            _ => {
                tracing::debug!(target: "rdma_async::device::events", %event, "no live connection owns the queue pair")
            }
        }
    }
}

/// Logs an event at a level that fits it.
fn log(event: &DeviceEvent, raw: t::Type) {
    let device = event.device.as_str();
    let name = event.kind.name();
    let port = event.port;
    let qp = event.qp_num;
    let what = event_type_str(raw);
    macro_rules! at {
        ($level:ident) => {
            tracing::$level!(target: "rdma_async::device::events", device, event = name, ?port, ?qp, "device event: {what}")
        };
    }
    match event.kind {
        DeviceEventKind::DeviceFatal
        | DeviceEventKind::QpFatal
        | DeviceEventKind::QpRequestError
        | DeviceEventKind::QpAccessError
        | DeviceEventKind::CqError
        | DeviceEventKind::SrqError
        | DeviceEventKind::WqFatal => at!(error),
        DeviceEventKind::PortError | DeviceEventKind::PathMigrationError => at!(warn),
        DeviceEventKind::PortActive => at!(info),
        _ => at!(debug),
    }
}

/// Clears a reader's liveness flag when its task ends (or is dropped with its runtime).
struct Alive(Arc<AtomicBool>);

impl Drop for Alive {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Release);
    }
}

async fn read_events(fd: AsyncFd<AsyncEventFd>, _alive: Alive) {
    let watcher = watcher();
    loop {
        let mut guard = match fd.readable().await {
            Ok(guard) => guard,
            Err(e) => {
                tracing::warn!(target: "rdma_async::device::events", device = fd.get_ref().device_name(), error = %e, "device event reader stopped");
                return;
            }
        };
        loop {
            match fd.get_ref().try_next() {
                Ok(Some(raw)) => watcher.dispatch(fd.get_ref(), raw),
                Ok(None) => {
                    guard.clear_ready();
                    break;
                }
                Err(e) => {
                    tracing::warn!(target: "rdma_async::device::events", device = fd.get_ref().device_name(), error = %e, "device event reader stopped");
                    return;
                }
            }
        }
    }
}

/// Registers the owner of queue pair `qp` on device context `ctx`, and makes sure the readers
/// run (on the current runtime, if there is one), so a fatal event of the queue pair ends the
/// connection.
pub(crate) fn register_queue_pair(
    ctx: usize,
    qp: u32,
    owner: Box<dyn QueuePairOwner>,
) -> Registration {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let registration = Registration {
        ctx,
        qp,
        serial: NEXT.fetch_add(1, Ordering::Relaxed),
    };
    let watcher = watcher();
    lock(&watcher.owners).insert((ctx, qp), (registration, owner));
    if let Err(e) = watcher.start(false) {
        tracing::debug!(target: "rdma_async::device::events", error = %e, "device event readers not started");
    }
    registration
}

/// A connection's entry among the queue pair owners.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Registration {
    ctx: usize,
    qp: u32,
    /// Tells this entry from a later one for a reused queue pair number.
    serial: u64,
}

impl Registration {
    /// Forgets the owner (the connection is being released), unless a newer connection already
    /// took the queue pair number over.
    pub(crate) fn forget(self) {
        let mut owners = lock(&watcher().owners);
        if owners
            .get(&(self.ctx, self.qp))
            .is_some_and(|(registration, _)| *registration == self)
        {
            owners.remove(&(self.ctx, self.qp));
        }
    }
}

/// Test hook: handles `kind` for queue pair `qp_num` or port `port` of `device` as if the device
/// had reported it (logged, counted, broadcast, and a breaking queue pair event ends the
/// connection). Soft-RoCE raises no queue pair events of its own.
///
/// # Errors
///
/// `NotFound` when there is no such device.
#[cfg(rdma_async_hooks)]
pub fn inject_event(
    device: &str,
    kind: DeviceEventKind,
    port: Option<u8>,
    qp_num: Option<u32>,
) -> io::Result<()> {
    let raw = (0..=t::IBV_EVENT_WQ_FATAL)
        .find(|&raw| DeviceEventKind::from_raw(raw) == kind)
        .unwrap_or(match kind {
            DeviceEventKind::Other(n) => n,
            _ => u32::MAX,
        });
    let fd = AsyncEventFd::all()?
        .into_iter()
        .find(|fd| fd.device_name() == device)
        .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("no device {device}")))?;
    watcher().dispatch(
        &fd,
        RawAsyncEvent {
            kind: raw,
            port,
            qp_num,
        },
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    struct Counting(Arc<AtomicUsize>);

    impl QueuePairOwner for Counting {
        fn abort(&self, event: &DeviceEvent) -> bool {
            assert_eq!(event.kind, DeviceEventKind::QpFatal);
            self.0.fetch_add(1, Ordering::SeqCst);
            true
        }
    }

    #[test]
    fn a_breaking_queue_pair_event_ends_its_owner_once_and_is_counted_and_broadcast() {
        let watcher = watcher();
        let mut rx = watcher.tx.subscribe();
        let aborted = Arc::new(AtomicUsize::new(0));
        // A made-up context address no device has.
        let ctx = 0x5ee0;
        register_queue_pair(ctx, 7, Box::new(Counting(aborted.clone())));
        let raw = |kind, qp_num| RawAsyncEvent {
            kind,
            port: None,
            qp_num: Some(qp_num),
        };
        // Another queue pair's event and a harmless one leave it alone.
        watcher.dispatch_from("fake9", ctx, raw(t::IBV_EVENT_QP_FATAL, 8));
        watcher.dispatch_from("fake9", ctx, raw(t::IBV_EVENT_COMM_EST, 7));
        assert_eq!(aborted.load(Ordering::SeqCst), 0);
        watcher.dispatch_from("fake9", ctx, raw(t::IBV_EVENT_QP_FATAL, 7));
        assert_eq!(aborted.load(Ordering::SeqCst), 1);
        // Ended once: the owner is forgotten.
        watcher.dispatch_from("fake9", ctx, raw(t::IBV_EVENT_QP_FATAL, 7));
        assert_eq!(aborted.load(Ordering::SeqCst), 1);

        let counts = event_counts();
        assert_eq!(
            counts.get(&("fake9".to_owned(), DeviceEventKind::QpFatal)),
            Some(&3)
        );
        let seen: Vec<DeviceEvent> = std::iter::from_fn(|| rx.try_recv().ok())
            .filter(|e| e.device == "fake9")
            .collect();
        assert_eq!(seen.len(), 4);
        assert_eq!(
            seen[2].to_string(),
            "IBV_EVENT_QP_FATAL on RDMA device fake9 queue pair 7"
        );
    }

    #[test]
    fn a_released_connection_does_not_forget_a_newer_owner_of_its_queue_pair_number() {
        let watcher = watcher();
        let (old, new) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let ctx = 0x5ee1;
        let first = register_queue_pair(ctx, 9, Box::new(Counting(old.clone())));
        // The number is reused before the first connection's link is dropped.
        let _second = register_queue_pair(ctx, 9, Box::new(Counting(new.clone())));
        first.forget();
        let raw = RawAsyncEvent {
            kind: t::IBV_EVENT_QP_FATAL,
            port: None,
            qp_num: Some(9),
        };
        watcher.dispatch_from("fake8", ctx, raw);
        assert_eq!(old.load(Ordering::SeqCst), 0);
        assert_eq!(new.load(Ordering::SeqCst), 1);
    }
}
