//! Error construction in one place: OS errors from verbs and rdma_cm calls, and CM event failures.
//!
//! Kinds follow what a `TcpStream` user expects (see the crate docs' error table); the message
//! always names the failed call or event, so a log line says what happened without a debugger.

use std::fmt;
use std::io;

/// The `io::ErrorKind` for an errno, with explicit kinds where std's would be `Uncategorized`
/// (which callers cannot match on).
pub(crate) fn errno_kind(errno: i32) -> io::ErrorKind {
    match errno {
        libc::ENODEV | libc::ENXIO => io::ErrorKind::NotFound,
        libc::EPROTO | libc::EREMOTEIO => io::ErrorKind::InvalidData,
        libc::EMSGSIZE => io::ErrorKind::InvalidInput,
        libc::ENOBUFS => io::ErrorKind::OutOfMemory,
        libc::ESHUTDOWN => io::ErrorKind::BrokenPipe,
        libc::EIO => io::ErrorKind::Other,
        _ => io::Error::from_raw_os_error(errno).kind(),
    }
}

/// An error from a named library call, carrying the errno.
#[derive(Debug)]
pub(crate) struct CallError {
    call: &'static str,
    errno: i32,
}

impl fmt::Display for CallError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} failed: {}",
            self.call,
            io::Error::from_raw_os_error(self.errno)
        )
    }
}

impl std::error::Error for CallError {}

/// An error for `call` from an explicit errno.
pub(crate) fn call_error(call: &'static str, errno: i32) -> io::Error {
    io::Error::new(errno_kind(errno), CallError { call, errno })
}

/// An error for `call` from the thread's current `errno`.
pub(crate) fn last_error(call: &'static str) -> io::Error {
    let errno = io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO);
    call_error(call, errno)
}

/// The error after a failed non-blocking call: `WouldBlock` as is (callers wait and retry),
/// anything else named after `call`.
pub(crate) fn last_error_or_would_block(call: &'static str) -> io::Error {
    let err = io::Error::last_os_error();
    if err.kind() == io::ErrorKind::WouldBlock {
        err
    } else {
        call_error(call, err.raw_os_error().unwrap_or(libc::EIO))
    }
}

/// The error for "this machine has no usable RDMA stack or device".
pub(crate) fn no_device(detail: impl fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, format!("no RDMA device: {detail}"))
}

/// Invalid arguments supplied by the caller.
pub(crate) fn invalid_input(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg.into())
}
