//! Command-line flags in the style of librdmacm's example tools, read with lexopt the way their
//! getopt loops read them: `-C 10` or `-C10`, grouped `-vV`, later flags overriding earlier
//! ones. Shared by the examples that are peers of those tools (rstream, rping, cmatose, udaddy,
//! mckey); each also answers `-h` and `--help` with its usage.

use std::ffi::OsString;
use std::fmt::Display;
use std::process::ExitCode;
use std::str::FromStr;

use lexopt::Arg::{Long, Short};
pub use lexopt::Parser;

/// What a command line asks for.
#[derive(Debug, PartialEq, Eq)]
pub enum Command<T> {
    /// A run with these arguments.
    Run(T),
    /// `-h` or `--help`: the usage text, nothing else.
    Help,
}

/// Reads `argv` (without the program's name) a flag at a time: `-h` and `--help` ask for the
/// usage; every other short flag goes to `flag` with the parser (for its value), which returns
/// whether it knew the flag. Anything else (a long flag, an operand) is an error, as in the C
/// tools.
pub fn read(
    argv: impl IntoIterator<Item = impl Into<OsString>>,
    mut flag: impl FnMut(char, &mut Parser) -> Result<bool, String>,
) -> Result<Command<()>, String> {
    let mut parser = Parser::from_args(argv);
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => return Ok(Command::Help),
            Short(short) => {
                if !flag(short, &mut parser)? {
                    return Err(Short(short).unexpected().to_string());
                }
            }
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    Ok(Command::Run(()))
}

/// The value of `flag`: the rest of its argument (`-C10`) or the next one (`-C 10`).
pub fn value(parser: &mut Parser, flag: char) -> Result<String, String> {
    let value = parser
        .value()
        .map_err(|_| format!("option requires an argument -- '{flag}'"))?;
    value
        .into_string()
        .map_err(|v| format!("-{flag} {}: not UTF-8", v.to_string_lossy()))
}

/// The value of `flag`, parsed.
pub fn parsed<T>(parser: &mut Parser, flag: char) -> Result<T, String>
where
    T: FromStr,
    T::Err: Display,
{
    let value = value(parser, flag)?;
    value.parse().map_err(|e| format!("-{flag} {value}: {e}"))
}

/// This program's arguments, after its name.
pub fn from_env() -> impl Iterator<Item = OsString> {
    std::env::args_os().skip(1)
}

/// What to run; or, after printing the usage on stdout for `--help` (status 0) or the problem
/// and the usage on stderr for a bad command line (status `bad`), the status to exit with.
pub fn run_or_exit<T>(
    program: &str,
    usage: &str,
    parsed: Result<Command<T>, String>,
    bad: u8,
) -> Result<T, ExitCode> {
    match parsed {
        Ok(Command::Run(args)) => Ok(args),
        Ok(Command::Help) => {
            println!("{usage}");
            Err(ExitCode::SUCCESS)
        }
        Err(msg) => {
            eprintln!("{program}: {msg}\n{usage}");
            Err(ExitCode::from(bad))
        }
    }
}

#[cfg(test)]
mod tool_flags_tests {
    use super::*;

    #[test]
    fn help_exits_zero_and_bad_command_lines_with_the_status_asked_for() {
        assert_eq!(run_or_exit("t", "usage: t", Ok(Command::Run(5)), 1), Ok(5));
        assert_eq!(
            run_or_exit::<()>("t", "usage: t", Ok(Command::Help), 1),
            Err(ExitCode::SUCCESS)
        );
        assert_eq!(
            run_or_exit::<()>("t", "usage: t", Err("bad".into()), 22),
            Err(ExitCode::from(22))
        );
    }

    #[test]
    fn help_wins_and_unknown_flags_and_operands_are_refused() {
        let mut seen = Vec::new();
        let mut read_line = |line: &str| {
            read(line.split_whitespace(), |flag, _| {
                seen.push(flag);
                Ok(flag == 'v')
            })
        };
        assert_eq!(read_line("-vv"), Ok(Command::Run(())));
        assert_eq!(read_line("-v --help -q"), Ok(Command::Help));
        assert_eq!(read_line("-h"), Ok(Command::Help));
        assert_eq!(read_line("-vq"), Err("invalid option '-q'".to_owned()));
        assert_eq!(
            read_line("--verbose"),
            Err("invalid option '--verbose'".to_owned())
        );
        assert_eq!(read_line("x"), Err("unexpected argument \"x\"".to_owned()));
        assert_eq!(seen, ['v', 'v', 'v', 'v', 'q']);
    }

    #[test]
    fn values_attach_or_follow_and_parse() {
        let mut parser = Parser::from_args(["-C10", "-S", "x"]);
        assert!(matches!(parser.next(), Ok(Some(Short('C')))));
        assert_eq!(parsed::<u32>(&mut parser, 'C'), Ok(10));
        assert!(matches!(parser.next(), Ok(Some(Short('S')))));
        assert_eq!(
            parsed::<u32>(&mut parser, 'S'),
            Err("-S x: invalid digit found in string".to_owned())
        );
    }
}
