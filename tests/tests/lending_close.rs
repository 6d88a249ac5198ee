//! Closing streams whose receive rings lend their halves (`zero_copy_reads`) revokes the rings'
//! memory windows before their queue pairs are destroyed. A type 2 window bound through a
//! queue pair holds a reference to it: Soft-RoCE's `ibv_destroy_qp` then blocked the thread
//! that dropped the stream for about 50 s and gave up with a kernel warning
//! (`__rxe_cleanup`, from `rxe_destroy_qp`). The test looks for that warning from its own
//! thread in the kernel log, so it holds whatever the machine's speed. Its own binary: it
//! waits for this process's RDMA resources to settle.

use std::process::Command;

use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{guard, leak_counts, settled_counts, stream_pair};
use tokio::io::AsyncWriteExt;

/// Each receive ring: two halves of 32 KiB.
const HALF: usize = 32 << 10;

/// This thread's id, as the kernel log names the task in a warning ("PID: N").
fn this_thread_id() -> String {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    let id = link.file_name().expect("a thread id").to_string_lossy();
    id.into_owned()
}

/// The kernel log's warnings raised by the task `thread`.
fn kernel_warnings_of(thread: &str) -> Vec<String> {
    let out = Command::new("dmesg").output().expect("dmesg runs");
    assert!(
        out.status.success(),
        "dmesg failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let pid = format!(" PID: {thread} ");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|line| line.contains("WARNING:") && line.contains(&pid))
        .map(str::to_owned)
        .collect()
}

/// Writes `data` on `from` and reads it on `to` through lent halves (`read_lent`), so that the
/// halves are granted again through their windows.
async fn transfer(from: &mut RStream, to: &mut RStream, data: &[u8]) {
    let reading = async {
        let mut got = Vec::with_capacity(data.len());
        while got.len() < data.len() {
            let bytes = to.read_lent(HALF).await.unwrap();
            assert!(!bytes.is_empty(), "EOF after {} bytes", got.len());
            got.extend_from_slice(&bytes);
        }
        got
    };
    let (wrote, got) = guard("the transfer", async {
        tokio::join!(from.write_all(data), reading)
    })
    .await;
    wrote.unwrap();
    assert!(got == data, "the stream differs from what was written");
}

// A current-thread runtime: the streams are dropped, and their queue pairs destroyed, on this
// thread, whose id the warning would carry.
#[rdma_async::test]
async fn closing_lending_streams_revokes_their_windows_before_destroying_the_queue_pairs() {
    let thread = this_thread_id();
    let baseline = leak_counts();
    let options = RStreamOptions::new()
        .recv_buffer_size(2 * HALF as u32)
        .zero_copy_reads(true);
    let (mut server, mut client) = stream_pair(options).await;
    // Four rings' worth each way: every half is granted again, through its window, and the
    // windows are bound when the streams close.
    let data = pattern(11, 8 * HALF);
    transfer(&mut client, &mut server, &data).await;
    transfer(&mut server, &mut client, &data).await;
    let stats = server.stats();
    assert!(stats.lent_bytes > 0, "no half was lent: {stats:?}");
    // The writer first, as a client that leaves: the reader's queue pair is destroyed with its
    // windows still bound over halves its peer was granted.
    drop(client);
    drop(server);
    guard("the streams' resources released", settled_counts(&baseline)).await;
    let warnings = kernel_warnings_of(&thread);
    assert!(
        warnings.is_empty(),
        "destroying the queue pairs raised kernel warnings: {warnings:?}"
    );
}
