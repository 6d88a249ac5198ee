//! Host tests of the stream driver: two [`StreamCore`]s over the in-process fake device
//! (`super::fake`), driven through the driver's own read, write and shutdown entry points.

use std::future::{Future, poll_fn};
use std::io::{self, IoSlice};
use std::pin::pin;
use std::task::{Poll, ready};
use std::time::Duration;

use tokio::io::ReadBuf;
use tokio::time::timeout;

use crate::proto::{Config, Op};

use super::fake::{FakeDevice, FakeWire, pair};
use super::{SPARE_RECVS, StreamCore, StreamDevice};

/// A hang guard: every test finishes in far less.
const GUARD: Duration = Duration::from_secs(10);

type Core = StreamCore<FakeDevice>;

fn connected(config: Config) -> (Core, Core, FakeWire) {
    pair(config).expect("connecting two drivers over the fake")
}

/// Bytes no two offsets of a short period share: a misplaced chunk shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect()
}

async fn write_all(core: &Core, mut bytes: &[u8]) -> io::Result<()> {
    while !bytes.is_empty() {
        let n = poll_fn(|cx| core.poll_write(cx, &[IoSlice::new(bytes)])).await?;
        assert!(n > 0, "a write that returns 0 bytes");
        bytes = &bytes[n..];
    }
    Ok(())
}

/// One read into `buf`: how many bytes (0 at end of stream).
async fn read_some(core: &Core, buf: &mut [u8]) -> io::Result<usize> {
    poll_fn(|cx| {
        let mut read = ReadBuf::new(buf);
        ready!(core.poll_read(cx, &mut read, false))?;
        Poll::Ready(Ok(read.filled().len()))
    })
    .await
}

async fn read_exact(core: &Core, len: usize) -> io::Result<Vec<u8>> {
    let mut out = vec![0; len];
    let mut at = 0;
    while at < len {
        let n = read_some(core, &mut out[at..]).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        at += n;
    }
    Ok(out)
}

async fn read_to_end(core: &Core) -> io::Result<Vec<u8>> {
    let mut out = Vec::new();
    let mut buf = vec![0; 64 * 1024];
    loop {
        match read_some(core, &mut buf).await? {
            0 => return Ok(out),
            n => out.extend_from_slice(&buf[..n]),
        }
    }
}

async fn shutdown(core: &Core) -> io::Result<()> {
    poll_fn(|cx| core.poll_shutdown(cx)).await
}

/// Polls `fut` once, without waiting.
async fn poll_once<F: Future + Unpin>(fut: &mut F) -> Poll<F::Output> {
    poll_fn(|cx| Poll::Ready(std::pin::Pin::new(&mut *fut).poll(cx))).await
}

#[tokio::test(flavor = "current_thread")]
async fn echoes_a_mebibyte_both_ways() {
    let (a, b, _wire) = connected(Config::new());
    const LEN: usize = 1024 * 1024;
    let sent = pattern(LEN, 0x5a);
    let writer = async {
        write_all(&a, &sent).await?;
        shutdown(&a).await
    };
    let echo = async {
        let mut buf = vec![0; 48 * 1024];
        let mut echoed = 0;
        loop {
            let n = read_some(&b, &mut buf).await?;
            if n == 0 {
                shutdown(&b).await?;
                return io::Result::Ok(echoed);
            }
            write_all(&b, &buf[..n]).await?;
            echoed += n;
        }
    };
    let reader = read_to_end(&a);
    let (written, echoed, back) = timeout(GUARD, async { tokio::join!(writer, echo, reader) })
        .await
        .expect("the echo hung");
    written.expect("writing the mebibyte");
    assert_eq!(echoed.expect("echoing"), LEN);
    let back = back.expect("reading the echo");
    assert_eq!(back.len(), LEN);
    assert!(back == sent, "the echo differs from what was sent");
    let (stats_a, stats_b) = (a.lock().stats, b.lock().stats);
    assert_eq!(stats_a.bytes_sent, LEN as u64);
    assert_eq!(stats_b.bytes_received, LEN as u64);
    assert_eq!(stats_b.bytes_sent, LEN as u64);
    assert_eq!(stats_a.bytes_received, LEN as u64);
}

/// Writes `out`, shuts down, and reads to the end of the stream; returns what it read.
async fn write_then_read(me: &str, core: &Core, out: &[u8]) -> io::Result<Vec<u8>> {
    write_all(core, out).await?;
    shutdown(core).await?;
    // Shut down for writing: a write now fails, while reading goes on.
    let refused = write_all(core, b"late").await;
    assert_eq!(
        refused.expect_err("a write after shutdown").kind(),
        io::ErrorKind::BrokenPipe,
        "{me}"
    );
    let got = read_to_end(core).await?;
    // End of stream stays end of stream.
    let mut buf = [0u8; 8];
    assert_eq!(read_some(core, &mut buf).await?, 0, "{me}");
    Ok(got)
}

#[tokio::test(flavor = "current_thread")]
async fn shuts_down_both_ways_after_every_byte() {
    let (a, b, _wire) = connected(Config::new());
    let from_a = pattern(100_000, 1);
    let from_b = pattern(70_000, 2);
    let (got_a, got_b) = timeout(GUARD, async {
        tokio::join!(
            write_then_read("a", &a, &from_a),
            write_then_read("b", &b, &from_b)
        )
    })
    .await
    .expect("shutting down hung");
    assert!(
        got_a.expect("a's side") == from_b,
        "a read other bytes than b sent"
    );
    assert!(
        got_b.expect("b's side") == from_a,
        "b read other bytes than a sent"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_writer_out_of_credits_waits_until_the_peer_reads() {
    // Few receives, a large ring: credits run out long before ring space.
    let config = Config::new().with_rq_size(16).with_rbuf_size(1024 * 1024);
    let (a, b, _wire) = connected(config);
    let message = pattern(100, 3);
    let mut sent = 0usize;
    loop {
        match a.try_write(&[IoSlice::new(&message)]) {
            Ok(n) => {
                assert_eq!(n, message.len());
                sent += 1;
                assert!(sent <= 16, "more messages than the peer has receives");
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("writing until blocked: {e}"),
        }
    }
    assert!(sent > 0, "no message went out at first");
    // A waiting writer is blocked on the peer, and stays so while it does not read.
    let more = pattern(10_000, 4);
    let mut writer = pin!(write_all(&a, &more));
    assert!(poll_once(&mut writer).await.is_pending());
    assert!(poll_once(&mut writer).await.is_pending());
    assert!(a.lock().stats.writer_waits_for_peer >= 1);
    // Once the peer reads, the writer goes on.
    let expected_len = sent * message.len() + more.len();
    let (written, read) = timeout(GUARD, async {
        tokio::join!(writer, read_exact(&b, expected_len))
    })
    .await
    .expect("the writer stayed blocked");
    written.expect("writing once the peer read");
    let read = read.expect("reading");
    for i in 0..sent {
        assert_eq!(&read[i * 100..(i + 1) * 100], &message[..], "message {i}");
    }
    assert!(read[sent * 100..] == more[..]);
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_post_fails_the_stream_with_its_cause() {
    let (a, b, wire) = connected(Config::new());
    write_all(&a, b"before").await.expect("a first write");
    wire.fail_next_post(0);
    let err = timeout(GUARD, write_all(&a, b"lost"))
        .await
        .expect("a failed post hung")
        .expect_err("a write whose post failed");
    assert!(
        err.to_string().contains("injected post failure"),
        "unclear error: {err}"
    );
    // The connection is broken for good: later writes report the same cause.
    let again = timeout(GUARD, write_all(&a, b"after"))
        .await
        .expect("a write after a failed post hung")
        .expect_err("a write after a failed post");
    assert!(
        again.to_string().contains("injected post failure"),
        "unclear error: {again}"
    );
    // What was posted before the failure did arrive.
    let got = timeout(GUARD, read_exact(&b, 6))
        .await
        .expect("reading hung");
    assert_eq!(got.expect("reading what came before"), b"before");
}

#[tokio::test(flavor = "current_thread")]
async fn a_failed_poll_is_reported_and_the_next_read_goes_on() {
    let (a, b, wire) = connected(Config::new());
    write_all(&a, b"hello").await.expect("writing");
    wire.fail_next_poll(1);
    let mut buf = [0u8; 16];
    let err = timeout(GUARD, read_some(&b, &mut buf))
        .await
        .expect("a failed poll hung")
        .expect_err("a read whose poll failed");
    assert!(
        err.to_string().contains("injected poll failure"),
        "unclear error: {err}"
    );
    // The completions stayed queued: the next read finds the bytes.
    let got = timeout(GUARD, read_exact(&b, 5))
        .await
        .expect("reading hung");
    assert_eq!(got.expect("reading after the failed poll"), b"hello");
}

#[tokio::test(flavor = "current_thread")]
async fn a_waiting_reader_sees_a_failed_poll() {
    let (a, b, wire) = connected(Config::new());
    let mut buf = [0u8; 16];
    let mut reader = pin!(read_some(&b, &mut buf));
    // Nothing to read: it waits on the fake's completion queue.
    assert!(poll_once(&mut reader).await.is_pending());
    wire.fail_next_poll(1);
    let err = timeout(GUARD, reader)
        .await
        .expect("a wait whose poll failed hung")
        .expect_err("a wait whose poll failed");
    assert!(
        err.to_string().contains("injected poll failure"),
        "unclear error: {err}"
    );
    write_all(&a, b"late").await.expect("writing");
    let got = timeout(GUARD, read_exact(&b, 4))
        .await
        .expect("reading hung");
    assert_eq!(got.expect("reading after the failed wait"), b"late");
}

/// A reader that went to sleep with nothing to read, polled again with nothing woken since
/// (a task polled for something else), returns `Pending` without looking at the queue, and
/// is still woken by the next completion, also when polled with another waker meanwhile.
#[tokio::test(flavor = "current_thread")]
async fn a_reader_polled_again_before_a_wake_up_does_not_look() {
    let (a, b, wire) = connected(Config::new());
    let mut buf = [0u8; 16];
    let mut reader = Box::pin(read_some(&b, &mut buf));
    assert!(poll_once(&mut reader).await.is_pending());
    let looks = wire.looks(1);
    for _ in 0..3 {
        assert!(poll_once(&mut reader).await.is_pending());
    }
    assert_eq!(
        wire.looks(1),
        looks,
        "a poll with nothing woken looked again"
    );
    // Polled last by another task: that one is woken (as Tokio keeps the last poll's waker).
    let (woken, waker) = crate::wake_count::counting_waker();
    let mut cx = std::task::Context::from_waker(&waker);
    assert!(reader.as_mut().poll(&mut cx).is_pending());
    assert_eq!(wire.looks(1), looks);
    write_all(&a, b"wake").await.expect("writing");
    assert_eq!(
        woken.get(),
        1,
        "the last poll's waker is woken by the completion"
    );
    let n = timeout(GUARD, &mut reader)
        .await
        .expect("reading hung")
        .expect("reading");
    drop(reader);
    assert_eq!(n, 4, "the whole message in one read");
    assert_eq!(&buf[..n], b"wake");
}

/// `len` bytes read from `core`, within the hang guard.
async fn read_within_guard(core: &Core, len: usize) -> Vec<u8> {
    timeout(GUARD, read_exact(core, len))
        .await
        .expect("reading hung")
        .expect("reading")
}

/// A read on `reader` (end `end` of `wire`) with nothing there sleeps; `writer` then writes
/// `bytes`, which the woken read returns whole. Returns the looks `end` had made when the read
/// went to sleep.
async fn read_woken_by(
    reader: &Core,
    writer: &Core,
    wire: &FakeWire,
    end: usize,
    bytes: &[u8],
) -> u64 {
    let mut buf = [0u8; 16];
    let mut read = Box::pin(read_some(reader, &mut buf));
    assert!(poll_once(&mut read).await.is_pending(), "nothing to read");
    let slept_after = wire.looks(end);
    write_all(writer, bytes).await.expect("writing");
    let n = timeout(GUARD, &mut read)
        .await
        .expect("reading hung")
        .expect("reading");
    drop(read);
    assert_eq!(&buf[..n], bytes);
    slept_after
}

/// A reader that reads until it finds nothing, woken after a sleep, takes the event that woke it
/// before its first look and arms again after that look, before the bytes are handed up (not in
/// the wait after them), with no look after the arm (the next read's look comes after it); a
/// read that finds bytes without sleeping, and the reads after the woken one, take and arm none.
#[tokio::test(flavor = "current_thread")]
async fn a_woken_reader_takes_its_event_before_its_first_look_and_only_after_a_sleep() {
    let (a, b, wire) = connected(Config::new());
    write_all(&a, b"first").await.expect("writing");
    assert_eq!(read_within_guard(&b, 5).await, b"first");
    assert_eq!(
        wire.wake_event_takes(1),
        [],
        "a read that found bytes took an event"
    );
    let slept_after = read_woken_by(&b, &a, &wire, 1, b"wake").await;
    assert_eq!(
        wire.wake_event_takes(1),
        [slept_after],
        "the woken reader looked before it took the event, or took more than once"
    );
    assert_eq!(
        wire.arms_ahead(1),
        [slept_after + 1],
        "the woken reader did not arm right after its first look, or armed more than once"
    );
    assert_eq!(
        wire.looks(1),
        slept_after + 1,
        "the woken reader looked again after arming"
    );
    write_all(&a, b"more").await.expect("writing");
    assert_eq!(read_within_guard(&b, 4).await, b"more");
    assert_eq!(
        wire.wake_event_takes(1).len(),
        1,
        "a read after the wake-up took an event"
    );
    assert_eq!(
        wire.arms_ahead(1).len(),
        1,
        "a read after the wake-up armed"
    );
    assert_eq!(wire.queues(1).looks_skipped, 0, "a wait skipped its look");
}

/// A woken reader that arms ahead and finds no bytes (the wake-up's message carried none)
/// waits again in the same call: that wait looks under the arm, for a completion that came
/// between the first look and the arm raised no event. The bytes written later wake it.
#[tokio::test(flavor = "current_thread")]
async fn a_woken_reader_that_finds_no_bytes_looks_again_under_its_arm() {
    let (a, b, wire) = connected(Config::new());
    write_all(&a, b"first").await.expect("writing");
    assert_eq!(read_within_guard(&b, 5).await, b"first");
    let mut buf = [0u8; 16];
    let mut read = Box::pin(read_some(&b, &mut buf));
    assert!(poll_once(&mut read).await.is_pending(), "nothing to read");
    // A message C ignores (`RS_OP_WRITE` as an immediate): a completion without bytes.
    wire.flood(1, Op::DirectWrite(0).encode(), 1);
    assert!(
        poll_once(&mut read).await.is_pending(),
        "a message without bytes ended the read"
    );
    assert_eq!(
        wire.arms_ahead(1).len(),
        1,
        "the woken reader did not arm ahead"
    );
    assert_eq!(
        wire.queues(1).looks_skipped,
        0,
        "the wait after the arm ahead slept without looking"
    );
    write_all(&a, b"wake").await.expect("writing");
    let n = timeout(GUARD, &mut read)
        .await
        .expect("reading hung")
        .expect("reading");
    drop(read);
    assert_eq!(&buf[..n], b"wake");
}

/// A ping-pong's reader (it writes after each read that took bytes) leaves the event to its next
/// wait, as before: reading it there gives the answer that much longer to come before the wait
/// sleeps.
#[tokio::test(flavor = "current_thread")]
async fn a_ping_pong_reader_leaves_the_event_to_its_next_wait() {
    let (a, b, wire) = connected(Config::new());
    for round in 0..3u8 {
        read_woken_by(&b, &a, &wire, 1, &[round; 4]).await;
        write_all(&b, b"pong").await.expect("answering");
        assert_eq!(read_within_guard(&a, 4).await, b"pong");
    }
    assert_eq!(
        wire.wake_event_takes(1),
        [],
        "a reader that writes after each read took its wake-ups' events"
    );
    assert_eq!(wire.arms_ahead(1), [], "a ping-pong's reader armed ahead");
}

/// A ping-pong's receives go back to the queue in chains of [`SPARE_RECVS`], one post for that
/// many messages rather than one each, and the queue never holds fewer receives than the
/// credits it granted cover.
#[tokio::test(flavor = "current_thread")]
async fn consumed_receives_go_back_in_chains_and_the_credits_stay_covered() {
    let config = Config::new();
    let (a, b, wire) = connected(config);
    let posts_before = wire.queues(1).recv_posts;
    let rounds = 5 * SPARE_RECVS + 3;
    timeout(GUARD, async {
        for round in 0..rounds {
            let ping = [round as u8];
            write_all(&a, &ping).await.expect("pinging");
            assert_eq!(read_exact(&b, 1).await.expect("reading the ping"), ping);
            let queues = wire.queues(1);
            let unposted = b.lock().unposted_recvs;
            let in_queue = queues.recvs_posted + queues.recv_completions;
            assert!(
                unposted < SPARE_RECVS,
                "round {round}: {unposted} receives held back"
            );
            assert!(
                in_queue >= config.rq_size() as usize,
                "round {round}: {queues:?}: fewer receives than the credits cover"
            );
            assert_eq!(
                in_queue + unposted,
                queues.rq_depth,
                "round {round}: {queues:?}, {unposted} held back: a receive was lost"
            );
            write_all(&b, b"p").await.expect("ponging");
            assert_eq!(read_exact(&a, 1).await.expect("reading the pong"), b"p");
        }
    })
    .await
    .expect("the ping-pong hung");
    let consumed = b.lock().stats.recv_completions as usize;
    assert!(consumed >= rounds, "{consumed} receives for {rounds} pings");
    assert_eq!(
        wire.queues(1).recv_posts - posts_before,
        (consumed / SPARE_RECVS) as u64,
        "{consumed} consumed receives did not go back in chains of {SPARE_RECVS}"
    );
    assert_eq!(b.lock().unposted_recvs, consumed % SPARE_RECVS);
}

#[tokio::test(flavor = "current_thread")]
async fn control_messages_flow_while_completions_are_held_back() {
    let (a, b, wire) = connected(Config::new());
    wire.hold_completions(1, true);
    write_all(&a, b"held").await.expect("writing");
    assert!(wire.queued(1) > 0, "the write gave the peer no completion");
    let mut reader = pin!(read_exact(&b, 4));
    assert!(poll_once(&mut reader).await.is_pending(), "read held bytes");
    wire.hold_completions(1, false);
    let got = timeout(GUARD, reader)
        .await
        .expect("released completions woke no reader")
        .expect("reading");
    assert_eq!(got, b"held");
    // Reading returned the peer's credits with control messages, which b counted.
    assert!(b.lock().stats.control_writes >= 1);
    assert_eq!(
        wire.binds(0) + wire.binds(1),
        0,
        "no ring lends, so no window binds"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn a_disconnect_ends_the_stream_after_the_bytes_sent_before_it() {
    let (a, b, wire) = connected(Config::new());
    write_all(&a, b"last words").await.expect("writing");
    let mut buf = [0u8; 64];
    let mut reader = pin!(async {
        let got = read_exact(&b, 10).await?;
        let mut end = [0u8; 8];
        let after = read_some(&b, &mut end).await;
        io::Result::Ok((got, after))
    });
    // The bytes are read; the reader then waits for more.
    assert!(poll_once(&mut reader).await.is_pending());
    wire.disconnect();
    let (got, after) = timeout(GUARD, reader)
        .await
        .expect("a disconnect woke no reader")
        .expect("reading what came before the disconnect");
    assert_eq!(got, b"last words");
    // No orderly close came first: after the bytes, the disconnect reads as a reset that
    // says so, never as more bytes or a clean end of stream.
    let err = after.expect_err("a read after a disconnect without DISCONNECT");
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    assert!(
        err.to_string().contains("without closing"),
        "unclear error: {err}"
    );
    // The other end learns it too, at the latest when its flushed sends complete.
    let err = timeout(GUARD, async {
        loop {
            if let Err(e) = write_all(&a, b"x").await {
                return e;
            }
            if let Err(e) = read_some(&a, &mut buf).await {
                return e;
            }
        }
    })
    .await
    .expect("a writer on a disconnected stream hung");
    // Its sends were flushed by the disconnect, and it says so.
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset, "{err}");
    assert!(err.to_string().contains("flushed"), "unclear error: {err}");
}

/// Polls one-byte reads `times` times within one poll of the task (one budget): how many
/// returned a byte, and whether one was `Pending` (then it stops).
async fn one_byte_reads_in_one_poll(core: &Core, times: usize) -> (usize, bool) {
    poll_fn(|cx| {
        let mut bytes = 0;
        for _ in 0..times {
            let mut byte = [0u8; 1];
            let mut read = ReadBuf::new(&mut byte);
            match core.poll_read(cx, &mut read, false) {
                Poll::Ready(result) => {
                    result.expect("a read");
                    bytes += read.filled().len();
                }
                Poll::Pending => return Poll::Ready((bytes, true)),
            }
        }
        Poll::Ready((bytes, false))
    })
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn reads_of_delivered_bytes_spend_no_budget_and_reads_at_the_end_do() {
    let (a, b, _wire) = connected(Config::new());
    const LEN: usize = 300;
    timeout(GUARD, async {
        write_all(&b, &pattern(LEN, 3)).await.expect("b writes");
        // The first read reaps the delivery; the rest read what it delivered, more reads in
        // one poll of the task than Tokio's budget of 128 units would allow if each took one.
        assert_eq!(read_exact(&a, 1).await.expect("a reads").len(), 1);
        let (bytes, yielded) = one_byte_reads_in_one_poll(&a, LEN - 1).await;
        assert!(
            !yielded && bytes == LEN - 1,
            "reads of delivered bytes yielded to the runtime after {bytes} bytes"
        );
        shutdown(&b).await.expect("b shuts down");
        assert_eq!(read_some(&a, &mut [0; 8]).await.expect("end of stream"), 0);
        // A loop reading end of stream would never end otherwise: each read spends a unit.
        let (bytes, yielded) = one_byte_reads_in_one_poll(&a, 1000).await;
        assert!(
            yielded && bytes == 0,
            "1000 reads at end of stream in one poll of the task never yielded"
        );
    })
    .await
    .expect("the reads hung");
}

/// Polls `rounds` rounds of a one-byte write by `writer` and a one-byte read of it by `reader`,
/// within one poll of the task (one budget): how many rounds completed before a `Pending`.
async fn ping_rounds_in_one_poll(writer: &Core, reader: &Core, rounds: usize) -> usize {
    poll_fn(|cx| {
        for done in 0..rounds {
            match writer.poll_write(cx, &[IoSlice::new(&[7])]) {
                Poll::Ready(result) => assert_eq!(result.expect("a write"), 1),
                Poll::Pending => return Poll::Ready(done),
            }
            let mut byte = [0u8; 1];
            let mut read = ReadBuf::new(&mut byte);
            match reader.poll_read(cx, &mut read, false) {
                Poll::Ready(result) => {
                    result.expect("a read");
                    assert_eq!(read.filled(), [7], "round {done} read the wrong byte");
                }
                Poll::Pending => return Poll::Ready(done),
            }
        }
        Poll::Ready(rounds)
    })
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn a_read_that_reaps_its_message_spends_one_unit_of_budget() {
    let (a, b, _wire) = connected(Config::new());
    timeout(GUARD, async {
        // Each read finds nothing delivered and reaps the one message written before it: one
        // unit of Tokio's 128 a read (the batch it reaps is paid with the read's unit), so
        // 100 rounds fit in one poll of the task (two units a read would stop at 64).
        let rounds = ping_rounds_in_one_poll(&b, &a, 100).await;
        assert_eq!(
            rounds, 100,
            "a read that reaps a message spent more than one unit"
        );
        // And the budget is still spent: a ping-pong loop yields to the runtime.
        let rounds = ping_rounds_in_one_poll(&b, &a, 1000).await;
        assert!(
            rounds < 1000,
            "1000 reads that each reaped a message in one poll of the task never yielded"
        );
    })
    .await
    .expect("the ping rounds hung");
}

#[test]
fn a_drain_under_a_peer_sending_without_pause_ends() {
    let (a, _b, wire) = connected(Config::new());
    const MESSAGES: usize = 100_000;
    // Messages C ignores (`RS_OP_WRITE` as an immediate) take no credit: each is handled and
    // its receive posted again, which the peer fills at once, so the queue never runs dry
    // while the flood lasts.
    wire.flood(0, Op::DirectWrite(0).encode(), MESSAGES);
    let mut state = a.lock();
    let before = state.stats.recv_completions;
    a.drain(&mut state).expect("a drains");
    let handled = (state.stats.recv_completions - before) as usize;
    let capacity = a.device.queue_capacity();
    assert!(
        handled <= capacity + super::BATCH,
        "one drain handled {handled} completions of a flood; the queue holds {capacity}"
    );
    assert!(
        handled > 0 && wire.queued(0) > 0,
        "the flood was not running: {:?}",
        state.conn.read_status()
    );
}
