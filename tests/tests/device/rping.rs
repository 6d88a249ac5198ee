//! `examples/rping` against librdmacm's C `rping`, both directions, with payload verification.
//! The example's code is compiled into the device binary (`#[path]` in `main.rs`) and run
//! in-process. Both sides use the same `-S`: C rping reads and writes the advertised length into
//! its own `-S` buffer.

use rdma_async_device_tests::{
    argv, connect_when_listening, finish_tool, guard, listener, spawn_tool, test_ip,
};

use crate::rping_example::{self, parse_args, run_client, serve_listener};
use rdma_async_device_tests::ports;

const COUNT: usize = 10;
const SIZE: usize = 100;

fn args(line: &str) -> rping_example::Args {
    match parse_args(line.split_whitespace()) {
        Ok(rping_example::Command::Run(args)) => args,
        other => panic!("rping flags {line:?}: {other:?}"),
    }
}

/// The `ping data:` lines a verbose client printed, in order.
fn ping_lines(text: &str, prefix: &str) -> Vec<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix(prefix).map(str::to_owned))
        .collect()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_server_with_the_c_client() {
    let listener = listener().await;
    let addr = listener.local_addr().unwrap();
    let server_args = args(&format!("-s -V -S {SIZE}"));
    let server = tokio::spawn(async move { serve_listener(&server_args, listener).await });
    let child = spawn_tool(
        "rping",
        &argv![
            "-c",
            "-vV",
            "-a",
            addr.ip(),
            "-p",
            addr.port(),
            "-C",
            COUNT,
            "-S",
            SIZE
        ],
    );
    let text = finish_tool(child, "rping").await;
    // The C client validated every echo (-V fails on a mismatch) and printed it.
    let pings = ping_lines(&text, "ping data: ");
    assert_eq!(pings.len(), COUNT, "{text}");
    assert!(pings[0].starts_with("rdma-ping-0: ABCDEFG"), "{text}");
    assert!(
        pings[COUNT - 1].starts_with(&format!("rdma-ping-{}: ", COUNT - 1)),
        "{text}"
    );
    assert!(pings.iter().all(|p| p.len() == SIZE - 1), "{text}");
    guard("our rping server ends with the client", server)
        .await
        .unwrap()
        .expect("our rping server");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn our_client_with_the_c_server() {
    let port = ports::C_RPING_SERVER;
    let child = spawn_tool(
        "rping",
        &argv!["-s", "-v", "-S", SIZE, "-a", test_ip(), "-p", port],
    );
    let client_args = args(&format!(
        "-c -V -a {} -p {port} -C {COUNT} -S {SIZE}",
        test_ip()
    ));
    // The C server may not listen yet: retried while refused. Our client validates every echo.
    connect_when_listening(|| guard("our rping client", run_client(&client_args))).await;
    let text = finish_tool(child, "rping").await;
    let pings = ping_lines(&text, "server ping data: ");
    assert_eq!(pings.len(), COUNT, "{text}");
    assert!(pings[0].starts_with("rdma-ping-0: ABCDEFG"), "{text}");
    assert!(pings.iter().all(|p| p.len() == SIZE - 1), "{text}");
}
