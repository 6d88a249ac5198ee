//! Streams from registered memory without a copy: the client fills buffers from a registered
//! pool and hands each to `RStream::write_region`, which RDMA-writes it straight into the
//! server's receive ring. On the wire it is ordinary rsockets data: the server is a plain
//! `RStream` reader (a C rsockets peer would do as well).
//!
//!     zero_copy server ADDR                 read one stream to its end, then report
//!     zero_copy client ADDR MIB [CHUNK]     send MIB MiB in CHUNK-byte regions (default 256 KiB)
//!
//! Both print the byte count and an FNV-1a checksum; the client also prints how many bytes went
//! by zero copy and its throughput.

use std::io;
use std::net::SocketAddr;
use std::time::Instant;

use rdma_async::device::PoolOptions;
use rdma_async::stream::{RListener, RStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[path = "common/fnv.rs"]
mod fnv;
use fnv::{FNV_OFFSET, fnv1a};

async fn server(addr: SocketAddr) -> Result<(), BoxError> {
    let listener = RListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let (mut stream, _) = listener.accept().await?;
    let mut buf = vec![0; 1 << 20];
    let (mut total, mut checksum) = (0u64, FNV_OFFSET);
    loop {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        total += n as u64;
        checksum = fnv1a(checksum, &buf[..n]);
    }
    println!("received {total} bytes fnv1a={checksum:016x}");
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

fn usage() -> ! {
    eprintln!("usage: zero_copy server ADDR | zero_copy client ADDR MIB [CHUNK]");
    std::process::exit(2)
}

#[rdma_async::main]
async fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let parse_addr = |s: &str| -> SocketAddr { s.parse().unwrap_or_else(|_| usage()) };
    let number = |s: &str| -> usize { s.parse().unwrap_or_else(|_| usage()) };
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>()[..] {
        ["server", addr] => server(parse_addr(addr)).await,
        ["client", addr, mib] => client(parse_addr(addr), number(mib), 256 << 10).await,
        ["client", addr, mib, chunk] => client(parse_addr(addr), number(mib), number(chunk)).await,
        _ => usage(),
    };
    if let Err(e) = result {
        eprintln!("zero_copy: {e}");
        std::process::exit(1);
    }
    let _ = io::Write::flush(&mut io::stdout());
}
