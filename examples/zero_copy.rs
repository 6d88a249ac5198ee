//! Streams without a copy on either side: the client fills buffers from a registered pool and
//! hands each to `RStream::write_region`, which RDMA-writes it straight into the server's
//! receive ring; the server borrows the bytes where they landed (`RStream::read_lent_exact`,
//! with `RStreamOptions::zero_copy_reads`) and checksums them in place. On the wire it is
//! ordinary rsockets data (a C rsockets peer could be either side of it, speaking this framing:
//! an 8-byte little-endian length, then the bytes).
//!
//!     zero_copy server ADDR                 read one stream to its end, then report
//!     zero_copy client ADDR MIB [CHUNK]     send MIB MiB in CHUNK-byte regions (default 256 KiB)
//!     zero_copy --help
//!
//! Both print the byte count and an FNV-1a checksum; the client also prints how many bytes went
//! by zero copy and its throughput, the server how many it read without a copy.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use clap::Parser;
use rdma_async::device::PoolOptions;
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[path = "common/fnv.rs"]
mod fnv;
use fnv::{FNV_OFFSET, fnv1a};

async fn server(addr: SocketAddr) -> Result<(), BoxError> {
    let listener = RListener::bind_with(addr, &RStreamOptions::new().zero_copy_reads(true)).await?;
    println!("listening on {}", listener.local_addr()?);
    let (mut stream, _) = listener.accept().await?;
    let mut len = [0u8; 8];
    stream.read_exact(&mut len).await?;
    let total = u64::from_le_bytes(len);
    let (mut received, mut checksum) = (0u64, FNV_OFFSET);
    while received < total {
        let want = usize::try_from(total - received).unwrap_or(usize::MAX);
        // Up to the end of a half of the ring; in place when the ring allows it.
        let piece = stream.read_lent_exact(want).await?;
        checksum = fnv1a(checksum, &piece);
        received += piece.len() as u64;
    }
    let mut rest = [0u8; 1];
    if stream.read(&mut rest).await? != 0 {
        return Err("the client sent more than it announced".into());
    }
    println!(
        "received {received} bytes fnv1a={checksum:016x} lent_bytes={}",
        stream.stats().lent_bytes
    );
    Ok(())
}

async fn client(addr: SocketAddr, mib: usize, chunk: usize) -> Result<(), BoxError> {
    let mut stream = RStream::connect(addr).await?;
    // `write_region` hands the region back once the device is done with it, so one registered
    // buffer, reused, carries the whole stream.
    let pool = stream
        .context()
        .buffer_pool(&PoolOptions::new().size_classes([chunk]).max_bytes(chunk))?;
    let total = mib << 20;
    let (mut sent, mut checksum) = (0usize, FNV_OFFSET);
    let started = Instant::now();
    stream.write_all(&(total as u64).to_le_bytes()).await?;
    while sent < total {
        let len = (total - sent).min(chunk);
        let mut region = pool.get(len).await?;
        for (i, b) in region[..len].iter_mut().enumerate() {
            *b = ((sent + i) % 251) as u8;
        }
        checksum = fnv1a(checksum, &region[..len]);
        let (written, region) = stream.write_region(region, ..len).await;
        written?;
        // Back to the pool (None only if a failed post left the device owning it).
        drop(region);
        sent += len;
    }
    stream.shutdown().await?;
    let secs = started.elapsed().as_secs_f64();
    println!(
        "sent {sent} bytes fnv1a={checksum:016x} zero_copy_bytes={} in {secs:.3} s \
         ({:.1} MiB/s)",
        stream.stats().zero_copy_bytes,
        sent as f64 / secs / (1 << 20) as f64
    );
    Ok(())
}

/// Streams without a copy on either side: the client RDMA-writes registered regions into the
/// server's receive ring, the server reads them where they landed.
#[derive(Debug, Parser)]
#[command(name = "zero_copy")]
enum Options {
    /// Read one stream to its end, then report.
    Server {
        /// The address and port to listen on.
        addr: SocketAddr,
    },
    /// Send MIB MiB in CHUNK-byte regions.
    Client {
        /// The server's address and port.
        addr: SocketAddr,
        /// MiB to send.
        mib: usize,
        /// Bytes per registered region written.
        #[arg(default_value_t = 256 << 10)]
        chunk: usize,
    },
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() {
    let result = match Options::parse() {
        Options::Server { addr } => server(addr).await,
        Options::Client { addr, mib, chunk } => client(addr, mib, chunk).await,
    };
    if let Err(e) = result {
        eprintln!("zero_copy: {e}");
        std::process::exit(1);
    }
    let _ = io::Write::flush(&mut io::stdout());
}
