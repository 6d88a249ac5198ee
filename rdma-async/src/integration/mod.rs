//! Glue between [`RStream`](crate::stream::RStream) / [`RListener`](crate::stream::RListener)
//! and HTTP stacks, each behind a cargo feature that is off by default.
//!
//! - feature `hyper`: [`hyper::RConnector`] for hyper-util's pooled client, and
//!   `hyper_util::client::legacy::connect::Connection` for `RStream`. Servers need no glue:
//!   wrap an accepted stream in `hyper_util::rt::TokioIo` and hand it to hyper's
//!   `serve_connection`.
//! - feature `axum`: `axum::serve::Listener` for `RListener`, so `axum::serve(listener, app)`
//!   serves over RDMA (see [`axum`] for `ConnectInfo`).
//! - feature `tonic` (implies `hyper`): `tonic::transport::server::Connected` for `RStream`,
//!   so `serve_with_incoming(listener.into_incoming())` serves gRPC with working
//!   `remote_addr()`; [`hyper::RConnector`] is the client's connector (see [`tonic`]).

#[cfg(feature = "axum")]
pub mod axum;
#[cfg(feature = "hyper")]
pub mod hyper;
#[cfg(feature = "tonic")]
pub mod tonic;
