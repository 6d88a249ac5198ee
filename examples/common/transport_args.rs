//! The command line shared by the examples that run over RDMA or, with `--tcp`, over kernel
//! TCP for comparisons (`http_server`, `http_client`, `greeter_server`, `greeter_client`):
//! `[--tcp] [flags...] [target]`.

/// What every one of those command lines says.
#[derive(Debug)]
pub struct TransportArgs {
    /// `--tcp`: kernel TCP instead of RDMA.
    pub tcp: bool,
    /// The positional argument: the address to serve on, or the URL to connect to.
    pub target: String,
}

/// Parses `args` (without the program name). Flags other than `--tcp` go to `flag` with the
/// remaining arguments (for a flag's value); it returns whether it knew the flag.
pub fn parse<I>(
    mut args: I,
    default_target: &str,
    mut flag: impl FnMut(&str, &mut I) -> Result<bool, String>,
) -> Result<TransportArgs, String>
where
    I: Iterator<Item = String>,
{
    let mut parsed = TransportArgs {
        tcp: false,
        target: default_target.to_owned(),
    };
    while let Some(arg) = args.next() {
        if arg == "--tcp" {
            parsed.tcp = true;
        } else if arg.starts_with('-') {
            if !flag(&arg, &mut args)? {
                return Err(format!("unknown option {arg}"));
            }
        } else {
            parsed.target = arg;
        }
    }
    Ok(parsed)
}

/// The parsed command line, or (on a bad one) the problem and `usage` on stderr and exit
/// status 2.
pub fn or_exit<T>(program: &str, usage: &str, parsed: Result<T, String>) -> T {
    parsed.unwrap_or_else(|msg| {
        eprintln!("{program}: {msg}\n{usage}");
        std::process::exit(2);
    })
}

/// `list` as command-line arguments, for tests.
#[cfg(test)]
pub fn words(list: &[&str]) -> std::vec::IntoIter<String> {
    list.iter()
        .map(|s| (*s).to_owned())
        .collect::<Vec<_>>()
        .into_iter()
}

#[cfg(test)]
mod transport_args_tests {
    use super::*;

    fn no_flags(_: &str, _: &mut std::vec::IntoIter<String>) -> Result<bool, String> {
        Ok(false)
    }

    #[test]
    fn tcp_and_the_target_are_read_in_any_order() {
        let parsed = parse(words(&["10.0.0.2:81", "--tcp"]), "d:1", no_flags).expect("valid");
        assert!(parsed.tcp);
        assert_eq!(parsed.target, "10.0.0.2:81");
        let parsed = parse(words(&[]), "d:1", no_flags).expect("valid");
        assert!(!parsed.tcp);
        assert_eq!(parsed.target, "d:1");
    }

    #[test]
    fn other_flags_go_to_the_caller_with_their_values() {
        let mut seen = Vec::new();
        let parsed = parse(words(&["--n", "5", "t", "--x"]), "d", |flag, rest| {
            seen.push((flag.to_owned(), rest.next()));
            Ok(true)
        })
        .expect("valid");
        assert_eq!(parsed.target, "t");
        assert_eq!(
            seen,
            [
                ("--n".to_owned(), Some("5".to_owned())),
                ("--x".to_owned(), None)
            ]
        );
    }

    #[test]
    fn flags_nobody_knows_are_refused() {
        let err = parse(words(&["--udp"]), "d", no_flags).expect_err("refused");
        assert_eq!(err, "unknown option --udp");
    }
}
