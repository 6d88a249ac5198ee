//! Raw FFI bindings to the system **libibverbs** and **librdmacm**, for `rdma-async`.
//!
//! This crate is deliberately thin: it declares the functions and types `rdma-async` uses and
//! nothing else. The bindings in `bindings.rs` are generated from the installed rdma-core headers
//! by `scripts/regen-bindings` and committed, so building needs no libclang. The verbs that
//! rdma-core defines as `static inline` (posting work requests, polling and arming completion
//! queues, ...) dispatch through provider function pointers; they are compiled from the installed
//! headers by a small C shim and exported here as `rdma_async_*` functions, so they can never drift
//! from the provider ABI.
//!
//! Enums are modules of constants (`ibv_wc_status::IBV_WC_SUCCESS`), never Rust enums: a newer
//! provider may hand back a value the bindings do not know.
//!
//! Every function here is `unsafe` and follows the contract of its C man page.
//!
//! The committed bindings were generated from **rdma-core 44.0** (libibverbs 1.14.44.0,
//! librdmacm 1.3.44.0, Debian 12) and are tested against it on Soft-RoCE;
//! `scripts/regen-bindings --check` in the repository shows the diff against another machine's
//! headers. The C shim is always compiled against the headers of the machine that builds.
//!
//! One set of bindings serves every 64-bit Linux target (x86_64 and aarch64 are built and tested):
//! the only types whose layout differs between them, glibc's `pthread_mutex_t` and
//! `pthread_cond_t` (inside `ibv_cq`, `ibv_srq`, `ibv_qp`, `ibv_context`, ...), come from the `libc`
//! crate, which has them per target. bindgen's layout assertions, which hold the generating
//! machine's numbers, apply on x86_64 only; on every target, the crate's `tests/layout.rs`
//! compares the size and alignment of every struct and union here, and the offset and size of
//! each field, with the target's C compiler (the build script writes both tables from
//! `bindings.rs`).

#![no_std]
#![allow(non_camel_case_types, non_snake_case, non_upper_case_globals)]
#![allow(
    clippy::all,
    clippy::undocumented_unsafe_blocks,
    missing_debug_implementations
)]
#![allow(missing_docs, rustdoc::all)]

mod bindings;

pub use bindings::*;
