//! The rsockets stream protocol (wire version 1) as an I/O-free state machine.
//!
//! Nothing here touches verbs, memory registration, tokio or libc: the driver (`stream`'s
//! `StreamCore`, in `stream/driver/`) owns all registered memory and the queue pair, and
//! feeds this core with what happened (`handle_*`: connection data, send and receive
//! completions, CM events, application reads and writes). The core answers with plans
//! (`prepare_write` → [`DataWrite`], `poll_control` → [`ControlWrite`](plan::ControlWrite)) that
//! say which RDMA writes to post, and with `Blocked`-style results instead of blocking.
//! quinn-proto works the same way; [`Connection`] lists its kinds of methods and the order a
//! driver calls them in.
//!
//! The wire format and rules come from `shared/design/rsocket-protocol.md` (§1.2 connection
//! data, §2 data path, §2.9 interop checklist, §3 control messages). Every value a peer
//! controls is checked; a violation is a [`ProtoError`], never a panic. A simulated pair of
//! peers (`sim`, tests only) checks every remote write against what the receiver had
//! granted at that moment.
//!
//! Files: `config` (sizes and constants), `conn_data` (the 40 private-data bytes), `imm` (the
//! immediate word), `sge` (16-byte SGL entries and byte order), `ring` (ring segments),
//! `sender`, `receiver` (with `message_lengths`, its queue of unread messages), `control`
//! (control slots), `plan` (work requests to post), `wr`
//! (work-request ids), `state`, `connection` (the whole, with its `send`, `recv` and
//! `control_writes` parts), `error`; `hostile` (tests and fuzzing only) plays a hostile peer
//! against one connection and checks what it must never do.

#![forbid(unsafe_code)]

mod config;
mod conn_data;
mod connection;
mod control;
mod error;
#[cfg(any(test, rdma_async_fuzzing))]
mod grant_queue;
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) mod hostile;
mod imm;
mod message_lengths;
mod plan;
mod receiver;
mod ring;
mod ring_access;
mod sender;
mod sge;
mod state;
mod timers;
mod wr;

#[cfg(test)]
mod sim;
#[cfg(test)]
mod tests;

pub(crate) use config::Config;
pub(crate) use conn_data::ConnData;
pub(crate) use connection::{Connection, LocalLayout, ReadStatus, TARGET_SGL_BYTES, WriteError};
pub(crate) use error::{ProtoError, ProtoErrorKind};
pub(crate) use plan::{DataWrite, LendStep, WindowBind};
pub(crate) use ring::RingSegment;
pub(crate) use ring_access::RingKeys;
pub(crate) use sender::{WriteBlocked, WriteCall};
pub(crate) use wr::WR_ID_RECV_FLAG;

// What only the unit tests and the simulator reach through `crate::proto`.
#[cfg(test)]
pub(crate) use config::{
    RS_MAX_TRANSFER, RS_OLAP_START_SIZE, RS_QP_CTRL_SIZE, RS_SGL_SIZE, RS_SNDLOWAT,
};
#[cfg(test)]
pub(crate) use conn_data::{CONN_DATA_LEN, iomap_code_to_size, iomap_size_to_code};
#[cfg(test)]
pub(crate) use connection::{RecvAction, RecvEvent};
#[cfg(test)]
pub(crate) use imm::CtrlCode;
#[cfg(any(test, rdma_async_fuzzing))]
pub(crate) use imm::Op;
#[cfg(test)]
pub(crate) use plan::{ControlKind, ControlWrite};
#[cfg(test)]
pub(crate) use ring::Segments;
#[cfg(test)]
pub(crate) use sge::{ByteOrder, RsSge};
