//! What streaming costs the device per message, counted from `RStream::stats()`: how many
//! sends are signaled (each signaled send is a completion to poll) and how many
//! `ibv_post_send` calls are made (at most one per write call: its chunks go as one chain).
//! Counts, not timings.

use std::future::poll_fn;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::Poll;

use rdma_async::stream::hooks;
use rdma_async::stream::{RStream, RStreamOptions, StreamStats};
use rdma_async_device_tests::data::pattern;
use rdma_async_device_tests::{guard, stream_pair};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt, ReadBuf};

/// A send ring of 32 chunks of 64 KiB: half of it (when a send is signaled so that ring space
/// comes back in time) is 16 chunks, the signaling interval at the default send-queue depth.
const SEND_RING: u32 = 2 << 20;
/// The peer grants half its receive ring at a time: 8 chunks.
const RECV_RING: u32 = 1 << 20;
/// Bytes streamed in 64 KiB and in 1 MiB write calls.
const SMALL_TOTAL: usize = 32 << 20;
const LARGE_TOTAL: usize = 8 << 20;

/// Writes `total` bytes of `pattern(seed, ..)` in `write_size` write calls (a partial write
/// counts as a call and the rest goes in the next one); returns the number of calls and the
/// change of the stream's counters over them.
async fn write_counting(
    stream: &mut RStream,
    seed: u64,
    total: usize,
    write_size: usize,
) -> io::Result<(u64, StreamStats)> {
    let before = stream.stats();
    let data = pattern(seed, write_size);
    let mut calls = 0;
    for _ in 0..total / write_size {
        let mut done = 0;
        while done < data.len() {
            done += stream.write(&data[done..]).await?;
            calls += 1;
        }
    }
    let after = stream.stats();
    // `StreamStats` is non-exhaustive: filled field by field.
    let mut delta = StreamStats::default();
    delta.data_writes = after.data_writes - before.data_writes;
    delta.control_writes = after.control_writes - before.control_writes;
    delta.post_send_calls = after.post_send_calls - before.post_send_calls;
    delta.send_completions = after.send_completions - before.send_completions;
    delta.signaled_sends = after.signaled_sends - before.signaled_sends;
    Ok((calls, delta))
}

/// Reads `total` bytes, checking each `write_size` piece against `pattern(seed, ..)`.
async fn read_checking(
    stream: &mut RStream,
    seed: u64,
    total: usize,
    write_size: usize,
) -> io::Result<()> {
    let want = pattern(seed, write_size);
    let mut piece = vec![0u8; write_size];
    for i in 0..total / write_size {
        stream.read_exact(&mut piece).await?;
        assert!(piece == want, "piece {i} of {write_size} bytes differs");
    }
    Ok(())
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn streaming_signals_at_most_one_send_in_eight() {
    let options = RStreamOptions::new()
        .send_buffer_size(SEND_RING)
        .recv_buffer_size(RECV_RING);
    let (mut reader, mut writer) = stream_pair(options).await;
    let reading = tokio::spawn(async move {
        read_checking(&mut reader, 1, SMALL_TOTAL, 64 << 10).await?;
        read_checking(&mut reader, 2, LARGE_TOTAL, 1 << 20).await?;
        let mut rest = Vec::new();
        reader.read_to_end(&mut rest).await?;
        assert!(rest.is_empty(), "{} bytes after the end", rest.len());
        io::Result::Ok(reader.stats())
    });
    // 32 MiB in 64 KiB writes: one chunk per call.
    let small = guard("32 MiB in 64 KiB writes", async {
        write_counting(&mut writer, 1, SMALL_TOTAL, 64 << 10).await
    })
    .await
    .unwrap();
    // 8 MiB in 1 MiB writes: up to 16 chunks per call.
    let large = guard("8 MiB in 1 MiB writes", async {
        let large = write_counting(&mut writer, 2, LARGE_TOTAL, 1 << 20).await?;
        writer.shutdown().await?;
        let reader = reading.await.expect("reader task")?;
        io::Result::Ok((large, reader))
    })
    .await
    .unwrap();
    let (large, reader) = large;
    println!("64 KiB writes: {small:?}\n1 MiB writes: {large:?}\nreader: {reader:?}");

    // The reader's only sends are credit and buffer updates: unsignaled but for the one that
    // takes the last of the 4 control slots.
    assert!(
        reader.control_writes >= 32 && reader.data_writes == 0,
        "the reader granted its ring in halves: {reader:?}"
    );
    assert!(
        reader.signaled_sends * 4 <= reader.control_writes
            && reader.send_completions <= reader.signaled_sends,
        "{} signaled sends for {} control messages (more than 1 in 4): {reader:?}",
        reader.signaled_sends,
        reader.control_writes
    );

    let (calls, s) = small;
    let messages = s.data_writes + s.control_writes;
    assert_eq!(
        s.data_writes,
        (SMALL_TOTAL / (64 << 10)) as u64,
        "64 KiB writes are one chunk each: {s:?}"
    );
    assert!(
        s.send_completions * 8 <= messages,
        "{} signaled send completions for {messages} messages (more than 1 in 8): {s:?}",
        s.send_completions
    );
    assert!(calls >= s.data_writes, "{calls} calls for {s:?}");
    assert!(
        s.post_send_calls <= calls,
        "more than one ibv_post_send per write call: {calls} calls, {s:?}"
    );

    let (calls, l) = large;
    assert!(
        l.data_writes >= 128 && calls < l.data_writes,
        "1 MiB writes take several chunks per call: {calls} calls, {l:?}"
    );
    assert!(
        l.send_completions * 8 <= l.data_writes + l.control_writes,
        "{} signaled send completions for {} messages: {l:?}",
        l.send_completions,
        l.data_writes + l.control_writes
    );
    assert!(
        l.post_send_calls <= calls,
        "the chunks of a call go with one ibv_post_send: {calls} calls, {l:?}"
    );
}

/// Writes `pieces` with one vectored write call (all of them must fit at once) and returns the
/// change of the writer's counters; the reader checks that the bytes arrive in order.
async fn write_pieces_once(
    options: RStreamOptions,
    seed: u64,
    piece: usize,
    count: usize,
) -> StreamStats {
    let (mut reader, mut writer) = stream_pair(options).await;
    let data = pattern(seed, piece * count);
    let slices: Vec<IoSlice<'_>> = data.chunks(piece).map(IoSlice::new).collect();
    let before = writer.stats();
    let written = guard("one vectored write", writer.write_vectored(&slices))
        .await
        .unwrap();
    let after = writer.stats();
    assert_eq!(written, data.len(), "every piece fit the first call");
    let mut got = vec![0u8; data.len()];
    guard("reading the pieces", reader.read_exact(&mut got))
        .await
        .unwrap();
    assert!(got == data, "the pieces arrived out of order or changed");
    let mut delta = StreamStats::default();
    delta.data_writes = after.data_writes - before.data_writes;
    delta.inline_writes = after.inline_writes - before.inline_writes;
    delta.control_writes = after.control_writes - before.control_writes;
    delta.post_send_calls = after.post_send_calls - before.post_send_calls;
    delta
}

/// Writes `count` pieces of `piece` bytes with one vectored call (see `write_pieces_once`) and
/// checks they went as one message, from the send ring or inline, with one `ibv_post_send`.
async fn assert_one_message(
    options: RStreamOptions,
    seed: u64,
    piece: usize,
    count: usize,
    inline: bool,
) {
    let s = write_pieces_once(options, seed, piece, count).await;
    println!("{s:?}");
    assert_eq!(
        (s.data_writes, s.inline_writes, s.post_send_calls),
        (1, u64::from(inline), 1),
        "{count} pieces of {piece} bytes: one message (inline: {inline}), one post: {s:?}"
    );
}

/// 40 pieces of 50 bytes in one call: one message of 2000 bytes from the send ring, as a
/// `writev` on a TCP socket is one segment. Each piece its own message cost a work request, a
/// peer's receive and a credit each, and on Soft-RoCE a packet and an ACK each way.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_vectored_call_of_small_pieces_goes_as_one_message() {
    assert_one_message(RStreamOptions::new(), 3, 50, 40, false).await;
}

/// Three pieces of 10 bytes: 30 bytes, within the 64-byte inline limit, gathered into one
/// inline message.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn pieces_within_the_inline_limit_go_inline_as_one_message() {
    assert_one_message(RStreamOptions::new(), 5, 10, 3, true).await;
}

/// Four pieces of 100 bytes with a 512-byte inline limit (Soft-RoCE grants it): one inline
/// payload of 400 bytes, gathered from the pieces and larger than a chain's inline room (256
/// bytes), so posted alone.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_inline_chunk_larger_than_a_chains_room_is_posted_alone() {
    assert_one_message(RStreamOptions::new().inline_size(512), 4, 100, 4, true).await;
}

/// 40 messages posted in one call (0-byte DATA messages, through the test hook: write calls
/// now make one message of small pieces): more than one chain holds (16 requests), so the
/// chain posts as it fills.
#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_of_many_messages_posts_full_chains() {
    let (_reader, writer) = stream_pair(RStreamOptions::new()).await;
    let before = writer.stats();
    let sent = hooks::send_empty_messages(&writer, 40).unwrap();
    let after = writer.stats();
    assert_eq!(sent, 40, "a fresh stream has credits for 40 messages");
    let writes = after.data_writes - before.data_writes;
    let posts = after.post_send_calls - before.post_send_calls;
    assert_eq!(writes, 40, "every message was posted: {after:?}");
    assert!(
        posts > 1 && posts < writes,
        "40 messages went as several chains: {posts} posts"
    );
}

/// Polls `reader` for a read once, with the task's waker: what that poll returned.
async fn poll_read_once(reader: &mut RStream, buf: &mut [u8]) -> Poll<io::Result<usize>> {
    let mut buf = ReadBuf::new(buf);
    poll_fn(|cx| {
        let polled = Pin::new(&mut *reader).poll_read(cx, &mut buf);
        Poll::Ready(polled.map_ok(|()| buf.filled().len()))
    })
    .await
}

/// Polls `reader` for a read until a poll finds nothing and sleeps: a wait may first yield to
/// the runtime's other tasks (counted in `waits_yielded`), which looks again when polled next.
async fn read_until_asleep(reader: &mut RStream, buf: &mut [u8]) {
    for _ in 0..100 {
        let yielded = reader.stats().waits_yielded;
        assert!(
            poll_read_once(reader, buf).await.is_pending(),
            "nothing more was written"
        );
        if reader.stats().waits_yielded == yielded {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("the read kept yielding instead of sleeping");
}

/// A reader that reads until it finds nothing (as hyper's connection does) arms its completion
/// queue as its wake-up takes the event, before the bytes are handed up, and its read that then
/// finds nothing sleeps under that arm: one arm an exchange, and none (no system call on
/// Soft-RoCE) between the answer and the next sleep, where hyper's client looks at whether the
/// connection is ready for the next request.
#[rdma_async::test]
async fn a_reader_that_reads_until_empty_arms_before_it_hands_up_the_bytes() {
    // Busy-polling off: a read that finds nothing sleeps (after its yields, if any).
    let options = RStreamOptions::new().busy_poll(std::time::Duration::ZERO);
    let (mut writer, mut reader) = stream_pair(options).await;
    let mut buf = [0u8; 64];
    read_until_asleep(&mut reader, &mut buf).await;
    for round in 0..8u8 {
        let asleep = reader.stats().cq_arms;
        writer.write_all(&[round; 4]).await.expect("writing");
        let n = guard(
            "the read",
            poll_fn(|cx| {
                let mut filled = ReadBuf::new(&mut buf);
                Pin::new(&mut reader)
                    .poll_read(cx, &mut filled)
                    .map_ok(|()| filled.filled().len())
            }),
        )
        .await
        .expect("reading");
        assert_eq!(&buf[..n], [round; 4], "round {round}");
        let handed_up = reader.stats().cq_arms;
        read_until_asleep(&mut reader, &mut buf).await;
        let asleep_again = reader.stats().cq_arms;
        // A read that took bytes, then slept, makes it such a reader: from the second round.
        if round > 0 {
            assert_eq!(
                (handed_up - asleep, asleep_again - handed_up),
                (1, 0),
                "round {round}: arms made by the wake-up and by the read that found nothing"
            );
        }
    }
}
