//! Serves a file by RDMA read: the server maps it read-only and registers the mapping (no copy
//! into a buffer: the device reads the page cache), then tells the client where it is; the client
//! pulls it with RDMA reads into pooled registered buffers, with no server CPU per byte.
//!
//!     serve_file server ADDR FILE         serve FILE to one client, then exit
//!     serve_file client ADDR OUT [CHUNK]  fetch the file into OUT, CHUNK bytes per RDMA read
//!                                         (default 1 MiB)
//!     serve_file --help
//!
//! The server sends one message: the file's remote descriptor (`RemoteRegion::to_bytes`, 16
//! bytes). The client reads, writes OUT, and answers with one message when done, so the server
//! keeps the region registered exactly as long as it is needed. Both print the length and an
//! FNV-1a checksum of the bytes.

use std::fs::File;
use std::io::{self, Write};
use std::net::SocketAddr;
use std::time::Instant;

use clap::Parser;
use rdma_async::cm::CmListener;
use rdma_async::device::PoolOptions;
use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteRegion};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

#[path = "common/fnv.rs"]
mod fnv;
use fnv::{FNV_OFFSET, fnv1a};

async fn server(addr: SocketAddr, path: &str) -> Result<(), BoxError> {
    let file = File::open(path)?;
    let len = usize::try_from(file.metadata()?.len())?;
    let listener = CmListener::bind(addr).await?;
    println!("listening on {}", listener.local_addr()?);
    let request = listener.accept_request().await?;
    let conn = RdmaConnection::accept(request, &RdmaOptions::new()).await?;
    // Registered in the connection's device context, readable by the peer only.
    let region = conn.context().map_file(&file, 0, len)?;
    let mut checksum = FNV_OFFSET;
    let mut chunk = vec![0; 1 << 20];
    for start in (0..len).step_by(chunk.len()) {
        let part = &mut chunk[..(len - start).min(1 << 20)];
        region.read_at(start, part)?;
        checksum = fnv1a(checksum, part);
    }
    let mut descriptor = conn.reg_msgs(RemoteRegion::ENCODED_LEN)?;
    descriptor.copy_from_slice(&region.remote().to_bytes());
    let done = conn.reg_msgs(1)?;
    // Post the receive for "done" before the client can send it.
    let (done, sent) = tokio::join!(conn.recv(done, ..), conn.send(descriptor, ..));
    sent.0?;
    done.0?;
    println!("served {len} bytes fnv1a={checksum:016x}");
    drop(region);
    conn.close().await;
    Ok(())
}

async fn client(addr: SocketAddr, out: &str, chunk: usize) -> Result<(), BoxError> {
    let conn = RdmaConnection::connect_with(addr, &RdmaOptions::new()).await?;
    let inbox = conn.reg_msgs(RemoteRegion::ENCODED_LEN)?;
    let (got, inbox) = conn.recv(inbox, ..).await;
    got?;
    let remote = RemoteRegion::from_bytes(&inbox)?;
    let pool = conn.context().buffer_pool(
        &PoolOptions::new()
            .size_classes([chunk])
            .max_bytes(4 * chunk),
    )?;
    let mut file = File::create(out)?;
    let mut checksum = FNV_OFFSET;
    let started = Instant::now();
    let total = remote.len();
    let mut offset = 0u32;
    while offset < total {
        let len = (total - offset).min(u32::try_from(chunk)?);
        let buffer = pool.get(len as usize).await?;
        let (read, buffer) = conn
            .read(buffer, ..len as usize, remote.slice(offset, len)?)
            .await;
        read?;
        let bytes = &buffer[..len as usize];
        checksum = fnv1a(checksum, bytes);
        file.write_all(bytes)?;
        offset += len;
    }
    file.sync_all()?;
    let secs = started.elapsed().as_secs_f64();
    let done = conn.reg_msgs(1)?;
    conn.send(done, ..).await.0?;
    let stats = pool.stats();
    println!(
        "fetched {total} bytes fnv1a={checksum:016x} in {secs:.3} s ({:.1} MiB/s), {} reads, \
         {} pool slabs",
        f64::from(total) / secs / (1 << 20) as f64,
        stats.handed_out,
        stats.slabs
    );
    conn.close().await;
    Ok(())
}

/// Serves a file by RDMA read (the server registers a read-only mapping of it), or fetches it
/// with RDMA reads.
#[derive(Debug, Parser)]
#[command(name = "serve_file")]
enum Options {
    /// Serve FILE to one client, then exit.
    Server {
        /// The address and port to listen on.
        addr: SocketAddr,
        /// The file to serve.
        file: String,
    },
    /// Fetch the file into OUT, CHUNK bytes per RDMA read.
    Client {
        /// The server's address and port.
        addr: SocketAddr,
        /// Where to write the file.
        out: String,
        /// Bytes per RDMA read.
        #[arg(default_value_t = 1 << 20)]
        chunk: usize,
    },
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() {
    let result = match Options::parse() {
        Options::Server { addr, file } => server(addr, &file).await,
        Options::Client { addr, out, chunk } => client(addr, &out, chunk).await,
    };
    if let Err(e) = result {
        eprintln!("serve_file: {e}");
        io::stderr().flush().ok();
        std::process::exit(1);
    }
}
