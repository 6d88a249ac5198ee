//! An HTTP client (hyper-util's pooled client) over RDMA: GETs a URL a few times on one
//! kept-alive connection and prints the bodies, or times many GETs.
//!
//! ```text
//! http_client [--h2] [--tcp] [--requests N] [url]          # default http://10.77.0.1:8080/
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
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::rt::TokioExecutor;
use rdma_async::integration::hyper::RConnector;

#[path = "common/timed_requests.rs"]
mod timed_requests;
#[path = "common/transport_args.rs"]
mod transport_args;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: http_client [--h2] [--tcp] [--requests N] [url]";

/// What the command line asked for.
struct Options {
    h2: bool,
    tcp: bool,
    /// Timed requests (`--requests`); `None` prints three bodies instead.
    requests: Option<usize>,
    url: hyper::Uri,
}

fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let (mut h2, mut requests) = (false, None);
    let parsed = transport_args::parse(args, "http://10.77.0.1:8080/", |flag, rest| {
        if flag == "--h2" {
            h2 = true;
            return Ok(true);
        }
        timed_requests::take_flag(flag, rest, &mut requests)
    })?;
    let url = &parsed.target;
    Ok(Options {
        h2,
        tcp: parsed.tcp,
        requests,
        url: url.parse().map_err(|e| format!("bad url {url:?}: {e}"))?,
    })
}

#[rdma_async::main(flavor = "multi_thread")]
async fn main() -> Result<(), BoxError> {
    let opts = transport_args::or_exit("http_client", USAGE, parse(std::env::args().skip(1)));
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
    use super::transport_args::words as args;
    use super::*;

    #[test]
    fn flags_and_url_are_read_in_any_order() {
        let opts = parse(args(&[
            "--tcp",
            "http://10.0.0.2:81/x",
            "--requests",
            "7",
            "--h2",
        ]))
        .expect("valid options");
        assert!(opts.tcp && opts.h2);
        assert_eq!(opts.requests, Some(7));
        assert_eq!(opts.url, "http://10.0.0.2:81/x");
    }

    #[test]
    fn defaults_print_bodies_over_rdma() {
        let opts = parse(args(&[])).expect("no options");
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
            assert!(parse(args(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
