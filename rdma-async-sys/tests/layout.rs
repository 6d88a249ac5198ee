//! The bindings' layout against the C compiler's, on the target the test runs on: the size and
//! alignment of every complete struct and union in `src/bindings.rs`, and the offset and size of
//! each of their fields. The committed bindings were generated on x86_64 Linux; this test is what
//! shows they are right on another 64-bit Linux target (aarch64 under qemu-user in
//! `scripts/cross-aarch64`). Both tables come from the build script (`build/layout.rs`).

use libc::{pthread_cond_t, pthread_mutex_t, sockaddr, socklen_t, timespec};
use rdma_async_sys::*;

include!(concat!(env!("OUT_DIR"), "/layout.rs"));

/// One entry of the C table (`layout.c` in the build script's output).
#[repr(C)]
struct CEntry {
    what: *const libc::c_char,
    value: usize,
}

unsafe extern "C" {
    static rdma_async_layout: [CEntry; 0];
    static rdma_async_layout_len: usize;
}

/// The C compiler's table: what each entry measures, and its value.
fn c_layout() -> Vec<(String, usize)> {
    // SAFETY: the shim defines it as a `const size_t`; nothing writes it.
    let len = unsafe { rdma_async_layout_len };
    // SAFETY: the shim defines `rdma_async_layout` as a const array of `len` entries of this
    // layout; nothing writes it.
    let entries = unsafe {
        std::slice::from_raw_parts(std::ptr::addr_of!(rdma_async_layout).cast::<CEntry>(), len)
    };
    entries
        .iter()
        .map(|e| {
            // SAFETY: each `what` is a NUL-terminated string literal of the shim.
            let what = unsafe { std::ffi::CStr::from_ptr(e.what) };
            (what.to_string_lossy().into_owned(), e.value)
        })
        .collect()
}

#[test]
fn every_size_alignment_and_offset_matches_the_c_compiler() {
    let c = c_layout();
    assert_eq!(
        c.len(),
        RUST_LAYOUT.len(),
        "the two tables come from one list"
    );
    // Every type the library uses through these bindings is among them.
    for ty in [
        "ibv_qp",
        "ibv_cq",
        "ibv_srq",
        "ibv_wc",
        "ibv_send_wr",
        "rdma_cm_id",
    ] {
        let what = format!("size_of {ty}");
        assert!(
            RUST_LAYOUT.iter().any(|(w, _)| *w == what),
            "{ty} is not checked"
        );
    }
    let mismatches: Vec<String> = c
        .iter()
        .zip(RUST_LAYOUT)
        .filter(|((c_what, c_value), (what, value))| c_what != what || c_value != value)
        .map(|((c_what, c_value), (what, value))| {
            format!("{what}: Rust {value}, C ({c_what}) {c_value}")
        })
        .collect();
    assert!(
        mismatches.is_empty(),
        "{} of {} layout entries differ from the C compiler's:\n{}",
        mismatches.len(),
        c.len(),
        mismatches.join("\n")
    );
}
