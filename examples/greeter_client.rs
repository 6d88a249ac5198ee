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
#[path = "common/transport_args.rs"]
mod transport_args;

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

fn parse(args: impl Iterator<Item = String>) -> Result<Options, String> {
    let mut requests = None;
    let parsed = transport_args::parse(args, "http://10.77.0.1:50051", |flag, rest| {
        timed_requests::take_flag(flag, rest, &mut requests)
    })?;
    Ok(Options {
        tcp: parsed.tcp,
        requests,
        uri: parsed.target,
    })
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let opts = transport_args::or_exit("greeter_client", USAGE, parse(std::env::args().skip(1)));
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
    use super::transport_args::words;
    use super::*;

    #[test]
    fn command_line_takes_tcp_a_count_and_the_uri() {
        let opts = parse(words(&["--requests", "9", "http://10.0.0.2:1", "--tcp"]));
        let opts = opts.expect("valid options");
        assert!(opts.tcp);
        assert_eq!(
            (opts.requests, opts.uri.as_str()),
            (Some(9), "http://10.0.0.2:1")
        );
        // By default: the demo, over RDMA, to the guest's greeter.
        let opts = parse(words(&[])).expect("no options");
        assert!(!opts.tcp);
        assert_eq!(
            (opts.requests, opts.uri.as_str()),
            (None, "http://10.77.0.1:50051")
        );
        for bad in [&["--requests"][..], &["--requests", "0"], &["--h2"]] {
            assert!(parse(words(bad)).is_err(), "{bad:?} was accepted");
        }
    }
}
