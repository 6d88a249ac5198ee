//! The device tests, one module per subject, in one binary (one link instead of one per file).
//!
//! Tests that count this process's RDMA resources (`leaks`, `datagram_leaks`, `rdma_cancel`) or
//! install a process-wide tracing subscriber (`tracing`) are not here: each is its own binary,
//! so no other test runs beside it. `scripts/device-tests` runs the binaries one at a time.

mod choosing;
mod cm;
mod context;
mod datagram;
mod datagram_peers;
mod dead_peer;
mod dropped_runtime;
mod examples;
mod http;
mod lent_reads;
mod limits;
mod mckey;
mod memory;
mod pool;
mod ports;
mod preload;
mod rdma_batches;
mod rdma_doorbells;
mod rdma_ops;
mod rdma_setup;
mod repost_failure;
mod rnr;
mod rping;
mod server_options;
mod sticky_errors;
mod stream;
mod stream_api;
mod stream_cost;
mod stream_flood;
mod stream_waiters;
mod tls;
mod tonic;
mod ucmatose;
mod udaddy;
mod windows;
mod zero_copy;

/// `examples/rping`'s code, compiled in and run in-process by [`rping`].
#[path = "../../../examples/rping.rs"]
#[allow(dead_code)]
mod rping_example;
