//! Command-line options, parsed the way rstream.c's getopt loop reads them: `-X value` or
//! `-Xvalue`, later options overriding earlier ones, `-T` repeatable and cumulative; `-h` or
//! `--help` asks for the usage.

use std::ffi::OsString;

use crate::exchange::IoMode;
use crate::tool_flags::{self, Command};
use crate::transport::Backend;

pub const USAGE: &str = "\
usage: rstream
\t[-s server_address]
\t[-b bind_address]
\t[-f address_format]
\t    name, ip, ipv6, or gid (gid is not supported)
\t[-B buffer_size]
\t[-i inline_size]
\t[-I iterations]
\t[-C transfer_count]
\t[-S transfer_size or all]
\t[-p port_number]
\t[-k keepalive_time]
\t[-T test_option]
\t    s|sockets - use standard tcp/ip sockets
\t    a|async - asynchronous operation (accepted; transfers always wait through Tokio's reactor)
\t    b|blocking - use blocking calls (awaited reads and writes)
\t    f|fork - fork server processing (not supported)
\t    n|nonblocking - use nonblocking calls (busy polling, the default)
\t    r|resolve - use rdma cm to resolve address (accepted, ignored)
\t    v|verify - verify data
\t    z|zerocopy - send from a registered region without a copy (rdma-async only)
\t    l|lent - receive by borrowing the bytes in the receive ring (rdma-async only)
\t[-h|--help] - print this usage";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `-s`: run as the client of this server; the server otherwise.
    pub server: Option<String>,
    /// `-b`: the server's listening address, or the client's source address.
    pub bind: Option<String>,
    pub port: u16,
    /// `-f ip` (or `ipv6`): addresses must be literals, no name lookup.
    pub numeric_host: bool,
    /// `-B`; 0 means rstream.c's default of 512 KiB.
    pub buffer_size: usize,
    /// `-i`, used only on the latency connection of the default run over RDMA.
    pub inline_size: usize,
    /// `-k` seconds; 0 is off.
    pub keepalive: u32,
    /// `-S all`: the default run goes through all 33 sizes.
    pub all_sizes: bool,
    /// Any of `-S size`, `-C`, `-I` given: one custom test instead of the default run.
    pub custom: bool,
    pub size: usize,
    pub count: usize,
    pub iterations: usize,
    pub backend: Backend,
    pub mode: IoMode,
    pub verify: bool,
    /// `-T z` (rdma-async only): sends from a registered region without a copy.
    pub zero_copy: bool,
    /// `-T l` (rdma-async only): receives borrow the bytes in the receive ring
    /// (`RStream::read_lent`) instead of copying them out.
    pub lent_reads: bool,
    /// Options accepted but without effect here, to tell the user about.
    pub notes: Vec<String>,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            server: None,
            bind: None,
            port: 7471,
            numeric_host: false,
            buffer_size: 0,
            inline_size: 64,
            keepalive: 0,
            all_sizes: false,
            custom: false,
            size: 1000,
            count: 1000,
            iterations: 1,
            backend: Backend::Rdma,
            mode: IoMode::NonBlocking,
            verify: false,
            zero_copy: false,
            lent_reads: false,
            notes: Vec::new(),
        }
    }
}

/// Parses the arguments after the program name; an error is a message to print before the
/// usage.
pub fn parse(
    args: impl IntoIterator<Item = impl Into<OsString>>,
) -> Result<Command<Options>, String> {
    let mut opts = Options::default();
    let Command::Run(()) = tool_flags::read(args, |flag, parser| {
        if flag == 'p' {
            opts.port = tool_flags::parsed(parser, flag)?;
            return Ok(true);
        }
        if !"sbfBiICSkT".contains(flag) {
            return Ok(false);
        }
        let value = tool_flags::value(parser, flag)?;
        match flag {
            's' => opts.server = Some(value),
            'b' => opts.bind = Some(value),
            'f' => address_format(&value, &mut opts)?,
            'B' => opts.buffer_size = number(flag, &value)?,
            'i' => opts.inline_size = number(flag, &value)?,
            'I' => {
                opts.custom = true;
                opts.iterations = number(flag, &value)?;
            }
            'C' => {
                opts.custom = true;
                opts.count = number(flag, &value)?;
            }
            'S' => {
                if starts_with_ignore_case(&value, "all") {
                    opts.all_sizes = true;
                } else {
                    opts.custom = true;
                    opts.size = number(flag, &value)?;
                }
            }
            'k' => opts.keepalive = u32::try_from(number(flag, &value)?).unwrap_or(u32::MAX),
            'T' => test_option(&value, &mut opts)?,
            _ => unreachable!("flag checked above"),
        }
        Ok(true)
    })?
    else {
        return Ok(Command::Help);
    };
    Ok(Command::Run(opts))
}

/// One `-T` value: a single letter, or a word that the value must start with (case-insensitive,
/// so "nonblocking" is "nonblock"), as rstream.c's `set_test_opt` reads it.
fn test_option(value: &str, opts: &mut Options) -> Result<(), String> {
    const WORDS: [(&str, char); 9] = [
        ("socket", 's'),
        ("async", 'a'),
        ("block", 'b'),
        ("nonblock", 'n'),
        ("resolve", 'r'),
        ("verify", 'v'),
        ("fork", 'f'),
        ("zerocopy", 'z'),
        ("lent", 'l'),
    ];
    let mut letters = value.chars();
    let letter = match (letters.next(), letters.next()) {
        (Some(letter), None) => letter,
        _ => WORDS
            .iter()
            .find(|(word, _)| starts_with_ignore_case(value, word))
            .map(|&(_, letter)| letter)
            .ok_or_else(|| format!("invalid test option -T {value}"))?,
    };
    match letter {
        's' => opts.backend = Backend::Tcp,
        // The last of -T b / -T n wins, as in rstream.c.
        'b' => opts.mode = IoMode::Blocking,
        'n' => opts.mode = IoMode::NonBlocking,
        'v' => opts.verify = true,
        'z' => opts.zero_copy = true,
        'l' => opts.lent_reads = true,
        'a' => opts.notes.push(
            "-T a accepted: every transfer already waits for readiness through Tokio's reactor"
                .into(),
        ),
        'r' => opts.notes.push(
            "-T r ignored: addresses are resolved with getaddrinfo, not rdma_getaddrinfo".into(),
        ),
        'f' => return Err("-T f (fork server processing) is not supported".into()),
        _ => return Err(format!("invalid test option -T {value}")),
    }
    Ok(())
}

/// `-f`: rstream.c knows "ip…" (numeric addresses only) and "gid…" (AF_IB); anything else,
/// "name" included although the usage lists it, only earns a warning.
fn address_format(value: &str, opts: &mut Options) -> Result<(), String> {
    if starts_with_ignore_case(value, "ip") {
        opts.numeric_host = true;
    } else if starts_with_ignore_case(value, "gid") {
        return Err("-f gid: AF_IB (GID) addresses are not supported".into());
    } else {
        opts.notes.push("Warning: unknown address format".into());
    }
    Ok(())
}

/// A count or size. rstream.c uses `atoi`, which turns "4k" into 4 and "x" into 0 without a
/// word; here anything but a plain number in the range of a C `int` is an error.
fn number(flag: char, value: &str) -> Result<usize, String> {
    value
        .parse::<u32>()
        .ok()
        .filter(|&n| i32::try_from(n).is_ok())
        .map(|n| n as usize)
        .ok_or_else(|| format!("-{flag} {value}: not a number from 0 to {}", i32::MAX))
}

fn starts_with_ignore_case(value: &str, word: &str) -> bool {
    value
        .get(..word.len())
        .is_some_and(|head| head.eq_ignore_ascii_case(word))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(line: &str) -> Result<Options, String> {
        match parse(line.split_whitespace())? {
            Command::Run(opts) => Ok(opts),
            Command::Help => Err(format!("{line:?} asked for help")),
        }
    }

    #[test]
    fn defaults_are_the_default_run() {
        let opts = parse_str("").unwrap();
        assert_eq!(opts, Options::default());
        assert!(!opts.custom);
        assert_eq!((opts.size, opts.count, opts.iterations), (1000, 1000, 1));
    }

    #[test]
    fn custom_run_and_attached_values() {
        let opts = parse_str("-T s -s 127.0.0.1 -p7472 -Tv -S 4096 -C100").unwrap();
        assert_eq!(opts.server.as_deref(), Some("127.0.0.1"));
        assert_eq!(opts.port, 7472);
        assert_eq!(opts.backend, Backend::Tcp);
        assert!(opts.verify && opts.custom);
        assert_eq!((opts.size, opts.count, opts.iterations), (4096, 100, 1));
        assert!(parse_str("-I 5").unwrap().custom);
    }

    #[test]
    fn size_all_is_not_custom() {
        let opts = parse_str("-S ALL").unwrap();
        assert!(opts.all_sizes && !opts.custom);
    }

    #[test]
    fn test_options_accumulate_and_last_mode_wins() {
        let opts = parse_str("-T verify -T b -T Sockets").unwrap();
        assert_eq!(opts.mode, IoMode::Blocking);
        assert!(opts.verify);
        assert_eq!(opts.backend, Backend::Tcp);
        assert_eq!(
            parse_str("-T b -T nonblocking").unwrap().mode,
            IoMode::NonBlocking
        );
        assert_eq!(parse_str("-T a").unwrap().notes.len(), 1);
    }

    #[test]
    fn rejects_clearly() {
        for bad in [
            "-T f", "-T fork", "-T x", "-T sock", "-f gid", "-S 4k", "-C", "-q 1", "x",
        ] {
            assert!(parse_str(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_str("-f name").unwrap().notes,
            ["Warning: unknown address format"]
        );
        assert!(parse_str("-f ipv6").unwrap().numeric_host);
    }

    #[test]
    fn help_is_asked_for_and_bad_flags_are_named() {
        for help in ["-h", "--help", "-s 10.0.0.1 -h"] {
            assert_eq!(parse(help.split_whitespace()), Ok(Command::Help), "{help}");
        }
        assert!(USAGE.starts_with("usage: rstream"));
        assert_eq!(parse(["-q"]), Err("invalid option '-q'".to_owned()));
        assert_eq!(
            parse(["--verify"]),
            Err("invalid option '--verify'".to_owned())
        );
        assert_eq!(
            parse(["-C"]),
            Err("option requires an argument -- 'C'".to_owned())
        );
        assert_eq!(
            parse(["-p", "70000"]).map_err(|e| e.starts_with("-p 70000: ")),
            Err(true)
        );
    }
}
