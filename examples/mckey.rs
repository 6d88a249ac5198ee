//! A peer of librdmacm's `mckey`: the same flags and the same exchange over multicast, so
//! either side can be the C tool.
//!
//! ```text
//! mckey -m multicast_address -b bind_address [-s] [-c connections] [-C message_count] [-S message_size]
//! ```
//!
//! Each of `-c` sockets joins the group. A sender (`-s`) then waits 3 s, as mckey does (for an
//! InfiniBand subnet manager to program the switches), and sends `-C` datagrams of `-S` bytes
//! to the group; a receiver waits for `-C` datagrams. Both leave the group at the end. 10
//! datagrams of 100 bytes by default. `-b` is required: an rdma-async socket binds to the
//! address of an RDMA device. IPv6 groups need InfiniBand or RoCE v1 (the kernel refuses them
//! on RoCE v2). mckey's `-M` (unmapped address), `-o` (send-only join) and `-l` (no loopback)
//! are not supported.

#[path = "tool_flags.rs"]
mod tool_flags;
use tool_flags::Command;

use std::ffi::OsString;
use std::io;
use std::net::IpAddr;
use std::process::ExitCode;
use std::time::Duration;

use rdma_async::datagram::{RDatagram, RDatagramOptions};

#[derive(Debug, Clone)]
struct Args {
    group: Option<IpAddr>,
    bind: Option<String>,
    sender: bool,
    connections: usize,
    count: usize,
    size: usize,
}

const USAGE: &str = "usage: mckey -m multicast_address -b bind_address [-s] [-c connections] [-C message_count] [-S message_size] [-p port_space]";

fn parse_args(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command<Args>, String> {
    let mut args = Args {
        group: None,
        bind: None,
        sender: false,
        connections: 1,
        count: 10,
        size: 100,
    };
    let Command::Run(()) = tool_flags::read(argv, |flag, parser| {
        match flag {
            'm' => args.group = Some(tool_flags::parsed(parser, flag)?),
            'b' => args.bind = Some(tool_flags::value(parser, flag)?),
            's' => args.sender = true,
            'c' => args.connections = tool_flags::parsed::<usize>(parser, flag)?.max(1),
            'C' => args.count = tool_flags::parsed(parser, flag)?,
            'S' => args.size = tool_flags::parsed(parser, flag)?,
            'p' => {
                let space = tool_flags::value(parser, flag)?;
                if !matches!(space.as_str(), "0x0111" | "273") {
                    return Err(format!(
                        "port space {space}: only UDP (0x0111) is supported"
                    ));
                }
            }
            'M' | 'o' | 'l' => return Err(format!("-{flag} is not supported")),
            _ => return Ok(false),
        }
        Ok(true)
    })?
    else {
        return Ok(Command::Help);
    };
    if args.size == 0 {
        args.count = 0;
    }
    Ok(Command::Run(args))
}

async fn run(args: &Args) -> io::Result<()> {
    let invalid = |msg: &str| io::Error::new(io::ErrorKind::InvalidInput, msg.to_owned());
    let group = args
        .group
        .ok_or_else(|| invalid("-m multicast_address is required"))?;
    let bind = args
        .bind
        .as_deref()
        .ok_or_else(|| invalid("-b bind_address is required"))?;
    println!(
        "mckey: starting {}",
        if args.sender { "client" } else { "server" }
    );
    let depth = u32::try_from(args.count.max(16)).unwrap_or(u32::MAX);
    let options = RDatagramOptions::new().recv_depth(depth);
    println!("mckey: joining");
    let mut sockets = Vec::new();
    for _ in 0..args.connections {
        let socket = RDatagram::bind_with((bind, 0), &options).await?;
        if args.count > 0 && args.size > socket.max_datagram() {
            return Err(invalid(&format!(
                "message_size {} is larger than active mtu {}",
                args.size,
                socket.max_datagram()
            )));
        }
        socket.join_multicast(group).await?;
        println!("mckey: joined group {group}");
        sockets.push(socket);
    }
    let result = exchange(args, group, &sockets).await;
    for socket in &sockets {
        if let Err(e) = socket.leave_multicast(group) {
            println!("mckey: failure leaving: {e}");
        }
    }
    result
}

async fn exchange(args: &Args, group: IpAddr, sockets: &[RDatagram]) -> io::Result<()> {
    if args.count == 0 {
        return Ok(());
    }
    if args.sender {
        // mckey's pause after joining, for the fabric to be ready.
        tokio::time::sleep(Duration::from_secs(3)).await;
        println!("initiating data transfers");
        let msg = vec![0u8; args.size];
        for socket in sockets {
            for _ in 0..args.count {
                socket.send_to(&msg, (group, 0)).await?;
            }
        }
    } else {
        println!("receiving data transfers");
        let mut buf = vec![0u8; args.size.max(1)];
        for socket in sockets {
            for _ in 0..args.count {
                socket.recv_from(&mut buf).await?;
            }
        }
    }
    println!("data transfers complete");
    Ok(())
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = match tool_flags::run_or_exit("mckey", USAGE, parse_args(tool_flags::from_env()), 1)
    {
        Ok(args) => args,
        Err(status) => return status,
    };
    let result = run(&args).await;
    println!("test complete");
    match result {
        Ok(()) => {
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("mckey: {e}");
            println!("return status {}", e.raw_os_error().unwrap_or(1));
            ExitCode::from(1)
        }
    }
}
