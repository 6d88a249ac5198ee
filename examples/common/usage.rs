//! What the kernel accounts to a process, shared by the examples that report their cost.

use std::io;
use std::time::Duration;

use nix::sys::resource::{UsageWho, getrusage};
use nix::sys::time::TimeVal;

/// What the kernel accounts to this process: CPU time (user and system) and context switches
/// (voluntary and involuntary) of all its threads, those that have ended included.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu: Duration,
    pub switches: u64,
}

impl Usage {
    pub fn now() -> io::Result<Usage> {
        // RUSAGE_SELF sums every thread of the process: the figures are the process's cost,
        // whichever runtime flavour ran the work.
        let usage = getrusage(UsageWho::RUSAGE_SELF).map_err(io::Error::from)?;
        Ok(Usage {
            cpu: duration(usage.user_time()) + duration(usage.system_time()),
            switches: non_negative(usage.voluntary_context_switches())
                + non_negative(usage.involuntary_context_switches()),
        })
    }
}

/// A `timeval` the kernel filled (never negative) as a `Duration`.
fn duration(t: TimeVal) -> Duration {
    Duration::from_secs(non_negative(t.tv_sec())) + Duration::from_micros(non_negative(t.tv_usec()))
}

/// A C `long` or `time_t` the kernel filled with a count, which is never negative.
fn non_negative<T: TryInto<u64>>(n: T) -> u64 {
    n.try_into().unwrap_or(0)
}
