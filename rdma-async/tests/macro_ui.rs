//! Tests for `#[rdma_async::test]` and `#[rdma_async::main]`, and for what the
//! type system rules out in `rdma_async::rdma`.
//!
//! - `ui`: compile errors, checked with trybuild against the `.stderr` files in
//!   `tests/ui` (regenerate with `TRYBUILD=overwrite`), on the rustc that wrote them
//!   (ignored on others, see `ui`): the macros' diagnostics,
//!   and misuse of registered regions (touching one while an operation owns it,
//!   a view kept across an operation, a reference into peer-writable memory,
//!   non-byte registrations, outside implementations of `RegisteredBytes`, an
//!   operation outliving its connection).
//! - `ui_test_hooks`, the cases in `ui/test_hooks` (with the test hooks,
//!   `--cfg rdma_async_hooks`, which name internal types): posting on a
//!   queue pair of the wrong kind.
//! - The `#[rdma_async::test]` functions below are compiled as real tests,
//!   which type-checks the expansion (trybuild builds its files without
//!   `--test`, where test functions are stripped before type checking).
//! - `device_gate`: runs `device_probe` in a child process to check what a
//!   test does without a device, with and without
//!   `RDMA_ASYNC_REQUIRE_DEVICE=1`.

use std::process::{Command, Output};

/// The rustc whose diagnostics the `.stderr` files hold: on another one the compile-fail tests
/// are reported ignored, and `scripts/test` runs them on this one (it reads the version from
/// the attribute below). After moving to a newer rustc: `TRYBUILD=overwrite`, review the diff.
#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files are rustc 1.95's; scripts/test runs this test on 1.95"
)]
#[test]
fn ui() {
    let cases = trybuild::TestCases::new();
    cases.compile_fail("tests/ui/fail_*.rs");
    cases.pass("tests/ui/pass_*.rs");
}

/// The cases that name internal types: built where the workspace's `.cargo/config.toml` sets
/// `--cfg rdma_async_hooks` (it also hands it to trybuild's own build, through `[env]`).
#[cfg(rdma_async_hooks)]
#[rustversion::attr(
    not(stable(1.95)),
    ignore = "the .stderr files are rustc 1.95's; scripts/test runs this test on 1.95"
)]
#[test]
fn ui_test_hooks() {
    trybuild::TestCases::new().compile_fail("tests/ui/test_hooks/fail_*.rs");
}

#[rdma_async::test]
async fn device_probe() {
    rdma_async::__private::tokio::task::yield_now().await;
}

#[rdma_async::test]
async fn returns_io_result() -> std::io::Result<()> {
    // `?` must infer the error type from the declared return type.
    std::env::current_dir()?;
    Ok(())
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_thread_boxed_error() -> Result<(), Box<dyn std::error::Error>> {
    use rdma_async::__private::tokio::runtime::{Handle, RuntimeFlavor};
    assert_eq!(
        Handle::current().runtime_flavor(),
        RuntimeFlavor::MultiThread
    );
    let parsed: u32 = "7".parse()?;
    if parsed != 7 {
        return Err("unexpected value".into());
    }
    Ok(())
}

/// Runs `device_probe` alone in a child process of this test binary.
fn run_probe(require_device: bool) -> Output {
    let mut command = Command::new(std::env::current_exe().expect("test binary path"));
    command.args(["device_probe", "--exact", "--nocapture", "--test-threads=1"]);
    if require_device {
        command.env("RDMA_ASYNC_REQUIRE_DEVICE", "1");
    } else {
        command.env_remove("RDMA_ASYNC_REQUIRE_DEVICE");
    }
    command.output().expect("failed to run the test binary")
}

#[test]
fn device_gate() {
    let skip_line_end = format!(" \u{2014} {}::device_probe", module_path!());
    match rdma_async::__private::rdma_device_check() {
        Err(reason) => {
            // No device: the probe passes with exactly one skip line...
            let skipped = run_probe(false);
            let stderr = String::from_utf8_lossy(&skipped.stderr);
            assert!(skipped.status.success(), "skipped probe failed: {stderr}");
            let expected = format!("skipped: no RDMA device ({reason}){skip_line_end}");
            let lines: Vec<&str> = stderr
                .lines()
                .filter(|l| l.starts_with("skipped:"))
                .collect();
            assert_eq!(lines, [expected.as_str()], "stderr: {stderr}");

            // ...unless the environment demands a device.
            let required = run_probe(true);
            let output = String::from_utf8_lossy(&required.stdout).into_owned()
                + &String::from_utf8_lossy(&required.stderr);
            assert!(
                !required.status.success(),
                "required probe passed: {output}"
            );
            let expected = format!("RDMA device required for test `device_probe` but {reason}");
            assert!(output.contains(&expected), "output: {output}");
            assert!(!output.contains("skipped:"), "output: {output}");
        }
        Ok(()) => {
            // A device is present: the body runs even when one is required.
            let ran = run_probe(true);
            let stderr = String::from_utf8_lossy(&ran.stderr);
            assert!(ran.status.success(), "probe failed: {stderr}");
            assert!(!stderr.contains("skipped:"), "stderr: {stderr}");
        }
    }
}
