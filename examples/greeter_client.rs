//! A tonic gRPC client over RDMA: one unary call and one server-streaming call to
//! `greeter_server`, or many timed unary calls.
//!
//! ```text
//! greeter_client [--tcp] [--requests N] [uri]          # default http://10.77.0.1:50051
//! ```
//!
//!   scripts/softroce sh -c 'target/debug/examples/greeter_server 10.77.0.1:50051 &
//!       target/debug/examples/greeter_client http://10.77.0.1:50051'
//!
//! `--tcp` uses kernel TCP (with `TCP_NODELAY`, tonic's default) instead of RDMA, for comparisons
//! against `greeter_server --tcp`. `--requests N` makes one unary call to open the channel, then
//! N more one at a time on it, and prints their latency percentiles instead of the replies:
//!
//! ```text
//! requests 2000 p50 1234.5 us p90 1400.2 us p99 2100.0 us
//! ```

use std::time::Instant;

use rdma_async::integration::hyper::RConnector;
use tokio_stream::StreamExt;
use tonic::transport::{Channel, Endpoint};

#[path = "common/timed_requests.rs"]
mod timed_requests;

mod greeter {
    tonic::include_proto!("greeter");
}
use greeter::HelloRequest;
use greeter::greeter_client::GreeterClient;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

const USAGE: &str = "usage: greeter_client [--tcp] [--requests N] [uri]";

/// What the command line asked for.
#[derive(Debug)]
struct Options {
    tcp: bool,
    /// Timed unary calls (`--requests`); `None` prints the demo's replies instead.
    requests: Option<usize>,
    uri: String,
}

fn parse(mut args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut opts = Options {
        tcp: false,
        requests: None,
        uri: "http://10.77.0.1:50051".into(),
    };
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--tcp" => opts.tcp = true,
            "--requests" => opts.requests = Some(timed_requests::parse_count(args.next())?),
            flag if flag.starts_with('-') => return Err(format!("unknown option {flag}")),
            _ => opts.uri = arg,
        }
    }
    Ok(opts)
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let opts = match parse(std::env::args().skip(1)) {
        Ok(opts) => opts,
        Err(msg) => {
            eprintln!("greeter_client: {msg}\n{USAGE}");
            std::process::exit(2);
        }
    };
    let endpoint = Endpoint::from_shared(opts.uri.clone())?;
    let channel = if opts.tcp {
        endpoint.connect().await?
    } else {
        // The hyper connector opens an RStream to the URI's host and port.
        endpoint.connect_with_connector(RConnector::new()).await?
    };
    let mut client = GreeterClient::new(channel);
    match opts.requests {
        Some(requests) => timed(&mut client, requests).await,
        None => demo(&mut client).await,
    }
}

/// One unary and one server-streaming call, their replies printed.
async fn demo(client: &mut GreeterClient<Channel>) -> Result<(), BoxError> {
    let reply = client.say_hello(hello(0)).await?.into_inner();
    println!("unary: {}", reply.message);

    let mut replies = client.say_hello_stream(hello(3)).await?.into_inner();
    while let Some(reply) = replies.next().await {
        println!("stream: {}", reply?.message);
    }
    Ok(())
}

/// `requests` unary calls one after another, after one that warms the channel up.
async fn timed(client: &mut GreeterClient<Channel>, requests: usize) -> Result<(), BoxError> {
    client.say_hello(hello(0)).await?;
    let mut took = Vec::with_capacity(requests);
    for _ in 0..requests {
        let start = Instant::now();
        let reply = client.say_hello(hello(0)).await?.into_inner();
        took.push(start.elapsed());
        if reply.message != "Hello RDMA!" {
            return Err(format!("unexpected reply {:?}", reply.message).into());
        }
    }
    println!("{}", timed_requests::report(&mut took));
    Ok(())
}

fn hello(count: u32) -> HelloRequest {
    HelloRequest {
        name: "RDMA".into(),
        count,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> impl Iterator<Item = String> {
        list.iter()
            .map(|s| (*s).to_owned())
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn flags_and_uri_are_read_in_any_order() {
        let opts =
            parse(args(&["--requests", "9", "http://10.0.0.2:1", "--tcp"])).expect("valid options");
        assert!(opts.tcp);
        assert_eq!(opts.requests, Some(9));
        assert_eq!(opts.uri, "http://10.0.0.2:1");
    }

    #[test]
    fn defaults_run_the_demo_over_rdma() {
        let opts = parse(args(&[])).expect("no options");
        assert!(!opts.tcp);
        assert_eq!(opts.requests, None);
        assert_eq!(opts.uri, "http://10.77.0.1:50051");
    }

    #[test]
    fn bad_counts_and_unknown_flags_are_refused() {
        for bad in [&["--requests"][..], &["--requests", "0"], &["--h2"]] {
            assert!(parse(args(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
