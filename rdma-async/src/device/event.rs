//! One asynchronous event of a device: [`DeviceEvent`], with what happened as a
//! [`DeviceEventKind`] (`enum ibv_event_type`), its libibverbs name and whether it breaks the
//! queue pair it names. The readers that receive them are in `events`.

use std::fmt;

use rdma_async_sys::ibv_event_type as t;

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
    /// The kind of libibverbs' event type `kind`.
    pub(super) fn from_raw(kind: t::Type) -> Self {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::event_type_str;

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
}
