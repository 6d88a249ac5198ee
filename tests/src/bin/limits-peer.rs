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
//! ```

use std::io;
use std::net::SocketAddr;

use rdma_async::cm::CmListener;
use rdma_async::rdma::{RdmaConnection, RdmaOptions};
use rdma_async::stream::{RListener, RStream};
use rdma_async_device_tests::test_ip;

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
        _ => {
            eprintln!("usage: limits-peer register | connect-stream ADDR | serve-stream");
            std::process::exit(2)
        }
    }
}

async fn register() -> io::Result<()> {
    let listener = CmListener::bind(SocketAddr::new(test_ip(), 0)).await?;
    let addr = listener.local_addr();
    let opts = RdmaOptions::new();
    let server = async {
        let request = listener.accept_request().await?;
        RdmaConnection::accept(request, &opts).await
    };
    let (server, client) = tokio::join!(server, RdmaConnection::connect(addr, &opts));
    report("setup", &server);
    let (_server, client) = (server?, client?);
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
