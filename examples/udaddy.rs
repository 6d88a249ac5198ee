//! A peer of librdmacm's `udaddy`: the same flags and the same exchange over unreliable
//! datagrams, so either side can be the C tool.
//!
//! ```text
//! udaddy [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-P udp]
//! ```
//!
//! The server binds port 7174 (fixed, as in udaddy, whose `-p` names a port space), receives
//! `-C` datagrams of `-S` bytes from each of `-c` clients and sends as many back to each. A
//! client resolves the server (a SIDR exchange), sends its datagrams, and receives the
//! replies. 10 datagrams of 100 bytes and one client by default. The server needs `-b`: an
//! rdma-async socket binds to the address of an RDMA device.

#[path = "tool_flags.rs"]
mod tool_flags;
use tool_flags::Command;

use std::collections::HashMap;
use std::ffi::OsString;
use std::io;
use std::net::SocketAddr;
use std::process::ExitCode;

use rdma_async::datagram::{RDatagram, RDatagramOptions};

/// udaddy's port.
const PORT: u16 = 7174;

#[derive(Debug, Clone)]
struct Args {
    server: Option<String>,
    bind: Option<String>,
    connections: usize,
    count: usize,
    size: usize,
}

const USAGE: &str = "usage: udaddy [-s server_address] [-b bind_address] [-c connections] [-C message_count] [-S message_size] [-P udp]";

fn parse_args(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command<Args>, String> {
    let mut args = Args {
        server: None,
        bind: None,
        connections: 1,
        count: 10,
        size: 100,
    };
    let Command::Run(()) = tool_flags::read(argv, |flag, parser| {
        match flag {
            's' => args.server = Some(tool_flags::value(parser, flag)?),
            'b' => args.bind = Some(tool_flags::value(parser, flag)?),
            'c' => args.connections = tool_flags::parsed::<usize>(parser, flag)?.max(1),
            'C' => args.count = tool_flags::parsed(parser, flag)?,
            'S' => args.size = tool_flags::parsed(parser, flag)?,
            'P' | 'p' => {
                let space = tool_flags::value(parser, flag)?;
                if !matches!(space.as_str(), "udp" | "0x0111" | "273") {
                    return Err(format!("port space {space}: only udp is supported"));
                }
            }
            'f' => {
                let format = tool_flags::value(parser, flag)?;
                if !matches!(format.as_str(), "ip" | "name") {
                    return Err(format!("address format {format}: only ip and name"));
                }
            }
            't' => {
                tool_flags::value(parser, flag)?;
                eprintln!("udaddy: -t (type of service) is not supported; ignored");
            }
            _ => return Ok(false),
        }
        Ok(true)
    })?
    else {
        return Ok(Command::Help);
    };
    if args.size == 0 {
        // As udaddy: no payload, no transfers.
        args.count = 0;
    }
    Ok(Command::Run(args))
}

fn options(args: &Args) -> RDatagramOptions {
    // Room for every datagram of the exchange before anyone reads, as udaddy posts them.
    let depth = args.count.saturating_mul(args.connections).max(16);
    RDatagramOptions::new().recv_depth(u32::try_from(depth).unwrap_or(u32::MAX))
}

fn check_size(socket: &RDatagram, args: &Args) -> io::Result<()> {
    if args.count > 0 && args.size > socket.max_datagram() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "message_size {} is larger than active mtu {}",
                args.size,
                socket.max_datagram()
            ),
        ));
    }
    Ok(())
}

async fn run_server(args: &Args) -> io::Result<()> {
    println!("udaddy: starting server");
    let bind = args.bind.as_deref().ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "the server needs -b: the address of an RDMA device",
        )
    })?;
    let socket = RDatagram::bind_with((bind, PORT), &options(args)).await?;
    check_size(&socket, args)?;
    if args.count == 0 {
        return Ok(());
    }
    println!("receiving data transfers");
    let mut received: HashMap<SocketAddr, usize> = HashMap::new();
    let mut buf = vec![0u8; socket.max_datagram()];
    while received.len() < args.connections || received.values().any(|&n| n < args.count) {
        let (_, from) = socket.recv_from(&mut buf).await?;
        *received.entry(from).or_default() += 1;
    }
    println!("sending replies");
    let msg = vec![0u8; args.size];
    for client in received.keys() {
        for _ in 0..args.count {
            socket.send_to(&msg, client).await?;
        }
    }
    println!("data transfers complete");
    Ok(())
}

async fn run_client(args: &Args, server: &str) -> io::Result<()> {
    println!("udaddy: starting client");
    let bind = match &args.bind {
        Some(bind) => bind.clone(),
        // Bind to the address the server's name resolves to: a loopback peer on this device.
        None => tokio::net::lookup_host((server, PORT))
            .await?
            .next()
            .map(|a| a.ip().to_string())
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no server address"))?,
    };
    println!("udaddy: connecting");
    let mut sockets = Vec::new();
    for _ in 0..args.connections {
        let socket = RDatagram::bind_with((bind.as_str(), 0), &options(args)).await?;
        check_size(&socket, args)?;
        socket.connect((server, PORT)).await?;
        sockets.push(socket);
    }
    if args.count > 0 {
        println!("initiating data transfers");
        let msg = vec![0u8; args.size];
        for socket in &sockets {
            for _ in 0..args.count {
                socket.send(&msg).await?;
            }
        }
        println!("receiving data transfers");
        let mut buf = vec![0u8; args.size.max(1)];
        for socket in &sockets {
            for _ in 0..args.count {
                socket.recv(&mut buf).await?;
            }
        }
        println!("data transfers complete");
    }
    Ok(())
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match tool_flags::run_or_exit("udaddy", USAGE, parse_args(tool_flags::from_env()), 1)
    {
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
            println!("udaddy: {e}");
            println!("return status {}", e.raw_os_error().unwrap_or(1));
            ExitCode::from(1)
        }
    }
}
