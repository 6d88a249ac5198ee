//! The low-locked-memory side of the resource-limit tests (`tests/tests/device/limits.rs`),
//! which run it under `prlimit --memlock=...` without `CAP_IPC_LOCK` (`setpriv`), so that its
//! memory registrations hit `RLIMIT_MEMLOCK` as a non-root process's would. It prints one line
//! per outcome (`NAME ok` or `NAME error KIND: MESSAGE`) for the test to check.
//!
//! ```text
//! limits-peer register             an RdmaConnection pair on the test address, then a 4 KiB
//!                                  and a 1 MiB `reg_msgs` and a 1 MiB `register`
//! limits-peer connect-stream ADDR  RStream::connect to ADDR
//! limits-peer serve-stream         an RListener on the test address: prints `listening ADDR`,
//!                                  then accepts (logging warnings to stdout) until killed
//! limits-peer serve-parked RING    an RdmaConnection pair, then an RListener with RING-byte
//!                                  rings on [::] (an accept timeout longer than any test):
//!                                  prints `listening PORT`, echoes what it accepts, and for
//!                                  each `register` line on its input registers 2 MiB on the
//!                                  pair's client (`register-2MiB ...`); ends with its input
//! ```

use std::io;
use std::net::{Ipv6Addr, SocketAddr};
use std::time::Duration;

use rdma_async::cm::CmListener;
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RListener, RStream, RStreamOptions};
use rdma_async_device_tests::test_ip;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_stream::StreamExt;

/// Prints the outcome of one step on a line of its own.
fn report<T>(name: &str, result: &io::Result<T>) {
    match result {
        Ok(_) => println!("{name} ok"),
        Err(e) => println!("{name} error {:?}: {e}", e.kind()),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("register") => register().await,
        Some("connect-stream") => {
            let addr: SocketAddr = args.get(2).expect("ADDR").parse().expect("ADDR");
            report("connect-stream", &RStream::connect(addr).await);
            Ok(())
        }
        Some("serve-stream") => serve_stream().await,
        Some("serve-parked") => {
            serve_parked(args.get(2).expect("RING").parse().expect("RING")).await
        }
        _ => {
            eprintln!(
                "usage: limits-peer register | connect-stream ADDR | serve-stream | \
                 serve-parked RING"
            );
            std::process::exit(2)
        }
    }
}

/// An `RdmaConnection` pair within this process: (server, client).
async fn rdma_pair() -> io::Result<(RdmaConnection, RdmaConnection)> {
    let listener = CmListener::bind(SocketAddr::new(test_ip(), 0)).await?;
    let addr = listener.local_addr().unwrap();
    let opts = RdmaOptions::new();
    let server = async {
        let request = listener.accept_request().await?;
        RdmaConnection::accept(request, &opts).await
    };
    let (server, client) = tokio::join!(server, RdmaConnection::connect_with(addr, &opts));
    Ok((server?, client?))
}

async fn register() -> io::Result<()> {
    let pair = rdma_pair().await;
    report("setup", &pair);
    let (_server, client) = pair?;
    report("reg_msgs-4KiB", &client.reg_msgs(4096));
    report("reg_msgs-1MiB", &client.reg_msgs(1 << 20));
    report("register-1MiB", &client.register(vec![7; 1 << 20]));
    Ok(())
}

async fn serve_stream() -> io::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(io::stdout)
        .with_ansi(false)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .init();
    let listener = RListener::bind(SocketAddr::new(test_ip(), 0)).await?;
    println!("listening {}", listener.local_addr()?);
    loop {
        // Every setup fails under the limit: accept logs it and goes on waiting.
        let (_stream, peer) = listener.accept().await?;
        println!("accepted {peer}");
    }
}

async fn serve_parked(ring: u32) -> io::Result<()> {
    // An established connection of this process, whose registrations must keep working.
    let (_server, client) = rdma_pair().await?;
    let options = RStreamOptions::new()
        .send_buffer_size(ring)
        .recv_buffer_size(ring)
        .accept_timeout(Duration::from_secs(3600));
    let listener =
        RListener::bind_with(SocketAddr::new(Ipv6Addr::UNSPECIFIED.into(), 0), &options).await?;
    println!("listening {}", listener.local_addr()?.port());
    tokio::spawn(async move {
        // Requests this process could not set up are skipped: only the listener's end stops it.
        let mut incoming = listener.into_incoming();
        while let Some(Ok(mut stream)) = incoming.next().await {
            tokio::spawn(async move {
                let mut buf = vec![0; 4096];
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 || stream.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    loop {
        let line = tokio::task::spawn_blocking(|| {
            let mut line = String::new();
            io::stdin().read_line(&mut line).map(|_| line)
        })
        .await
        .expect("the stdin reader")?;
        match line.trim() {
            "" => return Ok(()),
            "register" => report("register-2MiB", &client.reg_msgs(2 << 20)),
            other => println!("unknown command {other:?}"),
        }
    }
}
