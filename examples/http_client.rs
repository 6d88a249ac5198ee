//! An HTTP client (hyper-util's pooled client) over RDMA: GETs a URL a few times on one
//! kept-alive connection and prints the bodies, or times many GETs.
//!
//! ```text
//! http_client [--h2] [--tcp] [--requests N] [url]          # default http://10.77.0.1:8080/
//! http_client --help
//! ```
//!
//! `--h2` speaks HTTP/2 with prior knowledge (rdma_cm has no ALPN). `--tcp` uses kernel TCP
//! (with `TCP_NODELAY`) instead of RDMA, for comparisons against `http_server --tcp`.
//! `--requests N` sends one GET to open the connection, then N more one at a time on it, and
//! prints their latency percentiles instead of the bodies:
//!
//! ```text
//! requests 2000 p50 1234.5 us p90 1400.2 us p99 2100.0 us
//! ```

use std::time::Instant;

use bytes::Bytes;
use clap::Parser;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use rdma_async::integration::hyper::RConnector;

#[path = "common/timed_requests.rs"]
mod timed_requests;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// An HTTP client over RDMA (hyper-util's pooled client): GETs a URL three times on one
/// kept-alive connection and prints the bodies, or times many GETs.
#[derive(Debug, Parser)]
#[command(name = "http_client")]
struct Options {
    /// Speak HTTP/2 with prior knowledge (rdma_cm has no ALPN).
    #[arg(long)]
    h2: bool,
    /// Use kernel TCP (with TCP_NODELAY) instead of RDMA, to compare with `http_server --tcp`.
    #[arg(long)]
    tcp: bool,
    /// Send one GET to open the connection, then N more one at a time on it, and print their
    /// latency percentiles instead of the bodies.
    #[arg(long, value_name = "N", value_parser = timed_requests::positive_count)]
    requests: Option<usize>,
    /// The URL to GET.
    #[arg(default_value = "http://10.77.0.1:8080/")]
    url: hyper::Uri,
}

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let opts = Options::parse();
    let builder = Client::builder(TokioExecutor::new())
        .http2_only(opts.h2)
        .clone();
    if opts.tcp {
        let mut tcp = HttpConnector::new();
        tcp.set_nodelay(true);
        run(builder.build(tcp), &opts).await
    } else {
        run(builder.build(RConnector::new()), &opts).await
    }
}

async fn run<C>(client: Client<C, Empty<Bytes>>, opts: &Options) -> Result<(), BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let Some(requests) = opts.requests else {
        for _ in 0..3 {
            let (version, status, body) = get(&client, &opts.url).await?;
            println!("{version:?} {status}");
            print!("{}", String::from_utf8_lossy(&body));
        }
        return Ok(());
    };
    // The first request opens the connection; the timed ones reuse it.
    get(&client, &opts.url).await?;
    let mut took = Vec::with_capacity(requests);
    for _ in 0..requests {
        let start = Instant::now();
        let (_, status, _) = get(&client, &opts.url).await?;
        took.push(start.elapsed());
        if !status.is_success() {
            return Err(format!("{} answered {status}", opts.url).into());
        }
    }
    println!("{}", timed_requests::report(&mut took));
    Ok(())
}

/// One GET, its body read to the end.
async fn get<C>(
    client: &Client<C, Empty<Bytes>>,
    url: &hyper::Uri,
) -> Result<(hyper::Version, hyper::StatusCode, Bytes), BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let response = client.get(url.clone()).await?;
    let (version, status) = (response.version(), response.status());
    let body = response.into_body().collect().await?.to_bytes();
    Ok((version, status, body))
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("http_client").chain(args.iter().copied()))
    }

    #[test]
    fn flags_and_url_are_read_in_any_order() {
        let opts = parse(&["--tcp", "http://10.0.0.2:81/x", "--requests", "7", "--h2"])
            .expect("valid options");
        assert!(opts.tcp && opts.h2);
        assert_eq!(opts.requests, Some(7));
        assert_eq!(opts.url, "http://10.0.0.2:81/x");
    }

    #[test]
    fn defaults_print_bodies_over_rdma() {
        let opts = parse(&[]).expect("no options");
        assert!(!opts.tcp && !opts.h2);
        assert_eq!(opts.requests, None);
        assert_eq!(opts.url, "http://10.77.0.1:8080/");
    }

    #[test]
    fn bad_counts_and_unknown_flags_are_refused() {
        for bad in [
            &["--requests"][..],
            &["--requests", "0"],
            &["--requests", "x"],
            &["-v"],
            &["http://[::1"],
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn help_names_every_flag() {
        Options::command().debug_assert();
        let help = parse(&["--help"]).expect_err("help is not a run");
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        let text = help.to_string();
        for word in [
            "Usage: http_client",
            "--h2",
            "--tcp",
            "--requests <N>",
            "[URL]",
        ] {
            assert!(text.contains(word), "{word:?} missing from:\n{text}");
        }
        let bad = parse(&["--udp"]).expect_err("an unknown flag");
        assert_eq!(bad.kind(), ErrorKind::UnknownArgument);
        assert!(bad.to_string().contains("Usage: http_client"), "{bad}");
    }
}
