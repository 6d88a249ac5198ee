//! Command-line flags in the style of librdmacm's example tools (`-s server -C 10`), shared by
//! the examples that are peers of those tools.

use std::fmt::Display;
use std::str::FromStr;

/// The command line's flags, one at a time, with their values.
pub struct Flags {
    args: std::iter::Skip<std::env::Args>,
}

impl Flags {
    /// The flags this program was started with.
    pub fn from_env() -> Self {
        Flags {
            args: std::env::args().skip(1),
        }
    }

    /// The next flag, if any.
    pub fn next_flag(&mut self) -> Option<String> {
        self.args.next()
    }

    /// The value that follows `flag`.
    pub fn value(&mut self, flag: &str) -> Result<String, String> {
        self.args
            .next()
            .ok_or_else(|| format!("{flag} needs a value"))
    }

    /// The value that follows `flag`, parsed.
    pub fn parsed<T>(&mut self, flag: &str) -> Result<T, String>
    where
        T: FromStr,
        T::Err: Display,
    {
        let v = self.value(flag)?;
        v.parse().map_err(|e| format!("{flag} {v}: {e}"))
    }
}
