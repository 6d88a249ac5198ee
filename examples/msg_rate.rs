//! Message rate at a given queue depth: `Endpoint` sends and `RdmaConnection` RDMA writes of
//! SIZE bytes with up to DEPTH in flight, as perftest's `ib_send_bw -t DEPTH` and
//! `ib_write_bw -t DEPTH` measure the device. `scripts/compare-rate` runs both beside perftest in
//! one boot.
//!
//!     msg_rate server ADDR KIND DEPTH SIZE            serve one client, then report
//!     msg_rate client ADDR KIND DEPTH SIZE COUNT [--batch N]
//!                                                     COUNT messages, then report
//!     msg_rate --help
//!
//! SIZE is at least 8 (the first message carries COUNT). KIND is `send` (an `Endpoint`: the client sends, the server receives every message) or
//! `write` (an `RdmaConnection`: the client RDMA-writes into a region the server advertised,
//! DEPTH writes in flight from DEPTH writers, futures that one task drives through a
//! `FuturesUnordered`, so that what is counted per write is the library's work rather than a
//! Tokio task's scheduling). With `--batch N` (`write` only, N dividing DEPTH) the client
//! keeps DEPTH writes in flight as DEPTH / N batches of N (`RdmaConnection::write_batch`: one
//! list of work requests, one doorbell and one completion per batch). Each side times from its first message to the
//! last, and prints one line: `KIND side depth=.. size=.. msgs=.. secs=.. msgs_per_s=..
//! cpu_us_per_msg=..`.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use futures_util::stream::{FuturesUnordered, StreamExt};
use rdma_async::cm::CmListener;
use rdma_async::endpoint::{Endpoint, EndpointOptions};
use rdma_async::rdma::{
    LocalRegion, RdmaConnection, RdmaOptions, RemoteAccess, RemoteRegion, RemoteSlice,
};

#[path = "common/usage.rs"]
mod usage;
use usage::Usage;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The 8-byte message that tells the client the server has everything (and the count it saw).
const DONE_LEN: usize = 8;

/// What one side measured: its messages, the time they took and the process's cost meanwhile.
struct Measured {
    msgs: u64,
    secs: Duration,
    cost: Option<(Usage, Usage)>,
    /// `ibv_post_send` calls made, where the API counts them.
    post_sends: Option<u64>,
}

impl Measured {
    fn report(&self, kind: &str, side: &str, depth: u32, size: usize) {
        let n = self.msgs.max(1) as f64;
        let (cpu, switches) = self.cost.map_or((0.0, 0.0), |(before, after)| {
            (
                (after.cpu - before.cpu).as_secs_f64() * 1e6 / n,
                (after.switches - before.switches) as f64 / n,
            )
        });
        let posts = self.post_sends.map_or(String::new(), |p| {
            format!(" post_sends_per_msg={:.3}", p as f64 / n)
        });
        println!(
            "{kind} {side} depth={depth} size={size} msgs={} secs={:.3} msgs_per_s={:.0} \
             cpu_us_per_msg={cpu:.2} switches_per_msg={switches:.3}{posts}",
            self.msgs,
            self.secs.as_secs_f64(),
            n / self.secs.as_secs_f64().max(1e-9),
        );
    }
}

fn endpoint_options(depth: u32, size: usize) -> EndpointOptions {
    // The receiver keeps twice the depth posted, so the sender never waits for a receive.
    EndpointOptions::new()
        .max_message_size(size)
        .send_depth(depth.max(1))
        .recv_depth((2 * depth).max(16))
}

async fn serve_send(listener: CmListener, depth: u32, size: usize) -> Result<(), BoxError> {
    let request = listener.accept_request().await?;
    let server = Endpoint::accept(request, &endpoint_options(depth, size)).await?;
    let first = server.recv().await?;
    let count = u64::from_le_bytes(first[..8].try_into()?);
    let (usage, start) = (Usage::now()?, Instant::now());
    for _ in 1..count {
        let msg = server.recv().await?;
        if msg.len() != size {
            return Err(format!("a message of {} bytes, not {size}", msg.len()).into());
        }
    }
    let measured = Measured {
        msgs: count,
        secs: start.elapsed(),
        cost: Some((usage, Usage::now()?)),
        post_sends: None,
    };
    server.send(&count.to_le_bytes()).await?;
    measured.report("send", "server", depth, size);
    server.closed().await?;
    Ok(())
}

async fn client_send(
    addr: SocketAddr,
    depth: u32,
    size: usize,
    count: u64,
) -> Result<(), BoxError> {
    let client = Endpoint::connect_with(addr, &endpoint_options(depth, size)).await?;
    let mut msg = vec![7u8; size];
    msg[..8].copy_from_slice(&count.to_le_bytes());
    let (usage, start) = (Usage::now()?, Instant::now());
    // `send` returns once posted and waits only while `depth` sends are in flight.
    for _ in 0..count {
        client.send(&msg).await?;
    }
    let done = client.recv().await?;
    let measured = Measured {
        msgs: count,
        secs: start.elapsed(),
        cost: Some((usage, Usage::now()?)),
        post_sends: None,
    };
    if done.len() != DONE_LEN || u64::from_le_bytes(done[..].try_into()?) != count {
        return Err("the server did not receive every message".into());
    }
    measured.report("send", "client", depth, size);
    client.disconnect().await?;
    Ok(())
}

async fn serve_write(listener: CmListener, depth: u32, size: usize) -> Result<(), BoxError> {
    let request = listener.accept_request().await?;
    let conn = RdmaConnection::accept(request, &rdma_options(depth)).await?;
    // One slot per task, so concurrent writes never overlap.
    let target = conn.reg_shared(size * depth as usize, RemoteAccess::WRITE)?;
    let mut descriptor = conn.reg_msgs(RemoteRegion::ENCODED_LEN)?;
    descriptor.copy_from_slice(&target.remote().to_bytes());
    let done = conn.reg_msgs(DONE_LEN)?;
    let (received, sent) = tokio::join!(conn.recv(done, ..), conn.send(descriptor, ..));
    sent.0?;
    let (got, done) = received;
    got?;
    let count = u64::from_le_bytes(done[..8].try_into()?);
    // The writes cost this side nothing: it only waited for the client's message.
    let measured = Measured {
        msgs: count,
        secs: Duration::ZERO,
        cost: None,
        post_sends: None,
    };
    measured.report("write", "server", depth, size);
    drop(target);
    conn.close().await;
    Ok(())
}

fn rdma_options(depth: u32) -> RdmaOptions {
    RdmaOptions::new().send_depth(depth.max(2)).recv_depth(4)
}

/// The client of `write`: `depth / batch` writers (`batch` divides `depth`), each with `batch`
/// buffers of its own and as many remote slots, so concurrent writes never overlap, and its
/// share of the `count` writes. One spawned task drives all the writers, as a program keeping
/// `depth` writes in flight would: the count is then the library's work per write, without a
/// Tokio task scheduled per write. It is a spawned task, not `main`'s `block_on` future: a write
/// alone on its queue lets the task's other writers post beside it only from a task. With
/// `batch` 1 each writer awaits one `write` at a time; else one `write_batch` of `batch`.
async fn client_write(
    addr: SocketAddr,
    depth: u32,
    size: usize,
    count: u64,
    batch: u32,
) -> Result<(), BoxError> {
    if !depth.is_multiple_of(batch) {
        return Err(format!("--batch {batch} does not divide the depth {depth}").into());
    }
    let conn = Arc::new(RdmaConnection::connect_with(addr, &rdma_options(depth)).await?);
    let inbox = conn.reg_msgs(RemoteRegion::ENCODED_LEN)?;
    let (got, inbox) = conn.recv(inbox, ..).await;
    got?;
    let remote = RemoteRegion::from_bytes(&inbox)?;
    let (groups, batch) = (u64::from(depth / batch), batch as usize);
    let mut writers = Vec::with_capacity(groups as usize);
    for g in 0..groups {
        let writes = count / groups + u64::from(g < count % groups);
        let mut regions = Vec::with_capacity(batch);
        let mut slots = Vec::with_capacity(batch);
        for j in 0..batch {
            let at = u32::try_from((g as usize * batch + j) * size)?;
            slots.push(remote.slice(at, u32::try_from(size)?)?);
            regions.push(conn.reg_msgs(size)?);
        }
        writers.push(Writer {
            regions,
            slots,
            writes,
        });
    }
    let (usage, start, posts) = (Usage::now()?, Instant::now(), conn.post_send_calls());
    tokio::spawn(drive_writers(conn.clone(), writers, size, batch > 1)).await??;
    let measured = Measured {
        msgs: count,
        secs: start.elapsed(),
        cost: Some((usage, Usage::now()?)),
        post_sends: Some(conn.post_send_calls() - posts),
    };
    let mut done = conn.reg_msgs(DONE_LEN)?;
    done.copy_from_slice(&count.to_le_bytes());
    conn.send(done, ..).await.0?;
    measured.report("write", "client", depth, size);
    Ok(())
}

/// One writer of [`client_write`]: its buffers, the remote slots they go to (one each), and
/// how many writes it makes.
struct Writer {
    regions: Vec<LocalRegion>,
    slots: Vec<RemoteSlice>,
    writes: u64,
}

impl Writer {
    /// Makes the writer's writes on `conn` one `write` at a time, of its one buffer. A future of its own, not a branch of [`Self::write_batches`]: the larger future
    /// of both cost every write some 36 instructions of moves and drop glue.
    async fn write_singly(mut self, conn: &RdmaConnection) -> std::io::Result<()> {
        let (Some(mut region), Some(&slot)) = (self.regions.pop(), self.slots.first()) else {
            return Ok(());
        };
        for _ in 0..self.writes {
            let (wrote, back) = conn.write(region, .., slot).await;
            wrote?;
            region = back;
        }
        Ok(())
    }

    /// Makes the writer's writes of `size` bytes on `conn` as `write_batch`es of all its
    /// buffers (the last may be shorter).
    async fn write_batches(mut self, conn: &RdmaConnection, size: usize) -> std::io::Result<()> {
        let mut left = self.writes;
        while left > 0 {
            let n = left.min(self.regions.len() as u64) as usize;
            let writes = self
                .regions
                .drain(..n)
                .zip(&self.slots)
                .map(|(region, &slot)| (region, 0..size, slot))
                .collect();
            let (wrote, back) = conn.write_batch(writes).await;
            wrote?;
            self.regions.splice(0..0, back);
            left -= n as u64;
        }
        Ok(())
    }
}

/// Runs every writer of [`client_write`] to its end, all driven by the calling task: single
/// writes, or with `batched` `write_batch`es.
async fn drive_writers(
    conn: Arc<RdmaConnection>,
    writers: Vec<Writer>,
    size: usize,
    batched: bool,
) -> std::io::Result<()> {
    let conn = &*conn;
    if batched {
        drive_all(writers.into_iter().map(|w| w.write_batches(conn, size))).await
    } else {
        drive_all(writers.into_iter().map(|w| w.write_singly(conn))).await
    }
}

/// Polls all of `writers` at once, through one `FuturesUnordered`, until each has ended; the
/// first error ends them all.
async fn drive_all<F>(writers: impl Iterator<Item = F>) -> std::io::Result<()>
where
    F: Future<Output = std::io::Result<()>>,
{
    let mut in_flight: FuturesUnordered<F> = writers.collect();
    while let Some(done) = in_flight.next().await {
        done?;
    }
    Ok(())
}

/// Message rate at a queue depth: `Endpoint` sends or `RdmaConnection` RDMA writes of SIZE
/// bytes with up to DEPTH in flight; each side prints one line of `key=value` figures.
#[derive(Debug, Parser)]
#[command(name = "msg_rate")]
enum Options {
    /// Serve one client, then report.
    Server(Shape),
    /// Send COUNT messages, then report.
    Client {
        #[command(flatten)]
        shape: Shape,
        /// Messages to send.
        count: u64,
        /// `write` only: post the writes in batches of this many (dividing DEPTH), each one
        /// list of work requests with one completion.
        #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
        batch: u32,
    },
}

/// What both sides are told: where, what and how much at once.
#[derive(Debug, clap::Args)]
struct Shape {
    /// The server's address and port: where it listens, or where the client connects.
    addr: SocketAddr,
    kind: Kind,
    /// Messages in flight.
    #[arg(value_parser = clap::value_parser!(u32).range(1..))]
    depth: u32,
    /// Bytes per message; at least 8, as the first message carries COUNT.
    #[arg(value_parser = clap::value_parser!(u64).range(DONE_LEN as u64..))]
    size: u64,
}

/// How messages travel.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Kind {
    /// An `Endpoint`: the client sends, the server receives every message.
    Send,
    /// An `RdmaConnection`: the client RDMA-writes into a region the server advertised.
    Write,
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() {
    let result = match Options::parse() {
        Options::Server(Shape {
            addr,
            kind,
            depth,
            size,
        }) => match CmListener::bind(addr).await {
            Ok(listener) => {
                if let Ok(local) = listener.local_addr() {
                    println!("listening on {local}");
                }
                match kind {
                    Kind::Send => serve_send(listener, depth, size as usize).await,
                    Kind::Write => serve_write(listener, depth, size as usize).await,
                }
            }
            Err(e) => Err(e.into()),
        },
        Options::Client {
            shape,
            count,
            batch,
        } => {
            let (addr, depth, size) = (shape.addr, shape.depth, shape.size as usize);
            match shape.kind {
                Kind::Send if batch > 1 => Err("--batch is for `write`".into()),
                Kind::Send => client_send(addr, depth, size, count).await,
                Kind::Write => client_write(addr, depth, size, count, batch).await,
            }
        }
    };
    if let Err(e) = result {
        eprintln!("msg_rate: {e}");
        std::process::exit(1);
    }
}
