//! [`WindowError`]: why binding or invalidating a memory window failed, with the window's
//! region when it may come back.

use std::error::Error;
use std::fmt;
use std::io;

use crate::memory::LocalRegion;

/// The error of [`super::RdmaConnection::bind_window`] or
/// [`super::RdmaConnection::invalidate_window`], with the window's region when the peer can no
/// longer reach it.
///
/// The region is `None` when the window may still be bound over it: the operation did not
/// revoke the window's key and deallocating the window failed too. The region is then leaked
/// (it stays registered and allocated for the rest of the process) rather than handed back to
/// be reused or freed under a key the peer may still hold; the error says so.
#[derive(Debug)]
pub struct WindowError {
    error: io::Error,
    region: Option<LocalRegion>,
}

impl WindowError {
    pub(super) fn new(error: io::Error, region: Option<LocalRegion>) -> Self {
        WindowError { error, region }
    }

    /// The error's kind (that of the `io::Error` it carries).
    pub fn kind(&self) -> io::ErrorKind {
        self.error.kind()
    }

    /// The error, without the region.
    pub fn io_error(&self) -> &io::Error {
        &self.error
    }

    /// The region, when it came back (the peer cannot reach it).
    pub fn region(&self) -> Option<&LocalRegion> {
        self.region.as_ref()
    }

    /// Takes the region, when it came back (the peer cannot reach it).
    pub fn into_region(self) -> Option<LocalRegion> {
        self.region
    }

    /// The error and the region, when it came back.
    pub fn into_parts(self) -> (io::Error, Option<LocalRegion>) {
        (self.error, self.region)
    }
}

impl fmt::Display for WindowError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.error.fmt(f)
    }
}

impl Error for WindowError {
    fn source(&self) -> Option<&(dyn Error + 'static)> {
        self.error.source()
    }
}

/// The error alone; a region that came back with it is dropped (deregistered and freed).
impl From<WindowError> for io::Error {
    fn from(e: WindowError) -> Self {
        e.error
    }
}
