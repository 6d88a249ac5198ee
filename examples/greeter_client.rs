//! A tonic gRPC client over RDMA: one unary call and one server-streaming call to
//! `greeter_server`, or many timed unary calls.
//!
//! ```text
//! greeter_client [--tcp] [--requests N] [uri]          # default http://10.77.0.1:50051
//! greeter_client --help
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

use clap::Parser;
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

/// A tonic gRPC client over RDMA: one unary call and one server-streaming call to
/// `greeter_server`, or many timed unary calls.
#[derive(Debug, Parser)]
#[command(name = "greeter_client")]
struct Options {
    /// Use kernel TCP (with TCP_NODELAY) instead of RDMA, to compare with
    /// `greeter_server --tcp`.
    #[arg(long)]
    tcp: bool,
    /// Make one unary call to open the channel, then N more one at a time on it, and print
    /// their latency percentiles instead of the replies.
    #[arg(long, value_name = "N", value_parser = timed_requests::positive_count)]
    requests: Option<usize>,
    /// The server's URI.
    #[arg(default_value = "http://10.77.0.1:50051")]
    uri: String,
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let opts = Options::parse();
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
    use clap::CommandFactory;
    use clap::error::ErrorKind;

    use super::*;

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        Options::try_parse_from(std::iter::once("greeter_client").chain(args.iter().copied()))
    }

    #[test]
    fn command_line_takes_tcp_a_count_and_the_uri() {
        let opts = parse(&["--requests", "9", "http://10.0.0.2:1", "--tcp"]);
        let opts = opts.expect("valid options");
        assert!(opts.tcp);
        assert_eq!(
            (opts.requests, opts.uri.as_str()),
            (Some(9), "http://10.0.0.2:1")
        );
        // By default: the demo, over RDMA, to the guest's greeter.
        let opts = parse(&[]).expect("no options");
        assert!(!opts.tcp);
        assert_eq!(
            (opts.requests, opts.uri.as_str()),
            (None, "http://10.77.0.1:50051")
        );
        for bad in [&["--requests"][..], &["--requests", "0"], &["--h2"]] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn help_names_every_flag() {
        Options::command().debug_assert();
        let help = parse(&["-h"]).expect_err("help is not a run");
        assert_eq!(help.kind(), ErrorKind::DisplayHelp);
        let text = help.to_string();
        for word in ["Usage: greeter_client", "--tcp", "--requests <N>", "[URI]"] {
            assert!(text.contains(word), "{word:?} missing from:\n{text}");
        }
        let bad = parse(&["--requests", "x"]).expect_err("a bad count");
        assert_eq!(bad.kind(), ErrorKind::ValueValidation);
        assert!(bad.to_string().contains("positive count"), "{bad}");
    }
}
