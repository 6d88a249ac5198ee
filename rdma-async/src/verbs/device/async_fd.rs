//! Registering channel file descriptors with the Tokio reactor, made non-blocking first.

use std::fmt;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;

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

/// A channel's descriptor together with a reference that keeps the channel, and so the
/// descriptor, open: what one registration of a channel shared by several waiters holds, whatever
/// the kind of channel.
pub(crate) struct ChannelFd {
    fd: RawFd,
    _channel: Arc<dyn Send + Sync>,
}

impl ChannelFd {
    pub(crate) fn new<C: AsRawFd + OwnsFd + Send + Sync + 'static>(channel: Arc<C>) -> Self {
        ChannelFd {
            fd: channel.as_raw_fd(),
            _channel: channel,
        }
    }
}

impl AsRawFd for ChannelFd {
    fn as_raw_fd(&self) -> RawFd {
        self.fd
    }
}

impl fmt::Debug for ChannelFd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChannelFd").field("fd", &self.fd).finish()
    }
}

// SAFETY: `C: OwnsFd` keeps `fd` open and the same for as long as the channel lives, and the
// `Arc` held here keeps the channel alive for as long as this value.
unsafe impl OwnsFd for ChannelFd {}

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
