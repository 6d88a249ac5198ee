//! Counting this process's RDMA resources, for the leak tests. A test that counts must be the
//! only test of its binary: the counts are process-wide.

use std::io;

/// How many RDMA resources of `kind` (`cm_id`, `qp`, `cq`, `mr`, `pd`) this process owns, from
/// `rdma resource show`, which reads the kernel's own accounting. The kernel records the thread
/// that created each resource, so every thread of this process counts; count while the threads
/// that created resources (the runtime's workers) are still alive.
pub fn rdma_resources(kind: &str) -> io::Result<usize> {
    let out = std::process::Command::new("rdma")
        .args(["-j", "resource", "show", kind])
        .output()?;
    if !out.status.success() {
        return Err(io::Error::other(format!(
            "rdma resource show {kind} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    let ours: Vec<String> = std::fs::read_dir("/proc/self/task")?
        .filter_map(|t| t.ok()?.file_name().into_string().ok())
        .collect();
    let text = String::from_utf8_lossy(&out.stdout);
    let owned = text
        .split("\"pid\":")
        .skip(1)
        .filter(|rest| {
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            ours.contains(&pid)
        })
        .count();
    Ok(owned)
}

/// The resource kinds the leak tests count.
pub const LEAK_KINDS: [&str; 4] = ["cm_id", "qp", "mr", "cq"];

/// This process's count of each of [`LEAK_KINDS`] (see [`rdma_resources`]).
pub fn leak_counts() -> Vec<usize> {
    LEAK_KINDS
        .iter()
        .map(|k| rdma_resources(k).expect("rdma resource show"))
        .collect()
}

/// Asserts that this process owns none of [`LEAK_KINDS`]; `when` says at which point.
#[track_caller]
pub fn assert_no_rdma_resources(when: &str) {
    assert_eq!(
        leak_counts(),
        vec![0; LEAK_KINDS.len()],
        "{when}: this process's {LEAK_KINDS:?}"
    );
}

/// Waits until this process's counts of [`LEAK_KINDS`] equal `baseline` and returns them.
/// Dropped streams release their resources from a task once their DISCONNECT is out, so the
/// counts are polled until they settle; callers bound the wait (a guard or a timeout).
pub async fn settled_counts(baseline: &[usize]) -> Vec<usize> {
    let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
    loop {
        tick.tick().await;
        let counts = leak_counts();
        if counts == baseline {
            return counts;
        }
    }
}
