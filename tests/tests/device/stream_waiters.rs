//! Several tasks awaiting `readable()` or `writable()` on one stream (or one half) are all woken,
//! as with `TcpStream`, and a waiter that goes away does not take the others' wake-up with it.
//! The stream counts what its writers waited for.

use std::future::{Future, poll_fn};
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::task::Poll;

use rdma_async::stream::RStreamOptions;
use rdma_async_device_tests::{guard, stream_pair};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// Runs `fut` on a task of its own and returns once that task has polled it once and found it
/// pending (so it waits when the test goes on).
async fn spawn_waiting<F>(what: &str, fut: F) -> JoinHandle<F::Output>
where
    F: Future + Send + 'static,
    F::Output: Send + 'static,
{
    let (pending_tx, pending_rx) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut fut = pin!(fut);
        match poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await {
            Poll::Ready(out) => {
                let _ = pending_tx.send(false);
                out
            }
            Poll::Pending => {
                let _ = pending_tx.send(true);
                fut.await
            }
        }
    });
    let pending = guard(what, pending_rx).await.expect("waiter task");
    assert!(pending, "{what}: ready before anything arrived");
    task
}

/// Writes 1-byte messages with `try_write` (a stream's or a write half's) until it would block:
/// the peer, which does not read, runs out of credits (one per message) long before its ring
/// fills.
fn fill_until_blocked(try_write: impl Fn(&[u8]) -> io::Result<usize>) -> usize {
    let mut written = 0;
    loop {
        match try_write(b"x") {
            Ok(n) => written += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return written,
            Err(e) => panic!("try_write: {e}"),
        }
    }
}

/// Reads exactly `len` bytes from `stream`: what the test wrote, which returns the credits.
async fn read_written(stream: &mut (impl AsyncRead + Unpin), len: usize) -> Vec<u8> {
    let mut got = vec![0u8; len];
    guard("read what was written", stream.read_exact(&mut got))
        .await
        .unwrap();
    got
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_awaiting_readable_are_both_woken() {
    let (a, b) = stream_pair(RStreamOptions::new()).await;
    let (a, mut b) = (Arc::new(a), b);
    let first = spawn_waiting("first readable", {
        let a = a.clone();
        async move { a.readable().await }
    })
    .await;
    let second = spawn_waiting("second readable", {
        let a = a.clone();
        async move { a.readable().await }
    })
    .await;
    b.write_all(b"wake up").await.unwrap();
    guard("first readable", first).await.unwrap().unwrap();
    guard("second readable", second).await.unwrap().unwrap();
    let mut buf = [0u8; 16];
    assert_eq!(a.try_read(&mut buf).unwrap(), 7);
    assert_eq!(&buf[..7], b"wake up");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_readable_waiter_leaves_the_other_woken() {
    let (a, mut b) = stream_pair(RStreamOptions::new()).await;
    let a = Arc::new(a);
    let stays = spawn_waiting("staying readable", {
        let a = a.clone();
        async move { a.readable().await }
    })
    .await;
    // The last to wait goes away before anything arrives.
    let leaves = spawn_waiting("leaving readable", {
        let a = a.clone();
        async move { a.readable().await }
    })
    .await;
    leaves.abort();
    assert!(
        guard("aborted waiter", leaves)
            .await
            .unwrap_err()
            .is_cancelled()
    );
    b.write_all(b"still here").await.unwrap();
    guard("staying readable", stays).await.unwrap().unwrap();
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_awaiting_writable_are_both_woken_when_credits_return() {
    let (mut a, b) = stream_pair(RStreamOptions::new()).await;
    let b = Arc::new(b);
    let written = fill_until_blocked(|buf| b.try_write(buf));
    assert!(written > 0);
    let first = spawn_waiting("first writable", {
        let b = b.clone();
        async move { b.writable().await }
    })
    .await;
    let second = spawn_waiting("second writable", {
        let b = b.clone();
        async move { b.writable().await }
    })
    .await;
    // Reading returns the credits.
    read_written(&mut a, written).await;
    guard("first writable", first).await.unwrap().unwrap();
    guard("second writable", second).await.unwrap().unwrap();
    assert!(b.try_write(b"y").unwrap() > 0);
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_tasks_awaiting_each_owned_half_are_both_woken() {
    let (a, mut b) = stream_pair(RStreamOptions::new()).await;
    let (rd, wr) = a.into_split();
    let (rd, wr) = (Arc::new(rd), Arc::new(wr));
    let mut readers = Vec::new();
    for what in ["first readable half", "second readable half"] {
        let rd = rd.clone();
        readers.push(spawn_waiting(what, async move { rd.readable().await }).await);
    }
    b.write_all(b"both").await.unwrap();
    for reader in readers {
        guard("readable half", reader).await.unwrap().unwrap();
    }

    let written = fill_until_blocked(|buf| wr.try_write(buf));
    assert!(written > 0);
    let mut writers = Vec::new();
    for what in ["first writable half", "second writable half"] {
        let wr = wr.clone();
        writers.push(spawn_waiting(what, async move { wr.writable().await }).await);
    }
    read_written(&mut b, written).await;
    for writer in writers {
        guard("writable half", writer).await.unwrap().unwrap();
    }
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn writers_out_of_the_peers_credits_are_counted_as_waiting_for_the_peer() {
    // A send queue deeper than the peer's credits, so credits run out first.
    let (mut a, b) = stream_pair(RStreamOptions::new().sq_size(1024)).await;
    let (rd, mut wr) = b.into_split();
    wr.write_all(b"room").await.unwrap();
    assert_eq!(read_written(&mut a, 4).await, b"room");
    let written = fill_until_blocked(|buf| wr.try_write(buf));
    let before = rd.stats();
    assert_eq!(
        (before.writer_waits_for_peer, before.writer_waits_for_sends),
        (0, 0),
        "writes that found room, and try_write, never wait: {before:?}"
    );

    // `writable()` waits.
    let wr = Arc::new(wr);
    let waiter = spawn_waiting("writable, out of credits", {
        let wr = wr.clone();
        async move { wr.writable().await }
    })
    .await;
    let waiting = rd.stats();
    assert_eq!(
        (
            waiting.writer_waits_for_peer,
            waiting.writer_waits_for_sends
        ),
        (1, 0),
        "one wait, for the peer: {waiting:?}"
    );
    read_written(&mut a, written).await;
    guard("writable once credits return", waiter)
        .await
        .unwrap()
        .unwrap();

    // So does a write.
    let mut wr = Arc::try_unwrap(wr).expect("the waiter is done");
    let written = fill_until_blocked(|buf| wr.try_write(buf));
    let before = rd.stats();
    let writer = spawn_waiting("a write, out of credits", async move {
        wr.write_all(b"y").await
    })
    .await;
    let waiting = rd.stats();
    assert_eq!(
        (
            waiting.writer_waits_for_peer,
            waiting.writer_waits_for_sends
        ),
        (before.writer_waits_for_peer + 1, 0),
        "one more wait, for the peer: {before:?} then {waiting:?}"
    );
    let got = read_written(&mut a, written + 1).await;
    guard("the write once credits return", writer)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(got[written], b'y');
}
