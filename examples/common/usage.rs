//! What the kernel accounts to a process, shared by the examples that report their cost.

use std::io;
use std::time::Duration;

/// What the kernel accounts to this process: CPU time and context switches of all its threads.
#[derive(Debug, Clone, Copy)]
pub struct Usage {
    pub cpu: Duration,
    pub switches: u64,
}

impl Usage {
    pub fn now() -> io::Result<Usage> {
        // /proc/self/stat fields 14 and 15: user and system time of the whole process, in clock
        // ticks (100 per second on Linux's default USER_HZ).
        let stat = std::fs::read_to_string("/proc/self/stat")?;
        let after_name = stat.rsplit(')').next().unwrap_or_default();
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        let ticks = |i: usize| {
            fields
                .get(i)
                .and_then(|f| f.parse::<u64>().ok())
                .unwrap_or(0)
        };
        // Counted from field 3 (the state) as index 0.
        let cpu_ticks = ticks(11) + ticks(12);
        let mut switches = 0;
        for task in std::fs::read_dir("/proc/self/task")? {
            let status = std::fs::read_to_string(task?.path().join("status")).unwrap_or_default();
            for line in status.lines() {
                if let Some(v) = line
                    .strip_prefix("voluntary_ctxt_switches:")
                    .or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:"))
                {
                    switches += v.trim().parse::<u64>().unwrap_or(0);
                }
            }
        }
        Ok(Usage {
            cpu: Duration::from_millis(cpu_ticks * 10),
            switches,
        })
    }
}
