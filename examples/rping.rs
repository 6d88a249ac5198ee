//! A peer of librdmacm's `rping`: the same flags, the same wire protocol, so either side can be
//! the C tool.
//!
//! ```text
//! rping -s [-vVdP] [-S size] [-C count] [-a addr] [-p port] [-t tos]
//! rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port] [-t tos]
//! ```
//!
//! Each ping: the client fills its start buffer with `rdma-ping-N: ` and a rotating run of
//! letters, and sends the buffer's descriptor (the 16-byte `rping_rdma_info`: address, rkey,
//! size, big-endian). The server RDMA-reads the buffer, answers "go ahead", receives the
//! descriptor of the client's sink buffer, RDMA-writes the ping data into it, and answers "go
//! ahead" again. With `-V` the client checks that the sink holds exactly what it sent. The client
//! disconnects after `-C` pings (forever without `-C`); the server serves one client (`-P`: one
//! after another, for ever). Port 7174 and 64-byte pings by default.

#[path = "tool_flags.rs"]
mod tool_flags;
pub use tool_flags::Command;

use std::ffi::OsString;
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use rdma_async::cm::{CmListener, ConnParams, IdOptions, ListenerOptions};
use rdma_async::rdma::{LocalRegion, RdmaConnection, RdmaOptions, RemoteRegion, SharedRegion};

/// rping's `RPING_BUFSIZE`: pings are smaller than this.
const MAX_SIZE: usize = 64 * 1024;
/// rping's `RPING_MIN_BUFSIZE`: room for the "rdma-ping-%d: " prefix with any count.
const MIN_SIZE: usize = 26;
const INFO_LEN: usize = RemoteRegion::ENCODED_LEN;

/// The command line (public so the device tests can run this program's code in-process).
#[derive(Debug, Clone)]
pub struct Args {
    server: bool,
    addr: Option<IpAddr>,
    bind: Option<IpAddr>,
    port: u16,
    count: Option<u64>,
    size: usize,
    verbose: bool,
    validate: bool,
    debug: bool,
    persistent: bool,
    tos: Option<u8>,
}

const USAGE: &str = "\
usage: rping -s [-vVdP] [-S size] [-C count] [-a addr] [-p port] [-t tos]
       rping -c [-vVd] [-S size] [-C count] [-I addr] -a addr [-p port] [-t tos]";

/// rping's option string `a:I:Pp:C:S:t:scvVdq`, read as getopt reads it: flags may be grouped
/// (`-vV`) and values attached (`-C10`) or separate (`-C 10`).
pub fn parse_args(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command<Args>, String> {
    let mut args = Args {
        server: false,
        addr: None,
        bind: None,
        port: 7174,
        count: None,
        size: 64,
        verbose: false,
        validate: false,
        debug: false,
        persistent: false,
        tos: None,
    };
    let mut side = None;
    let Command::Run(()) = tool_flags::read(argv, |flag, parser| {
        match flag {
            'a' => args.addr = Some(tool_flags::parsed(parser, flag)?),
            'I' => args.bind = Some(tool_flags::parsed(parser, flag)?),
            'p' => args.port = tool_flags::parsed(parser, flag)?,
            'C' => args.count = Some(tool_flags::parsed(parser, flag)?).filter(|&c| c > 0),
            'S' => {
                let size: usize = tool_flags::parsed(parser, flag)?;
                if !(MIN_SIZE..MAX_SIZE).contains(&size) {
                    return Err(format!(
                        "invalid size {size} (min {MIN_SIZE} max {})",
                        MAX_SIZE - 1
                    ));
                }
                args.size = size;
            }
            't' => args.tos = Some(tool_flags::parsed(parser, flag)?),
            's' => side = Some(true),
            'c' => side = Some(false),
            'v' => args.verbose = true,
            'V' => args.validate = true,
            'd' => args.debug = true,
            'P' => args.persistent = true,
            // -q makes C rping create and move its QP itself; ours always lets rdma_cm.
            'q' => {}
            _ => return Ok(false),
        }
        Ok(true)
    })?
    else {
        return Ok(Command::Help);
    };
    args.server = side.ok_or("one of -s or -c is required")?;
    if !args.server && args.addr.is_none() {
        return Err("the client needs -a addr".to_owned());
    }
    Ok(Command::Run(args))
}

fn id_options(args: &Args) -> IdOptions {
    match args.tos {
        Some(tos) => IdOptions::new().type_of_service(tos),
        None => IdOptions::new(),
    }
}

fn options(args: &Args) -> RdmaOptions {
    // rping's queue pair: 16 sends, 2 receives; one RDMA read outstanding each way.
    RdmaOptions::new()
        .send_depth(16)
        .recv_depth(2)
        .conn_params(ConnParams::new().responder_resources(1).initiator_depth(1))
        .id_options(id_options(args))
}

/// The bytes of ping `n`: rping's prefix, then letters `start`.. rotating through 'A'..='z',
/// and a terminating NUL.
fn ping_data(n: u64, start: u8, size: usize) -> Vec<u8> {
    let mut data = format!("rdma-ping-{n}: ").into_bytes();
    data.truncate(size);
    let mut c = start;
    while data.len() < size {
        data.push(c);
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    data[size - 1] = 0;
    data
}

/// The text of ping data up to its NUL, as C `printf("%s")` shows it.
fn as_text(data: &[u8]) -> String {
    let end = data.iter().position(|&b| b == 0).unwrap_or(data.len());
    String::from_utf8_lossy(&data[..end]).into_owned()
}

fn debug(args: &Args, msg: impl FnOnce() -> String) {
    if args.debug {
        eprintln!("{}", msg());
    }
}

fn protocol_error(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Sends `info` from `msg` while `inbox` waits for the peer's answer (posted first, so the answer
/// always finds it); returns the answer's length.
async fn exchange(
    conn: &RdmaConnection,
    mut msg: LocalRegion,
    info: RemoteRegion,
    inbox: LocalRegion,
) -> io::Result<(LocalRegion, LocalRegion, usize)> {
    msg.copy_from_slice(&info.to_bytes());
    let ((got, inbox), (sent, msg)) = tokio::join!(conn.recv(inbox, ..), conn.send(msg, ..));
    sent?;
    let got = got?;
    Ok((msg, inbox, got.len()))
}

/// The client: `-C` pings (for ever without), then a disconnect.
pub async fn run_client(args: &Args) -> io::Result<()> {
    let Some(ip) = args.addr else {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "no -a address"));
    };
    let mut opts = options(args);
    if let Some(bind) = args.bind {
        opts = opts.bind(SocketAddr::new(bind, 0));
    }
    let conn = RdmaConnection::connect_with(SocketAddr::new(ip, args.port), &opts).await?;
    debug(args, || {
        format!("rdma_connect successful ({})", conn.device_name())
    });
    let mut start_buf: SharedRegion = conn.reg_read(args.size)?;
    let rdma_buf: SharedRegion = conn.reg_write(args.size)?;
    let (mut msg, mut inbox) = (conn.reg_msgs(INFO_LEN)?, conn.reg_msgs(INFO_LEN)?);
    let mut start = b'A';
    let mut ping = 0u64;
    while args.count.is_none_or(|count| ping < count) {
        let data = ping_data(ping, start, args.size);
        start = if start >= b'z' { b'A' } else { start + 1 };
        start_buf.write_at(0, &data)?;
        // Source advertisement: the server RDMA-reads it, then says go ahead.
        let (m, i, len) = exchange(&conn, msg, start_buf.remote(), inbox).await?;
        check_go_ahead(len)?;
        // Sink advertisement: the server RDMA-writes the ping into it, then says go ahead.
        let (m, i, len) = exchange(&conn, m, rdma_buf.remote(), i).await?;
        check_go_ahead(len)?;
        (msg, inbox) = (m, i);
        let echoed = rdma_buf.to_vec();
        if args.validate && echoed != data {
            return Err(protocol_error("data mismatch!".to_owned()));
        }
        if args.verbose {
            println!("ping data: {}", as_text(&echoed));
        }
        ping += 1;
    }
    debug(args, || "client done: disconnecting".to_owned());
    conn.close().await;
    Ok(())
}

fn check_go_ahead(len: usize) -> io::Result<()> {
    if len != INFO_LEN {
        return Err(protocol_error(format!("Received bogus data, size {len}")));
    }
    Ok(())
}

/// Receives one `rping_rdma_info`; `None` once the client disconnected.
async fn recv_info(
    conn: &RdmaConnection,
    inbox: LocalRegion,
) -> io::Result<(Option<RemoteRegion>, LocalRegion)> {
    let (got, inbox) = conn.recv(inbox, ..).await;
    match got {
        Ok(got) if got.len() == INFO_LEN => Ok((Some(RemoteRegion::from_bytes(&inbox)?), inbox)),
        Ok(got) => Err(protocol_error(format!(
            "Received bogus data, size {}",
            got.len()
        ))),
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::NotConnected
            ) =>
        {
            eprintln!("server DISCONNECT EVENT...");
            Ok((None, inbox))
        }
        Err(e) => Err(e),
    }
}

/// Serves one client until it disconnects.
async fn serve(args: &Args, conn: RdmaConnection) -> io::Result<()> {
    // The server reads into and writes from the same local buffer, as rping's `rdma_buf`.
    let mut rdma_buf = conn.reg_msgs(args.size)?;
    let (mut go_ahead, mut inbox) = (conn.reg_msgs(INFO_LEN)?, conn.reg_msgs(INFO_LEN)?);
    loop {
        let (source, i) = recv_info(&conn, inbox).await?;
        let Some(source) = source else { break };
        debug(args, || format!("server received source adv {source:?}"));
        let len = source.len() as usize;
        if len > args.size {
            return Err(protocol_error(format!(
                "the client advertised {len} bytes; this server's buffers hold {} (-S)",
                args.size
            )));
        }
        let (read, buf) = conn.read(rdma_buf, ..len, source.whole()).await;
        read?;
        if args.verbose {
            println!("server ping data: {}", as_text(&buf[..len]));
        }
        // Tell the client to continue, with the receive for its sink advertisement posted first.
        let (received, (sent, g)) = tokio::join!(recv_info(&conn, i), conn.send(go_ahead, ..));
        sent?;
        let (sink, i) = received?;
        let Some(sink) = sink else { break };
        debug(args, || format!("server received sink adv {sink:?}"));
        // rping writes the string and its NUL.
        let text = buf[..len]
            .iter()
            .position(|&b| b == 0)
            .map_or(len, |n| n + 1);
        let (written, buf) = conn.write(buf, ..text, sink.whole()).await;
        written?;
        // Tell the client to begin again; its next source advertisement is received at the top.
        let (sent, g) = conn.send(g, ..).await;
        sent?;
        (rdma_buf, go_ahead, inbox) = (buf, g, i);
    }
    Ok(())
}

/// The server: serves one client (`-P`: any number, one task each).
pub async fn run_server(args: &Args) -> io::Result<()> {
    let ip = args.addr.unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
    let addr = SocketAddr::new(ip, args.port);
    let listener = CmListener::bind_with(
        addr,
        &ListenerOptions::new()
            .backlog(3)
            .id_options(id_options(args)),
    )
    .await?;
    let local = listener.local_addr()?;
    debug(args, || format!("rdma_listen on {local}"));
    serve_listener(args, listener).await
}

/// Accepts from `listener` and serves as [`run_server`].
pub async fn serve_listener(args: &Args, listener: CmListener) -> io::Result<()> {
    loop {
        let request = listener.accept_request().await?;
        let conn = RdmaConnection::accept(request, &options(args)).await?;
        let peer = conn.peer_addr()?;
        debug(args, || format!("accepted {peer} ({})", conn.device_name()));
        if args.persistent {
            let args = args.clone();
            tokio::spawn(async move {
                if let Err(e) = serve(&args, conn).await {
                    eprintln!("rping server failed: {e}");
                }
            });
        } else {
            return serve(args, conn).await;
        }
    }
}

#[rdma_async::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    // Status 22 (EINVAL) on a bad command line, as rping.c.
    let args = match tool_flags::run_or_exit("rping", USAGE, parse_args(tool_flags::from_env()), 22)
    {
        Ok(args) => args,
        Err(status) => return status,
    };
    let result = if args.server {
        run_server(&args).await
    } else {
        run_client(&args).await
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!(
                "rping {} failed: {e}",
                if args.server { "server" } else { "client" }
            );
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(line: &str) -> Result<Args, String> {
        match parse_args(line.split_whitespace())? {
            Command::Run(args) => Ok(args),
            Command::Help => Err(format!("{line:?} asked for help")),
        }
    }

    #[test]
    fn parses_grouped_and_attached_flags_like_getopt() {
        let a = parse("-c -vVd -a 10.0.0.1 -C10 -S 100 -p 9000").unwrap();
        assert!(!a.server && a.verbose && a.validate && a.debug);
        assert_eq!(a.addr, Some("10.0.0.1".parse().unwrap()));
        assert_eq!((a.count, a.size, a.port), (Some(10), 100, 9000));
        let a = parse("-s -P -t 32").unwrap();
        assert_eq!(a.tos, Some(32));
        assert!(a.server && a.persistent && a.count.is_none());
        assert!(parse("-c").is_err(), "the client needs an address");
        assert!(parse("-s -S 10").is_err(), "below rping's minimum size");
        assert!(parse("-v").is_err(), "a side is required");
    }

    #[test]
    fn help_is_asked_for_and_bad_flags_are_named() {
        for help in ["-h", "--help", "-c -a 10.0.0.1 -h"] {
            let parsed = parse_args(help.split_whitespace());
            assert!(matches!(parsed, Ok(Command::Help)), "{help}: {parsed:?}");
        }
        assert!(USAGE.starts_with("usage: rping -s"));
        assert_eq!(parse("-s -x").unwrap_err(), "invalid option '-x'");
        assert_eq!(
            parse("-s -C").unwrap_err(),
            "option requires an argument -- 'C'"
        );
        assert!(
            parse("-c -a 10.0.0.256")
                .unwrap_err()
                .starts_with("-a 10.0.0.256: ")
        );
        assert_eq!(
            parse("-s extra").unwrap_err(),
            "unexpected argument \"extra\""
        );
    }

    #[test]
    fn ping_data_matches_rping() {
        let d = ping_data(3, b'y', 30);
        assert_eq!(&d[..], b"rdma-ping-3: yzABCDEFGHIJKLMN\0");
        assert_eq!(as_text(&d), "rdma-ping-3: yzABCDEFGHIJKLMN");
    }
}
