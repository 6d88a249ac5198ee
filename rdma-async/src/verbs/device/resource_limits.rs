//! The limits that creating verbs objects runs into, and the errors that name them: the
//! process's locked-memory limit (`RLIMIT_MEMLOCK`, which registered memory counts against) and
//! the device's numbers of memory regions, queue pairs and completion queues
//! (`ibv_query_device`).
//!
//! A bare "Cannot allocate memory" from `ibv_reg_mr` says neither which limit was hit nor how to
//! raise it; these errors say both, and carry a [`ResourceError`] whose short summary a server
//! sends to the client it had to reject (`cm::reject_reason`).

use std::fmt;
use std::io;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use rdma_async_sys as sys;

use super::device_attr::{device_name, query_device};
use super::resource::Resource;
use crate::error;

/// The errno a test asked this creation of `resource` to fail with (`--cfg
/// rdma_async_hooks`); always `None` without it.
pub(crate) fn injected_failure(resource: Resource) -> Option<i32> {
    #[cfg(rdma_async_hooks)]
    return super::fault_injection::injected(resource);
    #[cfg(not(rdma_async_hooks))]
    {
        let _ = resource;
        None
    }
}

/// How many objects of a kind (and, for memory, how many bytes) this process holds through the
/// crate: the error messages say it, so a user sees whether the process itself is the hog.
#[derive(Debug)]
pub(crate) struct LiveCount {
    objects: AtomicUsize,
    bytes: AtomicUsize,
}

impl LiveCount {
    const fn new() -> Self {
        LiveCount {
            objects: AtomicUsize::new(0),
            bytes: AtomicUsize::new(0),
        }
    }

    pub(crate) fn created(&self, bytes: usize) {
        self.objects.fetch_add(1, Ordering::Relaxed);
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub(crate) fn destroyed(&self, bytes: usize) {
        self.objects.fetch_sub(1, Ordering::Relaxed);
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
    }

    fn get(&self) -> (usize, usize) {
        (
            self.objects.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        )
    }
}

/// Memory regions (and their bytes) registered through the crate.
pub(crate) static MEMORY_REGIONS: LiveCount = LiveCount::new();
/// Queue pairs created through the crate.
pub(crate) static QUEUE_PAIRS: LiveCount = LiveCount::new();
/// Completion queues created through the crate.
pub(crate) static COMPLETION_QUEUES: LiveCount = LiveCount::new();

/// `CAP_IPC_LOCK`'s bit in the capability sets of `/proc/self/status`.
const CAP_IPC_LOCK: u32 = 14;

/// The process's locked-memory limit as registration sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Memlock {
    /// The soft `RLIMIT_MEMLOCK` in bytes; `None` when unlimited.
    pub(crate) limit: Option<u64>,
    /// Whether the process has `CAP_IPC_LOCK`, which lets it lock memory beyond the limit.
    pub(crate) exempt: bool,
}

impl Memlock {
    /// The current process's limit and capability.
    pub(crate) fn current() -> Self {
        // SAFETY: rlimit is plain old data; zero is valid for every field.
        let mut rlim: libc::rlimit = unsafe { std::mem::zeroed() };
        // SAFETY: a valid resource and out-pointer.
        let ret = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut rlim) };
        let limit = (ret == 0 && rlim.rlim_cur != libc::RLIM_INFINITY).then_some(rlim.rlim_cur);
        Memlock {
            limit,
            exempt: has_effective_capability(CAP_IPC_LOCK),
        }
    }

    /// The limit, when it applies to this process.
    fn binding(self) -> Option<u64> {
        self.limit.filter(|_| !self.exempt)
    }
}

/// This process's soft `RLIMIT_MEMLOCK` in bytes when it applies to it; `None` when unlimited
/// or lifted by `CAP_IPC_LOCK`.
pub(crate) fn binding_memlock_limit() -> Option<u64> {
    Memlock::current().binding()
}

/// Whether capability `cap` is in the process's effective set (`CapEff` in
/// `/proc/self/status`); `false` when that cannot be read.
fn has_effective_capability(cap: u32) -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|set| set & (1 << cap) != 0)
}

/// What the device allows, for the messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    pub(crate) name: String,
    pub(crate) max_mr: i32,
    pub(crate) max_mr_size: u64,
    pub(crate) max_qp: i32,
    pub(crate) max_qp_wr: i32,
    pub(crate) max_cq: i32,
    pub(crate) max_cqe: i32,
}

impl DeviceLimits {
    /// The limits of the device of `ctx`, or `None` when it cannot be queried.
    pub(crate) fn of(ctx: NonNull<sys::ibv_context>) -> Option<Self> {
        let attr = query_device(ctx).ok()?;
        Some(DeviceLimits {
            name: device_name(ctx),
            max_mr: attr.max_mr,
            max_mr_size: attr.max_mr_size,
            max_qp: attr.max_qp,
            max_qp_wr: attr.max_qp_wr,
            max_cq: attr.max_cq,
            max_cqe: attr.max_cqe,
        })
    }
}

/// A failure to create a verbs object because a limit was reached, inside the `io::Error`:
/// the whole story (which limit, how much was asked, how to raise it) and a one-line summary.
#[derive(Debug)]
pub(crate) struct ResourceError {
    message: String,
    summary: String,
}

impl ResourceError {
    /// The failure in a few words, for a rejected peer.
    pub(crate) fn summary(&self) -> &str {
        &self.summary
    }
}

impl fmt::Display for ResourceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ResourceError {}

fn errno_text(errno: i32) -> String {
    io::Error::from_raw_os_error(errno).to_string()
}

/// Whether an errno from a creation means "out of something" (memory, objects, handles).
fn is_exhaustion(errno: i32) -> bool {
    matches!(
        errno,
        libc::ENOMEM | libc::ENOSPC | libc::EAGAIN | libc::ENOBUFS
    )
}

fn on(device: Option<&DeviceLimits>) -> String {
    device.map_or_else(String::new, |d| format!(" on {}", d.name))
}

/// The error for `ibv_reg_mr` of `len` bytes failing with `errno`.
pub(crate) fn registration_error(
    len: usize,
    errno: i32,
    memlock: Memlock,
    device: Option<&DeviceLimits>,
) -> io::Error {
    let (regions, bytes) = MEMORY_REGIONS.get();
    let held = format!("rdma-async holds {regions} regions of {bytes} bytes in all");
    let call = format!("ibv_reg_mr: {}", errno_text(errno));
    let (kind, message, summary) = match (errno, memlock.binding()) {
        (libc::ENOMEM, Some(limit)) => (
            io::ErrorKind::OutOfMemory,
            format!(
                "cannot register {len} bytes of memory: the locked-memory limit of this process \
                 (RLIMIT_MEMLOCK) is {limit} bytes and registered memory counts against it \
                 ({held}); raise it with `ulimit -l` (memlock in /etc/security/limits.conf), \
                 LimitMEMLOCK= in a systemd unit, or a container's memlock limit (docker run \
                 --ulimit memlock=-1), or give the process CAP_IPC_LOCK ({call})"
            ),
            format!(
                "memory registration of {len} bytes failed (locked-memory limit RLIMIT_MEMLOCK \
                 is {limit} bytes; raise ulimit -l)"
            ),
        ),
        (errno, _) if is_exhaustion(errno) => {
            let limit = device.map_or_else(String::new, |d| {
                format!(
                    "; the device allows {} memory regions (max_mr) of up to {} bytes \
                     (max_mr_size)",
                    d.max_mr, d.max_mr_size
                )
            });
            (
                io::ErrorKind::OutOfMemory,
                format!(
                    "cannot register {len} bytes of memory{}: out of memory or memory \
                     regions{limit}; {held} ({call})",
                    on(device)
                ),
                format!(
                    "memory registration of {len} bytes failed: out of memory or memory \
                     regions{}",
                    device.map_or_else(String::new, |d| format!(" (max_mr {})", d.max_mr))
                ),
            )
        }
        (errno, _) => {
            let message = format!(
                "cannot register {len} bytes of memory{}: {call}",
                on(device)
            );
            return io::Error::new(error::errno_kind(errno), message);
        }
    };
    io::Error::new(kind, ResourceError { message, summary })
}

/// A note on the locked-memory limit for queue and completion queue failures: some devices
/// (mlx5, for one) pin their queues in user memory, which counts against it.
fn memlock_note(errno: i32, memlock: Memlock) -> String {
    match memlock.binding() {
        Some(limit) if errno == libc::ENOMEM => format!(
            "; queue memory counts against the locked-memory limit (RLIMIT_MEMLOCK, {limit} \
             bytes) on some devices"
        ),
        _ => String::new(),
    }
}

/// The error for `rdma_create_qp` failing with `errno`; `send_wr`/`recv_wr` are what it asked.
pub(crate) fn queue_pair_error(
    send_wr: u32,
    recv_wr: u32,
    errno: i32,
    memlock: Memlock,
    device: Option<&DeviceLimits>,
) -> io::Error {
    let (live, _) = QUEUE_PAIRS.get();
    let limit = device.map_or_else(String::new, |d| {
        format!(
            "; the device allows {} queue pairs (max_qp) of up to {} work requests each \
             (max_qp_wr)",
            d.max_qp, d.max_qp_wr
        )
    });
    let asked = format!("{send_wr} send and {recv_wr} receive work requests were asked");
    let call = format!("rdma_create_qp: {}", errno_text(errno));
    if !is_exhaustion(errno) {
        let message = format!(
            "cannot create a queue pair{}: {call} ({asked}{limit})",
            on(device)
        );
        return io::Error::new(error::errno_kind(errno), message);
    }
    let message = format!(
        "cannot create a queue pair{}: out of queue pairs or memory{limit}; rdma-async holds \
         {live} queue pairs, and {asked}{} ({call})",
        on(device),
        memlock_note(errno, memlock)
    );
    let summary = format!(
        "cannot create a queue pair: out of queue pairs or memory{}",
        device.map_or_else(String::new, |d| format!(" (max_qp {})", d.max_qp))
    );
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        ResourceError { message, summary },
    )
}

/// The error for `ibv_create_cq` of `entries` entries failing with `errno`.
pub(crate) fn completion_queue_error(
    entries: u32,
    errno: i32,
    memlock: Memlock,
    device: Option<&DeviceLimits>,
) -> io::Error {
    let (live, _) = COMPLETION_QUEUES.get();
    let limit = device.map_or_else(String::new, |d| {
        format!(
            "; the device allows {} completion queues (max_cq) of up to {} entries each \
             (max_cqe)",
            d.max_cq, d.max_cqe
        )
    });
    let call = format!("ibv_create_cq: {}", errno_text(errno));
    if !is_exhaustion(errno) {
        let message = format!(
            "cannot create a completion queue of {entries} entries{}: {call}{limit}",
            on(device)
        );
        return io::Error::new(error::errno_kind(errno), message);
    }
    let message = format!(
        "cannot create a completion queue of {entries} entries{}: out of completion queues or \
         memory{limit}; rdma-async holds {live} completion queues{} ({call})",
        on(device),
        memlock_note(errno, memlock)
    );
    let summary = format!(
        "cannot create a completion queue: out of completion queues or memory{}",
        device.map_or_else(String::new, |d| format!(" (max_cq {})", d.max_cq))
    );
    io::Error::new(
        io::ErrorKind::OutOfMemory,
        ResourceError { message, summary },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rxe() -> DeviceLimits {
        DeviceLimits {
            name: "rxe0".to_owned(),
            max_mr: 1000,
            max_mr_size: 1 << 40,
            max_qp: 2000,
            max_qp_wr: 4000,
            max_cq: 3000,
            max_cqe: 5000,
        }
    }

    const LIMITED: Memlock = Memlock {
        limit: Some(65536),
        exempt: false,
    };

    fn resource_error(err: &io::Error) -> &ResourceError {
        err.get_ref()
            .and_then(|e| e.downcast_ref::<ResourceError>())
            .unwrap_or_else(|| panic!("no ResourceError in {err:?}"))
    }

    #[test]
    fn enomem_under_a_binding_memlock_limit_names_the_limit_the_size_and_the_fixes() {
        let err = registration_error(131_072, libc::ENOMEM, LIMITED, Some(&rxe()));
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        let text = err.to_string();
        for part in [
            "131072 bytes",
            "RLIMIT_MEMLOCK",
            "65536 bytes",
            "ulimit -l",
            "LimitMEMLOCK=",
            "--ulimit memlock=-1",
            "CAP_IPC_LOCK",
            "Cannot allocate memory",
        ] {
            assert!(text.contains(part), "{part:?} missing from {text}");
        }
        let summary = resource_error(&err).summary();
        assert!(summary.contains("65536"), "{summary}");
        assert!(summary.contains("131072"), "{summary}");
        assert!(summary.len() <= 140, "{} bytes: {summary}", summary.len());
    }

    #[test]
    fn enomem_without_a_binding_limit_names_the_device_limit_instead() {
        for memlock in [
            Memlock {
                limit: None,
                exempt: false,
            },
            Memlock {
                limit: Some(65536),
                exempt: true,
            },
        ] {
            let err = registration_error(4096, libc::ENOMEM, memlock, Some(&rxe()));
            assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
            let text = err.to_string();
            assert!(!text.contains("RLIMIT_MEMLOCK"), "{text}");
            assert!(text.contains("1000 memory regions (max_mr)"), "{text}");
            assert!(text.contains("on rxe0"), "{text}");
        }
    }

    #[test]
    fn other_errnos_keep_their_kind_and_say_the_size() {
        let err = registration_error(4096, libc::EINVAL, LIMITED, None);
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(
            err.to_string().contains("cannot register 4096 bytes"),
            "{err}"
        );
        assert!(
            err.get_ref()
                .unwrap()
                .downcast_ref::<ResourceError>()
                .is_none()
        );
    }

    #[test]
    #[cfg_attr(
        miri,
        ignore = "reads the process's limits with getrlimit, a foreign call Miri cannot run"
    )]
    fn queue_pair_and_completion_queue_errors_name_the_resource_and_the_device_limit() {
        let err = queue_pair_error(384, 384, libc::ENOMEM, LIMITED, Some(&rxe()));
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        let text = err.to_string();
        assert!(text.contains("queue pair"), "{text}");
        assert!(text.contains("2000 queue pairs (max_qp)"), "{text}");
        assert!(text.contains("384 send and 384 receive"), "{text}");
        assert!(text.contains("RLIMIT_MEMLOCK"), "{text}");
        assert!(resource_error(&err).summary().contains("max_qp 2000"));

        let err = completion_queue_error(768, libc::ENOMEM, Memlock::current(), Some(&rxe()));
        assert_eq!(err.kind(), io::ErrorKind::OutOfMemory);
        let text = err.to_string();
        assert!(text.contains("completion queue of 768 entries"), "{text}");
        assert!(text.contains("3000 completion queues (max_cq)"), "{text}");
        assert!(resource_error(&err).summary().contains("max_cq 3000"));

        let err = queue_pair_error(1 << 20, 1, libc::EINVAL, LIMITED, Some(&rxe()));
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(err.to_string().contains("4000 work requests"), "{err}");
    }
}
