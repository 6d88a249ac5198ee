//! Procedural macros for [`rdma-async`](https://docs.rs/rdma-async).
//!
//! Do not depend on this crate directly. Its attributes are re-exported by
//! `rdma-async` and are meant to be written as
//!
//! - `#[rdma_async::test]`: an async test that is skipped (not failed) on
//!   machines without a usable RDMA device, and
//! - `#[rdma_async::main]`: an async `main` running on a Tokio runtime.
//!
//! The code they generate refers to items in `rdma_async::__private` (the
//! re-exported `tokio` and the device probe), so it only compiles in a crate
//! that depends on `rdma-async`. If that dependency is renamed, pass the new
//! path with `crate = "..."`.
//!
//! ```ignore
//! #[rdma_async::test]
//! async fn loopback_write() -> std::io::Result<()> {
//!     // Runs inside a current-thread Tokio runtime, and only when an RDMA
//!     // device is present; otherwise the test prints one `skipped:` line to
//!     // stderr and passes.
//!     Ok(())
//! }
//!
//! #[rdma_async::main(flavor = "multi_thread", worker_threads = 2)]
//! async fn main() {}
//! ```

mod entry;

use entry::{Kind, Runtimes};
use proc_macro::TokenStream;

/// Marks an `async fn` as a test that needs an RDMA device.
///
/// Use it as `#[rdma_async::test]`; this crate is only its implementation.
///
/// The function must be `async`, take no arguments and return `()` or a
/// `Result<(), E>` (any path ending in `Result`, such as `std::io::Result<()>`
/// or `anyhow::Result<()>`, is accepted). It becomes an ordinary `#[test]`
/// that does the following:
///
/// 1. Calls `rdma_async::__private::rdma_device_check()`. If no RDMA device is
///    usable, the test either
///    - prints `skipped: no RDMA device (<reason>) — <module>::<name>` to
///      stderr and returns `()` / `Ok(())`, so it passes (the line goes
///      straight to the process's stderr, so the harness's output capture
///      does not hide it), or
///    - panics with ``RDMA device required for test `<name>` but <reason>``
///      when `require_device = true` is given or the environment variable
///      `RDMA_ASYNC_REQUIRE_DEVICE=1` is set (as it should be on machines
///      that are supposed to have hardware, so that tests cannot silently
///      skip there).
/// 2. Otherwise builds a Tokio runtime and blocks on the function body.
///
/// A skipped test is reported by the test harness as passed. A test that
/// also carries `#[should_panic]` fails when it is skipped, because nothing
/// panicked.
///
/// # Arguments
///
/// | argument | values | default |
/// | --- | --- | --- |
/// | `flavor` | `"current_thread"`, `"multi_thread"` | `"current_thread"` |
/// | `worker_threads` | a positive integer; only with `flavor = "multi_thread"` | Tokio's default (one per core) |
/// | `require_device` | `true`, `false` | `false` |
/// | `crate` | a path to `rdma_async`, as a string | `"::rdma_async"` |
///
/// # Examples
///
/// ```ignore
/// #[rdma_async::test]
/// async fn opens_a_device() {
///     // ...
/// }
///
/// #[rdma_async::test(flavor = "multi_thread", worker_threads = 2, require_device = true)]
/// async fn many_queue_pairs() -> Result<(), Box<dyn std::error::Error>> {
///     // ...
///     Ok(())
/// }
/// ```
///
/// With a renamed dependency (`rdma = { package = "rdma-async", ... }`):
///
/// ```ignore
/// #[rdma::test(crate = "rdma")]
/// async fn renamed() {}
/// ```
///
/// # Errors
///
/// Misuse is reported at compile time, pointing at the offending token: a
/// missing `async`, function arguments, an unsupported return type, unknown or
/// repeated arguments, `worker_threads` without the multi-thread flavor, and
/// a second test attribute (such as `#[test]`) on the same function.
#[proc_macro_attribute]
pub fn test(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Test, Runtimes::All, args, item)
}

/// `#[rdma_async::test]` where rdma-async's `rt-multi-thread` feature is off: the same, except
/// that `flavor = "multi_thread"` is a compile error that names the feature.
#[doc(hidden)]
#[proc_macro_attribute]
pub fn test_rt(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Test, Runtimes::CurrentThreadOnly, args, item)
}

/// Runs an `async fn main` on a Tokio runtime.
///
/// Use it as `#[rdma_async::main]`; this crate is only its implementation.
/// It works like `#[tokio::main]`, with its defaults (a multi-thread
/// runtime), but goes through the Tokio that `rdma-async` depends on, so
/// users need no direct `tokio` dependency. No RDMA device check is made.
/// The multi-thread runtime needs rdma-async's `rt-multi-thread` feature,
/// on by default; without it, `flavor = "current_thread"` must be given.
///
/// # Arguments
///
/// | argument | values | default |
/// | --- | --- | --- |
/// | `flavor` | `"current_thread"`, `"multi_thread"` | `"multi_thread"` |
/// | `worker_threads` | a positive integer; only with the multi-thread flavor | Tokio's default (one per core) |
/// | `crate` | a path to `rdma_async`, as a string | `"::rdma_async"` |
///
/// # Examples
///
/// ```ignore
/// #[rdma_async::main(flavor = "multi_thread", worker_threads = 4)]
/// async fn main() -> Result<(), Box<dyn std::error::Error>> {
///     // ...
///     Ok(())
/// }
/// ```
///
/// # Errors
///
/// A missing `async`, arguments to `main`, and unknown, repeated or
/// inconsistent arguments are compile errors.
#[proc_macro_attribute]
pub fn main(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Main, Runtimes::All, args, item)
}

/// `#[rdma_async::main]` where rdma-async's `rt-multi-thread` feature is off: the multi-thread
/// flavor, `main`'s default, is a compile error that names the feature, so
/// `flavor = "current_thread"` must be given.
#[doc(hidden)]
#[proc_macro_attribute]
pub fn main_rt(args: TokenStream, item: TokenStream) -> TokenStream {
    expand(Kind::Main, Runtimes::CurrentThreadOnly, args, item)
}

/// The four attributes' one body: `proc_macro` tokens in and out of [`entry::expand`].
fn expand(kind: Kind, runtimes: Runtimes, args: TokenStream, item: TokenStream) -> TokenStream {
    entry::expand(kind, runtimes, args.into(), item.into()).into()
}
