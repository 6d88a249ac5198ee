//! The steps of establishing a connection, shared by every connected type of the crate.
//!
//! Each step starts an rdma_cm operation and awaits the event that ends it. The caller's
//! `build` closure creates the queue pair and its memory once the device is known, before the
//! request or the accept goes out. Everything lives in locals and `Arc`s, so dropping the future at
//! any await point destroys whatever was created (the queue pair first, the id last).

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rdma_async_sys::rdma_cm_event_type as ev;

use super::error::event_error;
use super::events::CmEvents;
use super::id_options::IdOptions;
use super::link::CmLink;
use super::params::{ConnParams, MAX_CONNECT_PRIVATE_DATA};
use crate::verbs::{CmEvent, CmId, EventChannel, PortSpace};

/// How the active side reaches a peer; every connecting type's options embed one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DialOptions {
    /// The local address to connect from.
    pub(crate) bind: Option<SocketAddr>,
    /// Timeout of address and of route resolution, each.
    pub(crate) resolve_timeout: Duration,
    /// A bound on the whole connect, per address tried.
    pub(crate) connect_timeout: Option<Duration>,
    /// `rdma_set_option` options of the id.
    pub(crate) id: IdOptions,
}

impl Default for DialOptions {
    fn default() -> Self {
        DialOptions {
            bind: None,
            resolve_timeout: Duration::from_secs(2),
            connect_timeout: None,
            id: IdOptions::default(),
        }
    }
}

/// The builder methods for the [`DialOptions`] in a field named `dial`, with the same names and
/// documentation on every options type.
macro_rules! dial_setters {
    () => {
        /// Timeout of address and of route resolution, each (2 s by default).
        pub fn resolve_timeout(mut self, time: std::time::Duration) -> Self {
            self.dial.resolve_timeout = time;
            self
        }

        /// A bound on the whole connect, per address tried (none by default).
        pub fn connect_timeout(mut self, time: std::time::Duration) -> Self {
            self.dial.connect_timeout = Some(time);
            self
        }

        /// The local address to connect from.
        pub fn bind(mut self, addr: std::net::SocketAddr) -> Self {
            self.dial.bind = Some(addr);
            self
        }

        /// `rdma_set_option` options of the connection's rdma_cm id (type of service, address
        /// reuse, IPv6-only, ACK timeout).
        pub fn id_options(mut self, options: $crate::cm::IdOptions) -> Self {
            self.dial.id = options;
            self
        }
    };
}
pub(crate) use dial_setters;

/// Waits for `wanted`, skipping informational events; any other event fails the step.
pub(crate) async fn expect(
    events: &CmEvents,
    wanted: u32,
    peer: Option<SocketAddr>,
    step: &str,
) -> io::Result<CmEvent> {
    loop {
        let event = events.next().await?;
        match event.kind {
            k if k == wanted => return Ok(event),
            ev::RDMA_CM_EVENT_ADDR_CHANGE | ev::RDMA_CM_EVENT_TIMEWAIT_EXIT => {
                tracing::debug!(event = event.name(), "ignoring informational rdma_cm event");
            }
            _ => return Err(event_error(&event, peer, step)),
        }
    }
}

fn timeout_ms(d: Duration) -> i32 {
    i32::try_from(d.as_millis()).unwrap_or(i32::MAX).max(1)
}

/// Resolves, builds the queue pair with `build`, connects, and returns once established.
/// `build` may return the private data to send (it can describe what it just registered);
/// otherwise `params`' private data goes out.
pub(crate) async fn connect<R>(
    dst: SocketAddr,
    dial: &DialOptions,
    params: &ConnParams,
    build: impl FnOnce(&Arc<CmId>) -> io::Result<(R, Option<Vec<u8>>)>,
) -> io::Result<(R, CmLink)> {
    let result = connect_steps(dst, dial, params, build).await;
    if let Err(e) = &result {
        tracing::debug!(%dst, error = %e, "connect failed");
    }
    result
}

async fn connect_steps<R>(
    dst: SocketAddr,
    dial: &DialOptions,
    params: &ConnParams,
    build: impl FnOnce(&Arc<CmId>) -> io::Result<(R, Option<Vec<u8>>)>,
) -> io::Result<(R, CmLink)> {
    let mut raw_params = params.to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")?;
    let channel = Arc::new(EventChannel::new()?);
    let events = CmEvents::new(channel.clone())?;
    let id = Arc::new(CmId::new(channel, PortSpace::Tcp)?);
    dial.id.apply(&id)?;
    let ms = timeout_ms(dial.resolve_timeout);
    let peer = Some(dst);

    id.resolve_addr(dial.bind, dst, ms)?;
    expect(
        &events,
        ev::RDMA_CM_EVENT_ADDR_RESOLVED,
        peer,
        "resolving the address",
    )
    .await?;
    id.resolve_route(ms)?;
    expect(
        &events,
        ev::RDMA_CM_EVENT_ROUTE_RESOLVED,
        peer,
        "resolving the route",
    )
    .await?;

    let (resources, private_data) = build(&id)?;
    if let Some(data) = private_data {
        raw_params = params
            .clone()
            .private_data(data)
            .to_raw(MAX_CONNECT_PRIVATE_DATA, "connect")?;
    }
    id.connect(&raw_params)?;
    let established = expect(&events, ev::RDMA_CM_EVENT_ESTABLISHED, peer, "connecting").await?;
    let link = CmLink::new(id, events, established.private_data, dst)?;
    tracing::debug!(parent: link.span(), "connected");
    Ok((resources, link))
}
