//! Links the system libibverbs and librdmacm and compiles the C shim for their `static inline` verbs.
//! The Rust bindings are committed (src/bindings.rs), so no libclang is needed here. Also writes the
//! layout check's tables (build/layout.rs), which `tests/layout.rs` compares on the target.

use std::path::PathBuf;
use std::process::exit;

#[path = "build/layout.rs"]
mod layout;

const INSTALL_HINT: &str = "install the RDMA development packages, e.g. on Debian/Ubuntu: \
     `apt-get install libibverbs-dev librdmacm-dev pkg-config` (Fedora/RHEL: `dnf install rdma-core-devel pkgconf`)";

fn probe(name: &str) -> pkg_config::Library {
    match pkg_config::Config::new().probe(name) {
        Ok(lib) => lib,
        Err(err) => {
            // A panic backtrace would bury the one line the user needs.
            eprintln!("error: rdma-async-sys could not find `{name}` through pkg-config: {err}");
            eprintln!("error: {INSTALL_HINT}");
            println!(
                "cargo:warning=rdma-async-sys: `{name}` not found by pkg-config; {INSTALL_HINT}"
            );
            exit(1);
        }
    }
}

fn main() {
    println!("cargo:rerun-if-changed=csrc/shim.c");
    println!("cargo:rerun-if-env-changed=DOCS_RS");
    if std::env::var_os("DOCS_RS").is_some() {
        // docs.rs has no rdma-core; documentation needs only the committed bindings.
        return;
    }
    println!("cargo:rerun-if-changed=csrc/shim.h");
    println!("cargo:rerun-if-changed=csrc/wrapper.h");
    println!("cargo:rerun-if-changed=src/bindings.rs");
    println!("cargo:rerun-if-changed=build/layout.rs");
    let verbs = probe("libibverbs");
    let rdmacm = probe("librdmacm");

    // The C side of the layout check, compiled with the shim. An object of its own in the archive:
    // only the layout test refers to its table, so nothing else links it.
    let out_dir = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bindings = std::fs::read_to_string("src/bindings.rs").expect("src/bindings.rs is readable");
    let tables = layout::tables(&bindings);
    let layout_c = out_dir.join("layout.c");
    std::fs::write(&layout_c, tables.c).expect("OUT_DIR is writable");
    std::fs::write(out_dir.join("layout.rs"), tables.rust).expect("OUT_DIR is writable");

    let mut build = cc::Build::new();
    build
        .file("csrc/shim.c")
        .file(&layout_c)
        .include("csrc")
        .warnings(true)
        .extra_warnings(true);
    for path in verbs.include_paths.iter().chain(&rdmacm.include_paths) {
        build.include(path);
    }
    build.compile("rdma_async_shim");
}
