//! What tests do to a connected [`RStream`]: one echo round trip, and filling the peer's ring
//! until the writer is blocked on credits.

use std::io;
use std::time::Duration;

use rdma_async::stream::RStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Writes `msg` to an echoing peer and reads it back, asserting the echo is `msg`.
pub async fn echo_once(stream: &mut RStream, msg: &[u8]) -> io::Result<()> {
    stream.write_all(msg).await?;
    let mut back = vec![0; msg.len()];
    stream.read_exact(&mut back).await?;
    assert_eq!(back, msg, "echo of {} bytes", msg.len());
    Ok(())
}

/// Writes `chunk`-byte pieces until the peer's credits run out and every signaled send has
/// completed; returns the bytes written. The writer is then blocked with nothing in flight, the
/// case where no transport retry can notice a dead peer by itself. A chunk of half the peer's
/// receive ring makes every write signaled (and an unsignaled credit update is done once a later
/// send's completion is in). Unbounded: the caller puts it under a guard.
pub async fn fill_until_blocked(stream: &RStream, chunk: usize) -> usize {
    let chunk = vec![0xa5u8; chunk];
    let mut written = 0;
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    loop {
        match stream.try_write(&chunk) {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let stats = stream.stats();
                if stats.send_completions == stats.signaled_sends {
                    return written;
                }
                tick.tick().await;
            }
            Err(e) => panic!("writing to a live peer failed: {e}"),
        }
    }
}
