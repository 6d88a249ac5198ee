//! A peer that floods a stream with valid messages cannot monopolise the runtime: the stream
//! handles its completions within Tokio's cooperative budget, so on a single-threaded runtime
//! other tasks and other connections keep running while the flood lasts, and a backlog of
//! completions is handled over several polls with other tasks' turns between them.

use std::future::poll_fn;
use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::Poll;

use rdma_async::stream::hooks;
use rdma_async::stream::{RStream, RStreamOptions};
use rdma_async_device_tests::{guard, rlistener, rlistener_with, stream_pair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// 0-byte messages the peer floods with: 10^6, or `RDMA_ASYNC_FLOOD_MESSAGES`.
fn flood_messages() -> u64 {
    std::env::var("RDMA_ASYNC_FLOOD_MESSAGES")
        .ok()
        .map(|v| v.parse().expect("RDMA_ASYNC_FLOOD_MESSAGES: a number"))
        .unwrap_or(1_000_000)
}

/// The most flood messages the peer may get through between two turns of another task: one
/// poll of the flooded stream handles at most 128 budget units × 32 completions, and the peer
/// may have its credits' worth (the receive queue, 384) more in flight; twice that for slack.
const MAX_MESSAGES_BETWEEN_TURNS: u64 = 2 * (COMPLETIONS_PER_POLL + 384);

/// Tokio's budget per task poll (128 units) × the completions one unit may handle (32).
const COMPLETIONS_PER_POLL: u64 = 128 * 32;

/// Credit-only messages queued before the flooded stream is first polled: several polls' worth.
const BACKLOG: u64 = 16_000;

/// Round trips the second connection makes while the flood goes on.
const ECHOES: usize = 100;

/// Lets every other ready task run once: wakes itself and yields, so it goes to the back of
/// the run queue (not to the timer or I/O driver's next turn, as `yield_now` may).
async fn next_turn() {
    let mut yielded = false;
    poll_fn(|cx| {
        if yielded {
            return Poll::Ready(());
        }
        yielded = true;
        cx.waker().wake_by_ref();
        Poll::Pending
    })
    .await;
}

/// The flooding peer, on a thread and runtime of its own (as a separate host would be): sends
/// `total` 0-byte messages as fast as its credits allow, counting them in `sent`, then shuts
/// down writing, so the flooded reader sees EOF when the flood is over.
fn spawn_flooder(
    addr: std::net::SocketAddr,
    total: u64,
    sent: Arc<AtomicU64>,
) -> std::thread::JoinHandle<io::Result<()>> {
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?;
        runtime.block_on(async move {
            let mut peer = RStream::connect(addr).await?;
            let mut done = 0;
            while done < total {
                let n = hooks::send_empty_messages(&peer, (total - done).min(4096) as usize)?;
                if n == 0 {
                    peer.writable().await?;
                }
                done += n as u64;
                sent.store(done, Ordering::Release);
            }
            peer.shutdown().await
        })
    })
}

#[rdma_async::test(flavor = "current_thread")]
async fn a_flooding_peer_leaves_the_runtime_to_other_tasks_and_connections() {
    let total = flood_messages();
    let listener = rlistener().await;
    let sent = Arc::new(AtomicU64::new(0));
    let flooder = spawn_flooder(listener.local_addr().unwrap(), total, sent.clone());
    let (mut flooded, _) = guard("accept the flooding peer", listener.accept())
        .await
        .unwrap();

    // The flooded stream's reader: the messages carry nothing, so it reads EOF and 0 bytes.
    let started = std::time::Instant::now();
    let reader = tokio::spawn(async move {
        let mut buf = [0u8; 64];
        let mut got = 0;
        loop {
            match flooded.read(&mut buf).await? {
                0 => return io::Result::Ok((got, flooded.stats())),
                n => got += n,
            }
        }
    });

    // A ticker that counts its turns while the flood is in progress, and the most messages
    // the peer got through between two of its turns.
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = tokio::spawn({
        let (sent, stop) = (sent.clone(), stop.clone());
        async move {
            let (mut turns_during_flood, mut most_between_turns, mut last) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Acquire) {
                let now = sent.load(Ordering::Acquire);
                if now > 0 && now < total {
                    turns_during_flood += 1;
                }
                most_between_turns = most_between_turns.max(now - last);
                last = now;
                next_turn().await;
            }
            (turns_during_flood, most_between_turns)
        }
    });

    // A second connection on the same runtime that echoes while the flood goes on.
    let (mut echo_server, mut echo_client) = stream_pair(RStreamOptions::new()).await;
    let echo = tokio::spawn(async move {
        let mut buf = vec![0u8; 4096];
        loop {
            let n = echo_server.read(&mut buf).await?;
            if n == 0 {
                return echo_server.shutdown().await;
            }
            echo_server.write_all(&buf[..n]).await?;
        }
    });
    let echoes = {
        let sent = sent.clone();
        async move {
            // Start once the flood has.
            while sent.load(Ordering::Acquire) == 0 {
                next_turn().await;
            }
            let started_at = sent.load(Ordering::Acquire);
            let mut reply = [0u8; 64];
            for i in 0..ECHOES {
                let msg = [i as u8; 64];
                echo_client.write_all(&msg).await?;
                echo_client.read_exact(&mut reply).await?;
                assert_eq!(reply, msg, "echo {i}");
            }
            echo_client.shutdown().await?;
            io::Result::Ok((started_at, sent.load(Ordering::Acquire)))
        }
    };
    let (started_at, done_at) = guard("echoes during the flood", echoes).await.unwrap();
    guard("echo server", echo).await.unwrap().unwrap();

    // The flood takes minutes at most under emulation; this is a hang guard only.
    let (got, stats) = tokio::time::timeout(10 * rdma_async_device_tests::STEP, reader)
        .await
        .expect("the flood did not end in 10 minutes")
        .unwrap()
        .unwrap();
    // Reported, never asserted: how fast the device let the peer flood.
    let elapsed = started.elapsed();
    stop.store(true, Ordering::Release);
    let (turns_during_flood, most_between_turns) = guard("ticker", ticker).await.unwrap();
    flooder.join().expect("flooder thread").unwrap();

    println!(
        "flood of {total} in {elapsed:.1?} ({:.0}/s): {} receive completions; ticker turns during it {turns_during_flood}, \
         at most {most_between_turns} messages between turns; {ECHOES} echoes between \
         messages {started_at} and {done_at}",
        total as f64 / elapsed.as_secs_f64(),
        stats.recv_completions
    );
    assert_eq!(got, 0, "0-byte messages carry no bytes");
    assert!(stats.recv_completions >= total, "{stats:?}");
    assert!(
        done_at < total,
        "the echoes finished only after the flood ({done_at} of {total} messages)"
    );
    assert!(
        most_between_turns <= MAX_MESSAGES_BETWEEN_TURNS,
        "the flood got {most_between_turns} messages through between two turns of another \
         task (at most {MAX_MESSAGES_BETWEEN_TURNS} expected)"
    );
    assert!(
        turns_during_flood >= total / MAX_MESSAGES_BETWEEN_TURNS,
        "another task ran only {turns_during_flood} times during a flood of {total}"
    );
}

#[rdma_async::test(flavor = "current_thread")]
async fn a_backlog_of_completions_is_handled_over_several_polls() {
    // Queues deep enough that the whole backlog is received (and sent) without waiting.
    let listener = rlistener_with(RStreamOptions::new().rq_size(16384)).await;
    let addr = listener.local_addr().unwrap();
    let peer_options = RStreamOptions::new().sq_size(16384);
    let (accepted, peer) = guard("connect", async {
        tokio::join!(
            listener.accept(),
            RStream::connect_with(addr, &peer_options)
        )
    })
    .await;
    let (mut flooded, _) = accepted.unwrap();
    let mut peer = peer.unwrap();

    // A credit-only update (RS_OP_SGL = 4, no payload) that repeats the limit the peer
    // granted at connection time (its receive queue: 384), so it is valid and changes nothing.
    const CREDITS_ONLY: u32 = (4 << 29) | 384;
    for _ in 0..BACKLOG {
        hooks::send_raw_immediate(&peer, CREDITS_ONLY).unwrap();
    }
    // SHUTDOWN follows them on the same queue pair and completes once the flooded end has
    // acknowledged everything before it: the backlog is then in its completion queue, unread.
    guard("peer shutdown", peer.shutdown()).await.unwrap();

    let turns = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let ticker = tokio::spawn({
        let (turns, stop) = (turns.clone(), stop.clone());
        async move {
            while !stop.load(Ordering::Acquire) {
                turns.fetch_add(1, Ordering::AcqRel);
                next_turn().await;
            }
        }
    });
    let reader = tokio::spawn({
        let turns = turns.clone();
        async move {
            let before = turns.load(Ordering::Acquire);
            let mut buf = [0u8; 16];
            let n = flooded.read(&mut buf).await?;
            io::Result::Ok((n, turns.load(Ordering::Acquire) - before, flooded.stats()))
        }
    });
    let (n, turns_during_read, stats) = guard("read through the backlog", reader)
        .await
        .unwrap()
        .unwrap();
    stop.store(true, Ordering::Release);
    guard("ticker", ticker).await.unwrap();
    println!(
        "backlog of {BACKLOG}: {} receive completions, {turns_during_read} turns of another \
         task while one read handled them",
        stats.recv_completions
    );
    assert_eq!(n, 0, "EOF after messages that carry nothing");
    assert!(stats.recv_completions > BACKLOG, "{stats:?}");
    assert!(
        turns_during_read >= BACKLOG / COMPLETIONS_PER_POLL,
        "a read handled {BACKLOG} completions with only {turns_during_read} turns of another \
         task between its polls (at most {COMPLETIONS_PER_POLL} completions a poll expected)"
    );
}
