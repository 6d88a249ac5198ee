//! Many `RStream` connections ping-ponging at once between one client process and one server
//! process: aggregate transfers per second, CPU time per transfer, context switches (the
//! process's wake-ups) per transfer and descriptors per connection. `scripts/compare-many` runs
//! it for 1, 64 and 256 connections in one boot.
//!
//!     many_streams server ADDR PAIRS ROUNDS SIZE   serve PAIRS connections, echo ROUNDS
//!                                                  messages of SIZE bytes on each, then report
//!     many_streams client ADDR PAIRS ROUNDS SIZE   PAIRS connections, ROUNDS round trips of
//!                                                  SIZE bytes each, all at once
//!
//!     many_streams local ADDR STREAMS ROUNDS SIZE BUFFER
//!                                                  one process holding STREAMS streams: an
//!                                                  echo server on ADDR and STREAMS / 2
//!                                                  connections to it, each with BUFFER-byte
//!                                                  rings and 16-deep queues; ROUNDS round trips of SIZE bytes on
//!                                                  each, all at once
//!
//! `many_streams --help` prints the usage. An optional last argument, WORKERS, runs a side on a multi-thread runtime with that many
//! workers (as `#[tokio::main]` does); without it (or with 0) on a current-thread runtime.
//! `local --shared-channels` makes its streams share one completion channel
//! (`RStreamOptions::shared_channels`).
//!
//! `local` reports what holding many streams costs: the time to open them all (setup_secs),
//! the resident memory and descriptors they add, per stream, and the CPU time per transfer
//! of the exchange. `scripts/many-streams` runs it for 10,000 streams.
//!
//! A transfer is one message one way (a round trip is two), as in `scripts/compare`. Each side
//! measures only the exchange: from all connections established (and every buffer allocated)
//! to the last round trip done, so neither connecting nor closing is counted. Every echo is
//! checked byte for byte, and each side checks the other sent no more than ROUNDS messages.
//! The report is one line of `key=value` fields on stdout.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use clap::Parser;
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Barrier;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[path = "common/usage.rs"]
mod usage;
use usage::Usage;

/// Connection `i`'s `rounds` round trips of a `size`-byte message through an echo, each checked;
/// gives the stream back.
async fn ping_pong(mut stream: RStream, i: usize, size: usize, rounds: u64) -> io::Result<RStream> {
    let msg: Vec<u8> = (0..size).map(|j| (i * 31 + j) as u8).collect();
    let mut back = vec![0; size];
    for _ in 0..rounds {
        stream.write_all(&msg).await?;
        stream.read_exact(&mut back).await?;
        if back != msg {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("connection {i}: the echo differs from what was sent"),
            ));
        }
    }
    Ok(stream)
}

/// Echoes what `stream` receives until its end, then shuts it down.
async fn echo(stream: &mut RStream, size: usize) -> io::Result<()> {
    let mut buf = vec![0; size];
    loop {
        match stream.read(&mut buf).await? {
            0 => return stream.shutdown().await,
            n => stream.write_all(&buf[..n]).await?,
        }
    }
}

/// Descriptors this process holds. From /proc: getrusage has no such figure.
fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// Prints the report of one side.
fn report(
    side: &str,
    pairs: usize,
    transfers: u64,
    elapsed: Duration,
    before: Usage,
    after: Usage,
    fds_per_conn: f64,
) {
    let t = transfers.max(1) as f64;
    println!(
        "{side} pairs={pairs} transfers={transfers} secs={:.3} transfers_per_s={:.0} \
         cpu_us_per_transfer={:.2} switches_per_transfer={:.3} fds_per_conn={fds_per_conn:.1}",
        elapsed.as_secs_f64(),
        t / elapsed.as_secs_f64().max(1e-9),
        (after.cpu - before.cpu).as_secs_f64() * 1e6 / t,
        (after.switches - before.switches) as f64 / t,
    );
}

async fn serve(addr: SocketAddr, pairs: usize, rounds: u64, size: usize) -> Result<(), BoxError> {
    let listener = RListener::bind(addr).await?;
    println!("many_streams: listening on {}", listener.local_addr()?);
    let fds_before = open_fds();
    let mut streams = Vec::with_capacity(pairs);
    for _ in 0..pairs {
        streams.push((listener.accept().await?.0, vec![0; size]));
    }
    let fds_per_conn = (open_fds() - fds_before) as f64 / pairs as f64;
    let (before, start) = (Usage::now()?, Instant::now());
    let echoes: Vec<_> = streams
        .into_iter()
        .map(|(mut stream, mut buf)| {
            tokio::spawn(async move {
                for _ in 0..rounds {
                    stream.read_exact(&mut buf).await?;
                    stream.write_all(&buf).await?;
                }
                Ok::<_, io::Error>(stream)
            })
        })
        .collect();
    let mut streams = Vec::with_capacity(pairs);
    for echo in echoes {
        streams.push(echo.await??);
    }
    let (elapsed, after) = (start.elapsed(), Usage::now()?);
    // Each message echoed is two transfers: in and out.
    let transfers = 2 * rounds * pairs as u64;
    report(
        "server",
        pairs,
        transfers,
        elapsed,
        before,
        after,
        fds_per_conn,
    );
    // The client shuts down after its last round trip: nothing more may come.
    let closes = streams.into_iter().map(|mut stream| async move {
        expect_end(&mut stream).await?;
        stream.shutdown().await
    });
    for closed in join_all(closes).await {
        closed?;
    }
    Ok(())
}

/// Reads to the end of `stream`: an error if anything comes before it.
async fn expect_end(stream: &mut RStream) -> io::Result<()> {
    let mut rest = Vec::new();
    stream.read_to_end(&mut rest).await?;
    if !rest.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{} bytes came after the last round trip", rest.len()),
        ));
    }
    Ok(())
}

async fn client(addr: SocketAddr, pairs: usize, rounds: u64, size: usize) -> Result<(), BoxError> {
    let fds_before = open_fds();
    // Connect a few at a time, as a real client pool would.
    let mut streams = Vec::with_capacity(pairs);
    for chunk in (0..pairs).collect::<Vec<_>>().chunks(16) {
        let connects = chunk.iter().map(|_| RStream::connect(addr));
        for stream in join_all(connects).await {
            let stream = stream?;
            streams.push(stream);
        }
    }
    let fds_per_conn = (open_fds() - fds_before) as f64 / pairs as f64;
    let barrier = std::sync::Arc::new(Barrier::new(pairs + 1));
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, stream)| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                ping_pong(stream, i, size, rounds).await
            })
        })
        .collect();
    barrier.wait().await;
    eprintln!("many_streams: {pairs} connections established, exchanging");
    let (before, start) = (Usage::now()?, Instant::now());
    let mut streams = Vec::with_capacity(pairs);
    for task in tasks {
        streams.push(task.await??);
    }
    let (elapsed, after) = (start.elapsed(), Usage::now()?);
    let transfers = 2 * rounds * pairs as u64;
    report(
        "client",
        pairs,
        transfers,
        elapsed,
        before,
        after,
        fds_per_conn,
    );
    let shutdowns = streams.into_iter().map(|mut stream| async move {
        stream.shutdown().await?;
        expect_end(&mut stream).await
    });
    for closed in join_all(shutdowns).await {
        closed?;
    }
    Ok(())
}

/// This process's resident memory now, in KiB (`VmRSS`). From /proc: getrusage has only the
/// peak (`ru_maxrss`), which never falls, so it could not show what the streams add.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// `streams` streams in this process: an echo server and `streams / 2` connections to it, all
/// with `buffer`-byte rings; `rounds` round trips of `size` bytes on every connection at once.
async fn local(
    addr: SocketAddr,
    streams: usize,
    rounds: u64,
    size: usize,
    buffer: u32,
    shared_channels: bool,
) -> Result<(), BoxError> {
    let pairs = streams / 2;
    if pairs == 0 || size == 0 {
        return Err("STREAMS must be at least 2 and SIZE at least 1".into());
    }
    // Small rings, and the smallest queues rsockets allows: a ping-pong has one message in
    // flight.
    let opts = RStreamOptions::new()
        .send_buffer_size(buffer)
        .recv_buffer_size(buffer)
        .sq_size(16)
        .rq_size(16)
        .shared_channels(shared_channels);
    let listener = RListener::bind_with(addr, &opts).await?;
    let addr = listener.local_addr()?;
    let (fds_before, rss_before, start) = (open_fds(), rss_kib(), Instant::now());
    // The server accepts every connection and echoes on each until its end, in a task per
    // connection.
    let server = tokio::spawn(async move {
        let mut echoes = Vec::with_capacity(pairs);
        for i in 0..pairs {
            let (mut stream, _) = listener.accept().await?;
            echoes.push(tokio::spawn(async move {
                let echoed = echo(&mut stream, size).await;
                // Said at once: the client sees only the reset that dropping the stream
                // makes, and this task's result is awaited at the end.
                if let Err(e) = &echoed {
                    eprintln!("many_streams: the server's stream {i} failed: {e}");
                }
                echoed
            }));
        }
        Ok::<_, io::Error>(echoes)
    });
    // Connect a few at a time, as a real client pool would (and within the handshakes one
    // address may have in progress: `RStreamOptions::handshakes_per_source`).
    let mut clients = Vec::with_capacity(pairs);
    for chunk in (0..pairs).collect::<Vec<_>>().chunks(32) {
        let connects = chunk.iter().map(|_| {
            let opts = opts.clone();
            async move { RStream::connect_with(addr, &opts).await }
        });
        for stream in join_all(connects).await {
            clients.push(stream?);
        }
        // A sign of life every tenth of the way: opening 10,000 takes minutes under emulation.
        if clients.len() % (pairs / 10).max(1) < chunk.len() {
            println!("many_streams: {} connections open", clients.len());
        }
    }
    let echoes = server.await??;
    let setup = start.elapsed();
    let held = (2 * pairs) as f64;
    let fds_per_stream = (open_fds() - fds_before) as f64 / held;
    let rss_kib_per_stream = rss_kib().saturating_sub(rss_before) as f64 / held;
    // On stdout, as a sign of life between the two long steps.
    println!("many_streams: {} streams open, exchanging", 2 * pairs);
    let (before, start) = (Usage::now()?, Instant::now());
    let tasks: Vec<_> = clients
        .into_iter()
        .enumerate()
        .map(|(i, stream)| tokio::spawn(ping_pong(stream, i, size, rounds)))
        .collect();
    let mut clients = Vec::with_capacity(pairs);
    for task in tasks {
        clients.push(task.await??);
    }
    let (elapsed, after) = (start.elapsed(), Usage::now()?);
    // Each round trip is four transfers: out and back on the client, in and out on the server.
    let transfers = (4 * rounds * pairs as u64).max(1);
    println!(
        "local streams={} channels={} setup_secs={:.3} \
         rss_kib_per_stream={rss_kib_per_stream:.1} fds_per_stream={fds_per_stream:.2} \
         transfers={transfers} transfers_per_s={:.0} cpu_us_per_transfer={:.2}",
        2 * pairs,
        if shared_channels { "shared" } else { "own" },
        setup.as_secs_f64(),
        transfers as f64 / elapsed.as_secs_f64().max(1e-9),
        (after.cpu - before.cpu).as_secs_f64() * 1e6 / transfers as f64,
    );
    let shutdowns = clients.into_iter().map(|mut stream| async move {
        stream.shutdown().await?;
        expect_end(&mut stream).await
    });
    for closed in join_all(shutdowns).await {
        closed?;
    }
    for echo in echoes {
        echo.await??;
    }
    Ok(())
}

/// Awaits every future, each on a task of its own (the examples avoid the `futures` crate for
/// one helper).
async fn join_all<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let handles: Vec<_> = futures.map(tokio::spawn).collect();
    let mut out = Vec::with_capacity(handles.len());
    for h in handles {
        out.push(h.await.expect("a connect task panicked"));
    }
    out
}

/// Many `RStream` connections ping-ponging at once; each side prints one line of `key=value`
/// figures (transfers per second, CPU time and context switches per transfer, descriptors per
/// connection).
#[derive(Debug, Parser)]
#[command(name = "many_streams")]
enum Options {
    /// Serve PAIRS connections, echo ROUNDS messages of SIZE bytes on each, then report.
    Server(Pairs),
    /// Open PAIRS connections and make ROUNDS round trips of SIZE bytes on each, all at once.
    Client(Pairs),
    /// One process holding STREAMS streams (an echo server on ADDR and STREAMS / 2 connections
    /// to it, with BUFFER-byte rings): ROUNDS round trips of SIZE bytes on each, all at once.
    Local {
        /// The address and port the echo server listens on.
        addr: SocketAddr,
        /// Streams held, both ends of each connection counted.
        streams: usize,
        /// Round trips on each connection.
        rounds: u64,
        /// Bytes per message.
        size: usize,
        /// Bytes of each stream's rings.
        buffer: u32,
        /// Worker threads of a multi-thread runtime; 0 runs on a current-thread runtime.
        #[arg(default_value_t = 0)]
        workers: usize,
        /// The streams share one completion channel (`RStreamOptions::shared_channels`).
        #[arg(long)]
        shared_channels: bool,
    },
}

/// The arguments of either side of the two-process exchange.
#[derive(Debug, clap::Args)]
struct Pairs {
    /// The server's address and port: where it listens, or where the client connects.
    addr: SocketAddr,
    /// Connections.
    pairs: usize,
    /// Round trips on each connection.
    rounds: u64,
    /// Bytes per message.
    size: usize,
    /// Worker threads of a multi-thread runtime; 0 runs on a current-thread runtime.
    #[arg(default_value_t = 0)]
    workers: usize,
}

fn main() -> Result<(), BoxError> {
    let options = Options::parse();
    // WORKERS: 0 (the default) runs on a current-thread runtime, as
    // `#[rdma_async::main(flavor = "current_thread")]` does; N on a multi-thread runtime with N
    // workers, as `#[tokio::main]`.
    let workers = match &options {
        Options::Server(side) | Options::Client(side) => side.workers,
        Options::Local { workers, .. } => *workers,
    };
    let mut builder = if workers == 0 {
        tokio::runtime::Builder::new_current_thread()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        builder.worker_threads(workers);
        builder
    };
    builder.enable_all().build()?.block_on(run(options))
}

async fn run(options: Options) -> Result<(), BoxError> {
    match options {
        Options::Server(side) => serve(side.addr, side.pairs, side.rounds, side.size).await,
        Options::Client(side) => client(side.addr, side.pairs, side.rounds, side.size).await,
        Options::Local {
            addr,
            streams,
            rounds,
            size,
            buffer,
            shared_channels,
            ..
        } => local(addr, streams, rounds, size, buffer, shared_channels).await,
    }
}
