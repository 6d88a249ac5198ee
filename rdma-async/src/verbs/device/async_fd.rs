//! Registering channel file descriptors with the Tokio reactor, made non-blocking first.

use std::io;
use std::os::fd::{AsRawFd, RawFd};

use tokio::io::Interest;
use tokio::io::unix::AsyncFd;

use crate::error;

/// Registers `inner`'s descriptor for read readiness. Both RDMA channel fds are only ever
/// readable, and both are made non-blocking by their owners before this is called.
pub(crate) fn register_readable<T: AsRawFd + OwnsFd>(inner: T) -> io::Result<AsyncFd<T>> {
    // SAFETY: `OwnsFd` guarantees the descriptor returned by `as_raw_fd` stays open and the same
    // for as long as `inner` lives, and the AsyncFd owns `inner`, so it deregisters before the fd
    // can close.
    unsafe { AsyncFd::register_with_interest(inner, Interest::READABLE) }.map_err(io::Error::from)
}

// SAFETY: an `OwnedFd` owns its descriptor and closes it only when dropped.
unsafe impl OwnsFd for std::os::fd::OwnedFd {}

/// Marker for types whose `as_raw_fd` is an fd they own for their whole lifetime.
///
/// # Safety
///
/// Implementors must return the same open descriptor from `as_raw_fd` until they are dropped.
pub(crate) unsafe trait OwnsFd {}

// SAFETY: the channels own their fds (see their impls).
unsafe impl<T: OwnsFd> OwnsFd for std::sync::Arc<T> {}

/// Makes `fd` non-blocking (`O_NONBLOCK`), as a channel's descriptor must be before it is
/// registered.
pub(crate) fn set_nonblocking(fd: RawFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own, with plain integer arguments.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(error::last_error("fcntl(O_NONBLOCK)"));
    }
    Ok(())
}
