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
use std::fmt;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

use rdma_async_sys::ibv_event_type as t;
use tokio::io::unix::AsyncFd;
use tokio::sync::broadcast;

use super::Device;
use super::ports::PortState;
use crate::verbs::{AsyncEventFd, RawAsyncEvent, event_type_str, register_readable};

/// How many events a slow subscriber may fall behind before it misses some.
const CHANNEL_CAPACITY: usize = 256;

/// What happened (`enum ibv_event_type`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum DeviceEventKind {
    /// `IBV_EVENT_PORT_ACTIVE`: the port came up.
    PortActive,
    /// `IBV_EVENT_PORT_ERR`: the port went down (on RoCE: its netdev went down).
    PortError,
    /// `IBV_EVENT_GID_CHANGE`: the port's GID table changed (addresses added or removed).
    GidChange,
    /// `IBV_EVENT_LID_CHANGE` (InfiniBand).
    LidChange,
    /// `IBV_EVENT_PKEY_CHANGE` (InfiniBand).
    PkeyChange,
    /// `IBV_EVENT_SM_CHANGE` (InfiniBand).
    SmChange,
    /// `IBV_EVENT_CLIENT_REREGISTER` (InfiniBand).
    ClientReregister,
    /// `IBV_EVENT_QP_FATAL`: the queue pair is broken; its connection is ended.
    QpFatal,
    /// `IBV_EVENT_QP_REQ_ERR`: the peer's requests violated the transport; its connection is
    /// ended.
    QpRequestError,
    /// `IBV_EVENT_QP_ACCESS_ERR`: a remote access violation; its connection is ended.
    QpAccessError,
    /// `IBV_EVENT_COMM_EST`: the first packet arrived on a queue pair not yet ready to send.
    CommEstablished,
    /// `IBV_EVENT_SQ_DRAINED`.
    SqDrained,
    /// `IBV_EVENT_PATH_MIG`.
    PathMigrated,
    /// `IBV_EVENT_PATH_MIG_ERR`.
    PathMigrationError,
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: a queue pair of a shared receive queue left the
    /// error state's last work request behind.
    LastWqeReached,
    /// `IBV_EVENT_CQ_ERR`: a completion queue overran.
    CqError,
    /// `IBV_EVENT_SRQ_ERR`.
    SrqError,
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`.
    SrqLimitReached,
    /// `IBV_EVENT_WQ_FATAL`.
    WqFatal,
    /// `IBV_EVENT_DEVICE_FATAL`: the device is unusable.
    DeviceFatal,
    /// An event type this crate does not know, by number.
    Other(u32),
}

impl DeviceEventKind {
    fn from_raw(kind: t::Type) -> Self {
        use DeviceEventKind as K;
        match kind {
            t::IBV_EVENT_PORT_ACTIVE => K::PortActive,
            t::IBV_EVENT_PORT_ERR => K::PortError,
            t::IBV_EVENT_GID_CHANGE => K::GidChange,
            t::IBV_EVENT_LID_CHANGE => K::LidChange,
            t::IBV_EVENT_PKEY_CHANGE => K::PkeyChange,
            t::IBV_EVENT_SM_CHANGE => K::SmChange,
            t::IBV_EVENT_CLIENT_REREGISTER => K::ClientReregister,
            t::IBV_EVENT_QP_FATAL => K::QpFatal,
            t::IBV_EVENT_QP_REQ_ERR => K::QpRequestError,
            t::IBV_EVENT_QP_ACCESS_ERR => K::QpAccessError,
            t::IBV_EVENT_COMM_EST => K::CommEstablished,
            t::IBV_EVENT_SQ_DRAINED => K::SqDrained,
            t::IBV_EVENT_PATH_MIG => K::PathMigrated,
            t::IBV_EVENT_PATH_MIG_ERR => K::PathMigrationError,
            t::IBV_EVENT_QP_LAST_WQE_REACHED => K::LastWqeReached,
            t::IBV_EVENT_CQ_ERR => K::CqError,
            t::IBV_EVENT_SRQ_ERR => K::SrqError,
            t::IBV_EVENT_SRQ_LIMIT_REACHED => K::SrqLimitReached,
            t::IBV_EVENT_WQ_FATAL => K::WqFatal,
            t::IBV_EVENT_DEVICE_FATAL => K::DeviceFatal,
            other => K::Other(other),
        }
    }

    /// libibverbs' name of the event type (`IBV_EVENT_PORT_ERR`, ...).
    pub fn name(&self) -> &'static str {
        use DeviceEventKind as K;
        match self {
            K::PortActive => "IBV_EVENT_PORT_ACTIVE",
            K::PortError => "IBV_EVENT_PORT_ERR",
            K::GidChange => "IBV_EVENT_GID_CHANGE",
            K::LidChange => "IBV_EVENT_LID_CHANGE",
            K::PkeyChange => "IBV_EVENT_PKEY_CHANGE",
            K::SmChange => "IBV_EVENT_SM_CHANGE",
            K::ClientReregister => "IBV_EVENT_CLIENT_REREGISTER",
            K::QpFatal => "IBV_EVENT_QP_FATAL",
            K::QpRequestError => "IBV_EVENT_QP_REQ_ERR",
            K::QpAccessError => "IBV_EVENT_QP_ACCESS_ERR",
            K::CommEstablished => "IBV_EVENT_COMM_EST",
            K::SqDrained => "IBV_EVENT_SQ_DRAINED",
            K::PathMigrated => "IBV_EVENT_PATH_MIG",
            K::PathMigrationError => "IBV_EVENT_PATH_MIG_ERR",
            K::LastWqeReached => "IBV_EVENT_QP_LAST_WQE_REACHED",
            K::CqError => "IBV_EVENT_CQ_ERR",
            K::SrqError => "IBV_EVENT_SRQ_ERR",
            K::SrqLimitReached => "IBV_EVENT_SRQ_LIMIT_REACHED",
            K::WqFatal => "IBV_EVENT_WQ_FATAL",
            K::DeviceFatal => "IBV_EVENT_DEVICE_FATAL",
            K::Other(_) => "IBV_EVENT_(unknown)",
        }
    }

    /// Whether the event means the queue pair it names cannot go on.
    pub fn breaks_queue_pair(&self) -> bool {
        matches!(
            self,
            DeviceEventKind::QpFatal
                | DeviceEventKind::QpRequestError
                | DeviceEventKind::QpAccessError
        )
    }
}

impl fmt::Display for DeviceEventKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceEventKind::Other(n) => write!(f, "IBV_EVENT {n}"),
            kind => f.write_str(kind.name()),
        }
    }
}

/// One asynchronous event of a device.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DeviceEvent {
    /// The device's name (`rxe0`).
    pub device: String,
    /// What happened.
    pub kind: DeviceEventKind,
    /// The port, for port events.
    pub port: Option<u8>,
    /// The queue pair number, for queue pair events.
    pub qp_num: Option<u32>,
}

impl fmt::Display for DeviceEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on RDMA device {}", self.kind, self.device)?;
        if let Some(port) = self.port {
            write!(f, " port {port}")?;
        }
        if let Some(qp) = self.qp_num {
            write!(f, " queue pair {qp}")?;
        }
        Ok(())
    }
}

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
#[cfg(feature = "test-hooks")]
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

    #[test]
    fn every_libibverbs_event_type_has_its_kind_and_name() {
        let kinds: Vec<DeviceEventKind> = (0..=t::IBV_EVENT_WQ_FATAL)
            .map(DeviceEventKind::from_raw)
            .collect();
        for (raw, kind) in kinds.iter().enumerate() {
            assert!(!matches!(kind, DeviceEventKind::Other(_)), "type {raw}");
            let libibverbs = event_type_str(raw as u32);
            assert!(!libibverbs.is_empty());
        }
        let mut unique = kinds.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), kinds.len(), "one kind per type");
        assert_eq!(DeviceEventKind::from_raw(99), DeviceEventKind::Other(99));
        assert_eq!(
            DeviceEventKind::from_raw(t::IBV_EVENT_PORT_ERR).name(),
            "IBV_EVENT_PORT_ERR"
        );
    }

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
