//! Links the system libibverbs and librdmacm and compiles the C shim for their `static inline` verbs.
//! The Rust bindings are committed (src/bindings.rs), so no libclang is needed here.

use std::process::exit;

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
    let verbs = probe("libibverbs");
    let rdmacm = probe("librdmacm");

    let mut build = cc::Build::new();
    build
        .file("csrc/shim.c")
        .warnings(true)
        .extra_warnings(true);
    for path in verbs.include_paths.iter().chain(&rdmacm.include_paths) {
        build.include(path);
    }
    build.compile("rdma_async_shim");
}
