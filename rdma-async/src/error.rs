//! Errors the crate returns inside `io::Error`, and their construction in one place.
//!
//! Kinds follow what a `TcpStream` user expects (see the crate docs' error table); the message
//! always names the failed call or event, so a log line says what happened without a debugger.
//!
//! Two payloads say more than the kind: [`crate::cm::CmError`] (a connection-management event,
//! with a rejecting peer's private data) and [`CompletionError`] (a work request that completed
//! with an error status). A connection remembers its first failure and reports it again to every
//! later operation as a [`EarlierFailure`], whose [`std::error::Error::source`] is that payload;
//! [`cause`] finds a payload either way.

use std::fmt;
use std::io;
use std::sync::{Arc, OnceLock};

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

/// A work request that completed with an error status (`ibv_wc_status` other than
/// `IBV_WC_SUCCESS`), inside the `io::Error` of the operation that saw it.
///
/// Get it with [`cause`], or with `err.get_ref().and_then(|e| e.downcast_ref::<CompletionError>())`
/// on the first report.
#[derive(Debug, Clone)]
pub struct CompletionError {
    status: u32,
    vendor_err: u32,
    message: String,
}

impl CompletionError {
    /// The failure of a work completion with `status` and `vendor_err`, told as `message`.
    pub(crate) fn new(status: u32, vendor_err: u32, message: String) -> Self {
        CompletionError {
            status,
            vendor_err,
            message,
        }
    }

    /// The work completion's status, an `ibv_wc_status` value (e.g. 12,
    /// `IBV_WC_RETRY_EXC_ERR`).
    pub fn status(&self) -> u32 {
        self.status
    }

    /// The provider's vendor error code for the failure.
    pub fn vendor_err(&self) -> u32 {
        self.vendor_err
    }
}

impl fmt::Display for CompletionError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CompletionError {}

/// A connection's (or socket's) first failure, reported again to a later operation.
///
/// Its kind and message are those of the first failure (with what refused, when one says so);
/// [`Self::first`] is that failure whole, and [`std::error::Error::source`] is its payload
/// (a [`crate::cm::CmError`] or a [`CompletionError`]).
#[derive(Debug, Clone)]
pub struct EarlierFailure {
    /// What the later operation was and what happened to it, e.g. "receive refused".
    context: Option<String>,
    first: Arc<io::Error>,
}

impl EarlierFailure {
    /// The first failure, as it was reported first.
    pub fn first(&self) -> &io::Error {
        &self.first
    }
}

impl fmt::Display for EarlierFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.context {
            Some(context) => write!(
                f,
                "{context}: the connection failed earlier ({})",
                self.first
            ),
            None => write!(f, "{}", self.first),
        }
    }
}

impl std::error::Error for EarlierFailure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        // The payload itself: `io::Error::source` would skip it and return the payload's source.
        self.first
            .get_ref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

/// Finds a payload of type `T` (such as [`crate::cm::CmError`] or [`CompletionError`]) in an
/// error this crate returned: the error's own payload, or a cause behind it (the first failure
/// behind an [`EarlierFailure`]).
pub fn cause<T: std::error::Error + 'static>(err: &io::Error) -> Option<&T> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = err
        .get_ref()
        .map(|e| e as &(dyn std::error::Error + 'static));
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// The first failure of a connection or socket: set once, then reported to every operation
/// that asks, each report leading back to the cause. Safe to share; the first `set` wins.
#[derive(Debug, Default)]
pub(crate) struct StickyError {
    first: OnceLock<Arc<io::Error>>,
}

impl StickyError {
    /// Records `err` unless a failure is recorded already; returns whether it was.
    pub(crate) fn set(&self, err: io::Error) -> bool {
        self.try_set(err).is_ok()
    }

    /// Records `err` as the first failure, or gives it back when one is recorded already.
    fn try_set(&self, err: io::Error) -> Result<(), io::Error> {
        let mut err = Some(err);
        self.first
            .get_or_init(|| Arc::new(err.take().unwrap_or_else(|| io::Error::other(""))));
        err.map_or(Ok(()), Err)
    }

    /// Records `err` if it is the first failure and returns what to report for it now: a report
    /// of the recorded failure, or `err` itself when another failure came first.
    pub(crate) fn record(&self, err: io::Error) -> io::Error {
        match self.try_set(err) {
            Ok(()) => self
                .report()
                .unwrap_or_else(|| io::Error::other("no failure recorded")),
            Err(err) => err,
        }
    }

    /// Whether a failure is recorded.
    pub(crate) fn is_set(&self) -> bool {
        self.first.get().is_some()
    }

    /// The recorded failure again: its kind and message, with the cause behind it.
    pub(crate) fn report(&self) -> Option<io::Error> {
        self.report_inner(None)
    }

    /// The recorded failure again, for an operation it ended: "`context`: the connection failed
    /// earlier (first failure)".
    /// Nothing is made (no allocation) while no failure is recorded: callers ask per operation.
    pub(crate) fn report_as(&self, context: impl Into<String>) -> Option<io::Error> {
        if !self.is_set() {
            return None;
        }
        self.report_inner(Some(context.into()))
    }

    fn report_inner(&self, context: Option<String>) -> Option<io::Error> {
        let first = self.first.get()?;
        Some(io::Error::new(
            first.kind(),
            EarlierFailure {
                context,
                first: first.clone(),
            },
        ))
    }
}
