//! A peer of librdmacm's `ucmatose`: the same flags and the same exchange, so either side can be
//! the C tool.
//!
//! ```text
//! cmatose [-s server_address] [-b bind_address] [-p port] [-c connections] [-C message_count] [-S message_size]
//! ```
//!
//! The server accepts `-c` connections, sends `-C` messages of `-S` bytes on each, receives as
//! many back, and disconnects. The client receives first, then replies, then waits for the
//! server's disconnect. Port 7471, 10 messages of 100 bytes and one connection by default.

#[path = "tool_flags.rs"]
mod tool_flags;
use tool_flags::Command;

use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use rdma_async::cm::CmListener;
use rdma_async::endpoint::{Endpoint, EndpointOptions};

#[derive(Debug, Clone)]
struct Args {
    server: Option<String>,
    bind: Option<String>,
    port: u16,
    connections: usize,
    count: usize,
    size: usize,
}

const USAGE: &str = "usage: cmatose [-s server_address] [-b bind_address] [-p port] [-c connections] [-C message_count] [-S message_size]";

fn parse_args(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command<Args>, String> {
    let mut args = Args {
        server: None,
        bind: None,
        port: 7471,
        connections: 1,
        count: 10,
        size: 100,
    };
    let Command::Run(()) = tool_flags::read(argv, |flag, parser| {
        match flag {
            's' => args.server = Some(tool_flags::value(parser, flag)?),
            'b' => args.bind = Some(tool_flags::value(parser, flag)?),
            'p' => args.port = tool_flags::parsed(parser, flag)?,
            'c' => args.connections = tool_flags::parsed(parser, flag)?,
            'C' => args.count = tool_flags::parsed(parser, flag)?,
            'S' => args.size = tool_flags::parsed(parser, flag)?,
            _ => return Ok(false),
        }
        Ok(true)
    })?
    else {
        return Ok(Command::Help);
    };
    Ok(Command::Run(args))
}

fn options(args: &Args) -> EndpointOptions {
    // Room for every message of the exchange before the other side reads.
    let depth = u32::try_from(args.count.max(1)).unwrap_or(u32::MAX);
    EndpointOptions::new()
        .max_message_size(args.size.max(1))
        .send_depth(depth)
        .recv_depth(depth)
}

async fn run_server(args: &Args) -> io::Result<()> {
    println!("cmatose: starting server");
    let bind = args.bind.as_deref().unwrap_or("0.0.0.0");
    let listener = CmListener::bind((bind, args.port)).await?;
    let mut endpoints = Vec::new();
    for _ in 0..args.connections {
        let request = listener.accept_request().await?;
        endpoints.push(Endpoint::accept(request, &options(args)).await?);
    }
    if args.count > 0 {
        println!("initiating data transfers");
        let msg = vec![0u8; args.size];
        for ep in &endpoints {
            for _ in 0..args.count {
                ep.send(&msg).await?;
            }
        }
        println!("receiving data transfers");
        for ep in &endpoints {
            for _ in 0..args.count {
                ep.recv().await?;
            }
        }
        println!("data transfers complete");
    }
    println!("cmatose: disconnecting");
    for ep in &endpoints {
        ep.disconnect().await?;
    }
    println!("disconnected");
    Ok(())
}

async fn run_client(args: &Args, server: &str) -> io::Result<()> {
    println!("cmatose: starting client");
    let mut opts = options(args);
    if let Some(bind) = &args.bind {
        let addr: SocketAddr = format!("{bind}:0").parse().map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("bad bind address {bind}: {e}"),
            )
        })?;
        opts = opts.bind(addr);
    }
    println!("cmatose: connecting");
    let mut endpoints = Vec::new();
    for _ in 0..args.connections {
        endpoints.push(Endpoint::connect_with((server, args.port), &opts).await?);
    }
    if args.count > 0 {
        println!("receiving data transfers");
        for ep in &endpoints {
            for _ in 0..args.count {
                ep.recv().await?;
            }
        }
        println!("sending replies");
        let msg = vec![0u8; args.size];
        for ep in &endpoints {
            for _ in 0..args.count {
                ep.send(&msg).await?;
            }
        }
        println!("data transfers complete");
    }
    for ep in &endpoints {
        ep.closed().await?;
    }
    Ok(())
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args =
        match tool_flags::run_or_exit("cmatose", USAGE, parse_args(tool_flags::from_env()), 1) {
            Ok(args) => args,
            Err(status) => return status,
        };
    let result = match &args.server {
        Some(server) => run_client(&args, server).await,
        None => run_server(&args).await,
    };
    println!("test complete");
    match result {
        Ok(()) => {
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cmatose: {e}");
            println!("return status {}", e.raw_os_error().unwrap_or(1));
            ExitCode::from(1)
        }
    }
}
