//! `examples/rping` against librdmacm's C `rping`, both directions, with payload verification.
//! The example's code is compiled into this test (`#[path]`) and run in-process. Both sides use
//! the same `-S`: C rping reads and writes the advertised length into its own `-S` buffer.

use rdma_async_tests::{finish_tool, guard, listener, spawn_tool, test_ip};

#[path = "../../examples/rping.rs"]
#[allow(dead_code)]
mod rping_example;

use rping_example::{parse_args, run_client, serve_listener};

const COUNT: usize = 10;
const SIZE: usize = 100;

fn args(line: &str) -> rping_example::Args {
    parse_args(line.split_whitespace().map(str::to_owned)).expect("rping flags")
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
    let addr = listener.local_addr();
    let server_args = args(&format!("-s -V -S {SIZE}"));
    let server = tokio::spawn(async move { serve_listener(&server_args, listener).await });
    let child = spawn_tool(
        "rping",
        &[
            "-c".into(),
            "-vV".into(),
            "-a".into(),
            addr.ip().to_string(),
            "-p".into(),
            addr.port().to_string(),
            "-C".into(),
            COUNT.to_string(),
            "-S".into(),
            SIZE.to_string(),
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
    let port = 17174u16;
    let child = spawn_tool(
        "rping",
        &[
            "-s".into(),
            "-v".into(),
            "-S".into(),
            SIZE.to_string(),
            "-a".into(),
            test_ip().to_string(),
            "-p".into(),
            port.to_string(),
        ],
    );
    let client_args = args(&format!(
        "-c -V -a {} -p {port} -C {COUNT} -S {SIZE}",
        test_ip()
    ));
    // The C server may not listen yet: retry while refused, as `connect_when_listening`.
    let mut result = Err(std::io::Error::other("not started"));
    for _ in 0..500 {
        result = guard("our rping client", run_client(&client_args)).await;
        match &result {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                tokio::task::yield_now().await
            }
            _ => break,
        }
    }
    result.expect("our rping client (validating every echo)");
    let text = finish_tool(child, "rping").await;
    let pings = ping_lines(&text, "server ping data: ");
    assert_eq!(pings.len(), COUNT, "{text}");
    assert!(pings[0].starts_with("rdma-ping-0: ABCDEFG"), "{text}");
    assert!(pings.iter().all(|p| p.len() == SIZE - 1), "{text}");
}
