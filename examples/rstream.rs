//! A peer of librdmacm's `rstream`: the same flags, the same exchange and the same result table,
//! so either side can be the C tool and the two can be compared line for line.
//!
//! ```text
//! rstream [-s server_address] [-b bind_address] [-p port] [-f ip|ipv6]
//!         [-S transfer_size|all] [-C transfer_count] [-I iterations]
//!         [-B buffer_size] [-i inline_size] [-k keepalive_seconds] [-T s|b|n|v|a|r ...]
//! ```
//!
//! Without `-s` it is the server: it listens on `-b` (0.0.0.0 by default), port `-p` (7471).
//! With `-s` it is the client and connects there (from `-b` if given, on an ephemeral port).
//!
//! - Default run (none of `-S size`, `-C`, `-I`): two connections in turn. The first runs a
//!   latency test per size (one transfer each way, many iterations), the second a bandwidth
//!   test per size (many transfers each way, one iteration). Sizes are 64 B, 4 KiB, 64 KiB and
//!   1 MiB, or all 33 with `-S all`; the repetitions come from the size (100 000 below 1 KiB,
//!   10 000 below 64 KiB, 1 000 below 1 MiB, 100 above).
//! - Custom run: one connection, one test of `-I` iterations (default 1) of `-C` transfers
//!   (default 1000) of `-S` bytes (default 1000) each way.
//!
//! `-T` options, repeatable: `s` kernel TCP instead of RDMA streams; `b` blocking (awaited)
//! transfers; `n` non-blocking busy-polled transfers (the default; the last of `b`/`n` wins);
//! `v` verify the data (a byte counter per direction, continuous over the whole process); `z`
//! send from a registered region without a copy, `l` receive by borrowing the bytes in the
//! receive ring without a copy (both rdma-async only: `write_region`, `read_lent`). `a`
//! and `r` are accepted without effect, `f` (fork) is refused. `-B` sets SO_SNDBUF/SO_RCVBUF
//! (512 KiB by default, as in the C tool), `-i` the RDMA inline size of the latency connection,
//! `-k` TCP keepalive.
//!
//! Side by side with the C tool over kernel TCP:
//!
//! ```text
//! rstream -T s -b 127.0.0.1 -T v -S 4096 -C 100 -I 10
//! cargo run -p rdma-async-examples --example rstream -- -T s -s 127.0.0.1 -T v -S 4096 -C 100 -I 10
//! ```
//!
//! Without `-T s` it uses rdma-async's `RStream`, which speaks rsockets' wire protocol, so it
//! runs against the C tool over RDMA too (`scripts/compare` runs both, and TCP, in one table).
//! With `RDMA_ASYNC_STATS=1` it prints what the stream cost per message sent (work requests,
//! `ibv_post_send` calls, completions). `RDMA_ASYNC_BUSY_POLL_US=N` sets the stream's busy-poll
//! window to N µs (0: none), as C rsockets' `/etc/rdma/rsocket/polling_time` does for `rstream`
//! (`scripts/count-instructions` turns both off).

#[path = "rstream/exchange.rs"]
mod exchange;
#[path = "rstream/options.rs"]
mod options;
#[path = "rstream/pattern.rs"]
mod pattern;
#[path = "rstream/plan.rs"]
mod plan;
#[path = "rstream/report.rs"]
mod report;
#[path = "tool_flags.rs"]
mod tool_flags;
#[path = "rstream/transport.rs"]
mod transport;

use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use tokio::io::AsyncWriteExt;

use exchange::{Transfers, run_client, run_server};
use options::Options;
use plan::Test;
use transport::{Connection, Listener, StreamOptions};

/// rstream.c's socket buffer size when `-B` is not given.
const DEFAULT_BUFFER_SIZE: usize = 1 << 19;

/// What a connection is tuned for; rstream.c sets the rsockets inline size from it.
#[derive(Debug, Clone, Copy)]
enum Tuning {
    Latency,
    Bandwidth,
    Custom,
}

/// This side of the connections: the server's listener, kept for both connections of the
/// default run, or the client's addresses.
#[derive(Debug)]
enum Peer {
    Server(Listener),
    Client {
        dst: SocketAddr,
        src: Option<SocketAddr>,
    },
}

impl Peer {
    /// Resolves and, for the server, listens: rstream.c does this before printing the header.
    async fn new(opts: &Options) -> io::Result<Self> {
        match &opts.server {
            None => {
                let addr = match &opts.bind {
                    Some(host) => transport::resolve(host, opts.port, opts.numeric_host).await?,
                    None => transport::any_address(opts.port),
                };
                Ok(Peer::Server(Listener::bind(opts.backend, addr).await?))
            }
            Some(host) => {
                let dst = transport::resolve(host, opts.port, opts.numeric_host).await?;
                // rstream.c binds the client to -b *and the -p port*, which collides with a
                // server on the same host and with the default run's own first connection;
                // an ephemeral port avoids both and changes nothing on the wire.
                let src = match &opts.bind {
                    Some(host) => Some(transport::resolve(host, 0, opts.numeric_host).await?),
                    None => None,
                };
                Ok(Peer::Client { dst, src })
            }
        }
    }

    async fn open(&self, opts: &Options, tuning: Tuning) -> io::Result<Connection> {
        let stream_opts = StreamOptions {
            buffer_size: match opts.buffer_size {
                0 => DEFAULT_BUFFER_SIZE,
                n => n,
            },
            inline_size: match tuning {
                Tuning::Latency => Some(opts.inline_size),
                Tuning::Bandwidth => Some(0),
                Tuning::Custom => None,
            },
            keepalive: (opts.keepalive != 0).then_some(opts.keepalive),
            lent_reads: opts.lent_reads,
        };
        match self {
            Peer::Server(listener) => listener.accept(&stream_opts).await,
            Peer::Client { dst, src } => {
                transport::connect(opts.backend, *dst, *src, &stream_opts).await
            }
        }
    }

    fn is_client(&self) -> bool {
        matches!(self, Peer::Client { .. })
    }
}

/// One connection: opens it, runs `tests` on it in order, printing a line for each, and shuts
/// it down.
async fn session(
    peer: &Peer,
    opts: &Options,
    tuning: Tuning,
    xfers: &mut Transfers,
    tests: &[Test],
) -> io::Result<()> {
    // The one place that knows the concrete stream types; everything below is generic.
    match peer.open(opts, tuning).await? {
        Connection::Tcp(mut stream) => run_tests(&mut stream, peer.is_client(), xfers, tests).await,
        Connection::Rdma(mut stream) => {
            xfers.lent_reads = opts.lent_reads;
            if opts.zero_copy {
                // Registered in the stream's device context, as write_region requires.
                xfers.zero_copy = Some(stream.context().reg_msgs(xfers.max_size())?);
            }
            run_tests(&mut stream, peer.is_client(), xfers, tests).await?;
            xfers.zero_copy = None;
            report_stats(&stream, tests);
            Ok(())
        }
    }
}

/// With `RDMA_ASYNC_STATS=1`, prints to stderr what the stream cost per message it sent:
/// work requests posted, `ibv_post_send` calls and signaled completions; and how often its
/// writer waited, for the peer's room or for its own sends.
fn report_stats(stream: &transport::RdmaStream, tests: &[Test]) {
    if std::env::var_os("RDMA_ASYNC_STATS").is_none_or(|v| v != "1") {
        return;
    }
    let stats = stream.stats();
    // Messages this side sent: the application writes of every test, and the 16-byte sync.
    let messages = 1 + tests.iter().map(|t| t.count * t.iterations).sum::<usize>() as u64;
    let per = |n: u64| n as f64 / messages as f64;
    eprintln!(
        "stats: {messages} messages sent; per message: {:.2} work requests ({:.2} data + {:.2} control), {:.2} ibv_post_send calls, {:.2} signaled send completions, {:.2} receive completions; writer waits: {} for the peer, {} for its sends",
        per(stats.data_writes + stats.control_writes),
        per(stats.data_writes),
        per(stats.control_writes),
        per(stats.post_send_calls),
        per(stats.send_completions),
        per(stats.recv_completions),
        stats.writer_waits_for_peer,
        stats.writer_waits_for_sends,
    );
}

async fn run_tests<S: exchange::Stream>(
    stream: &mut S,
    client: bool,
    xfers: &mut Transfers,
    tests: &[Test],
) -> io::Result<()> {
    for test in tests {
        let elapsed = if client {
            run_client(stream, xfers, test).await?
        } else {
            run_server(stream, xfers, test).await?
        };
        println!("{}", report::perf_line(test, elapsed));
    }
    // rstream.c shuts down both directions and closes, ignoring the result: all data has been
    // read by then, and a peer that closed first makes the shutdown fail harmlessly.
    let _ = stream.shutdown().await;
    Ok(())
}

async fn run(opts: &Options) -> io::Result<()> {
    let buffer_size = if opts.custom {
        opts.size
    } else {
        plan::largest_default_size()
    };
    // Created once: the -T v counters continue from one connection to the next.
    let mut xfers = Transfers::new(opts.mode, opts.verify, buffer_size)?;
    let peer = Peer::new(opts).await?;
    println!("{}", report::header());
    if opts.custom {
        let test = Test::custom(opts.size, opts.count, opts.iterations);
        session(&peer, opts, Tuning::Custom, &mut xfers, &[test]).await
    } else {
        let sizes = plan::test_sizes(opts.all_sizes);
        let latency: Vec<_> = sizes.iter().map(|&s| Test::latency(s)).collect();
        session(&peer, opts, Tuning::Latency, &mut xfers, &latency).await?;
        let bandwidth: Vec<_> = sizes.iter().map(|&s| Test::bandwidth(s)).collect();
        session(&peer, opts, Tuning::Bandwidth, &mut xfers, &bandwidth).await
    }
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let opts = match tool_flags::run_or_exit(
        "rstream",
        options::USAGE,
        options::parse(tool_flags::from_env()),
        1,
    ) {
        Ok(opts) => opts,
        Err(status) => return status,
    };
    for note in &opts.notes {
        eprintln!("rstream: {note}");
    }
    match run(&opts).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rstream: {e}");
            ExitCode::from(1)
        }
    }
}
