//! [`DeviceContext`]: one protection domain on one RDMA device, shared by every connection,
//! listener, datagram socket and region created through it.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};

use bytes::BytesMut;

use crate::error;
use crate::memory::{LocalRegion, RemoteAccess, SharedRegion};
use crate::memory::{adopt, allocate, bytes_mut_to_vec};
use crate::verbs::{Access, CmDevices, CmId, EventChannel, PortSpace, ProtectionDomain};

/// A protection domain on one RDMA device: memory registered through it can be used by every
/// connection on that device made through it.
///
/// Every `RStream`, `RListener`, `Endpoint`, `RdmaConnection`, `RDatagram` and
/// `SharedReceiveQueue` works in one. Those that name none (the default) use the device's
/// **shared** context, one per device per process ([`DeviceContext::shared`]), so by default a
/// region registered on one connection can be sent on any other connection of the same device,
/// and a process makes one protection domain per device, not one per connection. Name an
/// explicit context (`context(...)` on the options) to isolate connections: regions of one
/// [`DeviceContext::open`]ed context cannot be used with connections of another, as with
/// separate `ibv_pd`s.
///
/// Using a region, a shared receive queue or a context on a connection of another protection
/// domain is an `InvalidInput` error naming both; a context of another device than the one the
/// route goes through is refused before anything is sent.
///
/// **Isolation.** A remote key works on every queue pair of its protection domain. In a shared
/// context, a peer of one connection that learns or guesses the key of a region advertised to
/// another peer can read or write it (as with C rsockets and librdmacm's default protection
/// domain, which are shared per device too). Servers whose clients do not trust each other set
/// `isolated_context(true)` on the options: each connection then gets its own.
///
/// Cloning is cheap (an `Arc`); the protection domain lives while any clone, connection or
/// region of it does. Two contexts are equal when they share the protection domain.
#[derive(Debug, Clone)]
pub struct DeviceContext {
    pd: Arc<ProtectionDomain>,
}

/// The shared contexts that are alive, one per device context of librdmacm.
static SHARED: Mutex<Vec<Weak<ProtectionDomain>>> = Mutex::new(Vec::new());

impl PartialEq for DeviceContext {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.pd, &other.pd)
    }
}

impl Eq for DeviceContext {}

impl DeviceContext {
    /// The process-wide shared context of the device called `device` (e.g. `mlx5_0`, `rxe0`):
    /// the one every object that names no context uses.
    ///
    /// # Errors
    ///
    /// `NotFound` when there is no such device (the message lists the devices there are) or no
    /// RDMA device at all; the OS error of `ibv_alloc_pd`.
    pub fn shared(device: &str) -> io::Result<Self> {
        let devices = CmDevices::new()?;
        let ctx = find(&devices, device)?;
        shared_on(ctx, || ProtectionDomain::on_device(Arc::new(devices), ctx))
    }

    /// A new context on the device called `device`, with a protection domain of its own.
    ///
    /// # Errors
    ///
    /// As [`DeviceContext::shared`].
    pub fn open(device: &str) -> io::Result<Self> {
        let devices = CmDevices::new()?;
        let ctx = find(&devices, device)?;
        Ok(DeviceContext {
            pd: Arc::new(ProtectionDomain::on_device(Arc::new(devices), ctx)?),
        })
    }

    /// The shared context of the device that carries the local address `ip`.
    ///
    /// # Errors
    ///
    /// `AddrNotAvailable` when `ip` is not an address of this host, `NotFound` when it is not
    /// on an RDMA device; the OS error of `ibv_alloc_pd`.
    pub fn for_local_addr(ip: IpAddr) -> io::Result<Self> {
        let id = CmId::new(Arc::new(EventChannel::new()?), PortSpace::Tcp)?;
        // Port 0: any free port; binding only picks the device.
        id.bind_addr(SocketAddr::new(ip, 0))?;
        if id.verbs().is_err() {
            return Err(error::no_device(format!(
                "{ip} is not an address of an RDMA device"
            )));
        }
        DeviceContext::for_id(&Arc::new(id))
    }

    /// The shared context of the device `id` is bound to.
    pub(crate) fn for_id(id: &Arc<CmId>) -> io::Result<Self> {
        let ctx = id.verbs()?;
        shared_on(ctx, || {
            let devices = CmDevices::new()?;
            if devices.holds(ctx) {
                ProtectionDomain::on_device(Arc::new(devices), ctx)
            } else {
                // Not in librdmacm's list (a device added since?): the id keeps it open.
                ProtectionDomain::new(id.clone())
            }
        })
    }

    /// `explicit`, checked to be on `id`'s device, or else the shared context of that device.
    pub(crate) fn resolve(explicit: Option<&DeviceContext>, id: &Arc<CmId>) -> io::Result<Self> {
        match explicit {
            None => DeviceContext::for_id(id),
            Some(context) if context.pd.is_device_of(id)? => Ok(context.clone()),
            Some(context) => Err(error::invalid_input(format!(
                "the device context is on RDMA device {}, but {} goes through {}; use a \
                 context of that device, or bind to an address of {}",
                context.device_name(),
                id.peer_addr()
                    .map(|peer| format!("the route to {peer}"))
                    .unwrap_or_else(|_| "the bound address".to_owned()),
                crate::verbs::IdDevice::of(id)
                    .map(|d| d.name)
                    .unwrap_or_else(|_| "another device".to_owned()),
                context.device_name(),
            ))),
        }
    }

    /// A new context of `id`'s device for one connection.
    pub(crate) fn isolated(id: &Arc<CmId>) -> io::Result<Self> {
        Ok(DeviceContext {
            pd: Arc::new(ProtectionDomain::new(id.clone())?),
        })
    }

    pub(crate) fn from_pd(pd: Arc<ProtectionDomain>) -> Self {
        DeviceContext { pd }
    }

    pub(crate) fn pd(&self) -> &Arc<ProtectionDomain> {
        &self.pd
    }

    /// The name of the device (as `ibv_devices` shows it).
    pub fn device_name(&self) -> &str {
        self.pd.device_name()
    }

    /// Allocates `len` zeroed, page-aligned bytes for sends, receives and the local side of
    /// RDMA operations, with no remote access (`rdma_reg_msgs`).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for 0 bytes, or more than `u32::MAX` for a region a peer can reach (local
    /// regions may be larger: each work request covers at most `u32::MAX` bytes of one); the
    /// OS error of `ibv_reg_mr`
    /// (`OutOfMemory` when the locked-memory limit is reached).
    pub fn reg_msgs(&self, len: usize) -> io::Result<LocalRegion> {
        Ok(LocalRegion::new(allocate(
            &self.pd,
            len,
            Access::default(),
        )?))
    }

    /// Allocates `len` zeroed bytes that memory windows can expose to a peer
    /// ([`crate::rdma::RdmaConnection::bind_window`]), with no remote access of their own
    /// (`IBV_ACCESS_MW_BIND`).
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn reg_bindable(&self, len: usize) -> io::Result<LocalRegion> {
        let access = Access {
            mw_bind: true,
            ..Access::default()
        };
        Ok(LocalRegion::new(allocate(&self.pd, len, access)?))
    }

    /// Allocates `len` bytes a peer may RDMA-read (`rdma_reg_read`).
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn reg_read(&self, len: usize) -> io::Result<SharedRegion> {
        self.reg_shared(len, RemoteAccess::READ)
    }

    /// Allocates `len` bytes a peer may RDMA-write (`rdma_reg_write`).
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn reg_write(&self, len: usize) -> io::Result<SharedRegion> {
        self.reg_shared(len, RemoteAccess::WRITE)
    }

    /// Allocates `len` bytes with the given remote access.
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn reg_shared(&self, len: usize, access: RemoteAccess) -> io::Result<SharedRegion> {
        Ok(SharedRegion::new(allocate(&self.pd, len, access.access())?))
    }

    /// Registers `bytes` (its length, not its spare capacity), taking ownership until
    /// [`LocalRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn register(&self, bytes: Vec<u8>) -> io::Result<LocalRegion> {
        Ok(LocalRegion::new(adopt(&self.pd, bytes, Access::default())?))
    }

    /// Registers `bytes` for remote access, taking ownership until [`SharedRegion::into_vec`].
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn register_shared(
        &self,
        bytes: Vec<u8>,
        access: RemoteAccess,
    ) -> io::Result<SharedRegion> {
        Ok(SharedRegion::new(adopt(&self.pd, bytes, access.access())?))
    }

    /// Registers the bytes of a `BytesMut` (without a copy when it is the only owner of its
    /// memory).
    ///
    /// # Errors
    ///
    /// As [`Self::reg_msgs`].
    pub fn register_bytes_mut(&self, bytes: BytesMut) -> io::Result<LocalRegion> {
        self.register(bytes_mut_to_vec(bytes))
    }
}

/// The device called `name` in `devices`, or `NotFound` listing the devices there are.
fn find(
    devices: &CmDevices,
    name: &str,
) -> io::Result<std::ptr::NonNull<rdma_async_sys::ibv_context>> {
    devices.by_name(name).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "no RDMA device is called {name:?} (the devices are: {})",
                devices.names().join(", ")
            ),
        )
    })
}

/// The live shared context of device context `ctx`, or a new one from `make`.
fn shared_on(
    ctx: std::ptr::NonNull<rdma_async_sys::ibv_context>,
    make: impl FnOnce() -> io::Result<ProtectionDomain>,
) -> io::Result<DeviceContext> {
    let mut shared = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    shared.retain(|pd| pd.strong_count() > 0);
    if let Some(pd) = shared
        .iter()
        .filter_map(Weak::upgrade)
        .find(|pd| pd.context() == ctx)
    {
        return Ok(DeviceContext { pd });
    }
    let pd = Arc::new(make()?);
    shared.push(Arc::downgrade(&pd));
    Ok(DeviceContext { pd })
}
