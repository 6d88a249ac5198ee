//! Registered memory as owned values: [`LocalRegion`] (no peer can reach it), [`SharedRegion`]
//! (a peer may access it through its [`RemoteRegion`]), and the checks of lengths and ranges
//! on them. The transports above (`crate::rdma`, `crate::endpoint`, `crate::stream`) and the
//! device contexts that register them (`crate::device`) all build on these; the public types are
//! re-exported from `crate::rdma`.

mod region;
mod remote;
mod span;

pub use region::{LocalRegion, RegisteredBytes, RemoteAccess, SharedRegion};
pub(crate) use region::{adopt, allocate, bytes_mut_to_vec, check_len, foreign_region, sealed};
pub use remote::{RemoteRegion, RemoteSlice};
pub(crate) use span::span;
