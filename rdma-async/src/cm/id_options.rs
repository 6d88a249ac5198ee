//! `rdma_set_option(3)` options of an rdma_cm id: type of service, address reuse, IPv6-only,
//! ACK timeout.

use std::io;

use rdma_async_sys::_bindgen_ty_26 as opt;

use crate::verbs::{CmId, PortSpace};

/// Options set on an rdma_cm id before it binds (`rdma_set_option` at `RDMA_OPTION_ID`), for
/// dialing and accepting (`id_options` on every connection type's options), listening
/// ([`super::CmListener::bind_with`], `RListener::bind_with`) and datagram sockets. Unset options
/// keep rdma_cm's defaults.
///
/// On a listener, address reuse, IPv6-only and type of service apply to the listening id, and
/// the ACK timeout to every connection it accepts (unless the accepting type's options set their
/// own).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdOptions {
    tos: Option<u8>,
    reuse_addr: Option<bool>,
    af_only: Option<bool>,
    ack_timeout: Option<u8>,
}

impl IdOptions {
    /// No options set.
    pub fn new() -> Self {
        Self::default()
    }

    /// `RDMA_OPTION_ID_TOS`: the type of service (the IP TOS byte on RoCE; the service level
    /// rdma_cm derives on InfiniBand). rping's `-t`.
    pub fn type_of_service(mut self, tos: u8) -> Self {
        self.tos = Some(tos);
        self
    }

    /// `RDMA_OPTION_ID_REUSEADDR`: bind to a port still held by a closed connection.
    pub fn reuse_address(mut self, on: bool) -> Self {
        self.reuse_addr = Some(on);
        self
    }

    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 wildcard bind accepts IPv6 only (not IPv4-mapped).
    pub fn ipv6_only(mut self, on: bool) -> Self {
        self.af_only = Some(on);
        self
    }

    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the transport's local ACK timeout exponent (4.096 µs ·
    /// 2^n, 0..=31); with the retry count it bounds how long an unanswered peer takes to fail.
    pub fn ack_timeout(mut self, exponent: u8) -> Self {
        self.ack_timeout = Some(exponent.min(31));
        self
    }

    /// These options, with each unset one taken from `fallback`.
    pub(crate) fn or(&self, fallback: &IdOptions) -> IdOptions {
        IdOptions {
            tos: self.tos.or(fallback.tos),
            reuse_addr: self.reuse_addr.or(fallback.reuse_addr),
            af_only: self.af_only.or(fallback.af_only),
            ack_timeout: self.ack_timeout.or(fallback.ack_timeout),
        }
    }

    /// Sets every option that is set on `id` of port space `ps`, which must not be bound yet.
    /// A datagram id has no ACKs: the ACK timeout is left out there (rdma_cm refuses it).
    pub(crate) fn apply(&self, id: &CmId, ps: PortSpace) -> io::Result<()> {
        let int = |on: bool| i32::from(on).to_ne_bytes();
        if let Some(on) = self.reuse_addr {
            id.set_option(opt::RDMA_OPTION_ID_REUSEADDR, &mut int(on))?;
        }
        if let Some(on) = self.af_only {
            id.set_option(opt::RDMA_OPTION_ID_AFONLY, &mut int(on))?;
        }
        if let Some(tos) = self.tos {
            id.set_option(opt::RDMA_OPTION_ID_TOS, &mut [tos])?;
        }
        match ps {
            PortSpace::Tcp => self.apply_to_accepted(id),
            PortSpace::Udp => Ok(()),
        }
    }

    /// Sets the options that also apply to an accepted id (the ACK timeout; rdma_cm gives an
    /// accepted id none of the listener's, and the others only matter before binding).
    pub(crate) fn apply_to_accepted(&self, id: &CmId) -> io::Result<()> {
        if let Some(t) = self.ack_timeout {
            id.set_option(opt::RDMA_OPTION_ID_ACK_TIMEOUT, &mut [t])?;
        }
        Ok(())
    }
}
