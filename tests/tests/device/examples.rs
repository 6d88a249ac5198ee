//! The example programs themselves against librdmacm's C tools (and the tonic pair against
//! each other), as separate processes: what a user running them sees.
//!
//! The examples are built by `scripts/test` (`cargo build --examples`), which exports their
//! directory as `RDMA_ASYNC_EXAMPLES`; without it these tests fail rather than skip.

use rdma_async_device_tests::ports;
use rdma_async_device_tests::tools::{
    EXCHANGE_DONE, Tool, UDADDY_PORT, example, greeter_server, http_server,
};
use rdma_async_device_tests::{test_addr, test_ip};

/// Runs a client whose server is another process that gives no sign of being ready: retried
/// (boundedly) while it fails, as a user would rerun it.
async fn client_until_success(program: &str, args: &[&str], expected: &[&str]) -> String {
    let mut last = String::new();
    for _ in 0..50 {
        let (ok, text) = Tool::spawn(program, args).finish().await;
        if ok {
            for e in expected {
                assert!(text.contains(e), "{program} did not print {e:?}:\n{text}");
            }
            return text;
        }
        last = text;
    }
    panic!("{program} never succeeded; last output:\n{last}");
}

#[rdma_async::test]
async fn udaddy_example_server_with_c_client() {
    let _turn = UDADDY_PORT.lock().await;
    let ip = test_ip().to_string();
    let mut server = Tool::spawn(&example("udaddy"), &["-b", &ip, "-C", "10", "-S", "100"]);
    server.wait_for("receiving data transfers").await;
    let client = Tool::spawn("udaddy", &["-s", &ip, "-b", &ip, "-C", "10", "-S", "100"]);
    client.expect_success(&EXCHANGE_DONE).await;
    server.expect_success(&["data transfers complete"]).await;
}

#[rdma_async::test]
async fn udaddy_example_client_with_c_server() {
    let _turn = UDADDY_PORT.lock().await;
    let ip = test_ip().to_string();
    let server = Tool::spawn("udaddy", &["-b", &ip, "-C", "10", "-S", "100"]);
    client_until_success(
        &example("udaddy"),
        &["-s", &ip, "-b", &ip, "-C", "10", "-S", "100"],
        &EXCHANGE_DONE,
    )
    .await;
    server.expect_success(&EXCHANGE_DONE).await;
}

/// A multicast exchange: `receiver` joins `group`, then `sender` sends 10 datagrams to it.
async fn mckey_exchange(receiver: &str, sender: &str, group: &str) {
    let ip = test_ip().to_string();
    let common = ["-m", group, "-b", &ip, "-C", "10", "-S", "100"];
    let mut receiving = Tool::spawn(receiver, &common);
    receiving.wait_for("joined").await;
    let mut sender_args = common.to_vec();
    sender_args.push("-s");
    let sending = Tool::spawn(sender, &sender_args);
    sending.expect_success(&["return status 0"]).await;
    receiving.expect_success(&EXCHANGE_DONE).await;
}

#[rdma_async::test]
async fn mckey_example_sender_with_c_receiver() {
    mckey_exchange("mckey", &example("mckey"), "239.77.1.1").await;
}

#[rdma_async::test]
async fn mckey_example_receiver_with_c_sender() {
    mckey_exchange(&example("mckey"), "mckey", "239.77.1.2").await;
}

#[rdma_async::test]
async fn rstream_example_server_with_c_client() {
    let ip = test_ip().to_string();
    // A fixed port: the C client needs to know it, and rstream has no way to print it.
    let port = &ports::RSTREAM_EXAMPLE_SERVER.to_string();
    let server = Tool::spawn(
        &example("rstream"),
        &["-b", &ip, "-p", port, "-T", "v", "-S", "4096", "-C", "20"],
    );
    client_until_success(
        "rstream",
        &["-s", &ip, "-p", port, "-T", "v", "-S", "4096", "-C", "20"],
        &["4k"],
    )
    .await;
    server.expect_success(&["4k"]).await;
}

#[rdma_async::test]
async fn rstream_example_zero_copy_client_is_verified_by_a_c_server() {
    // `-T z`: every send goes from a registered region by write_region; `-T l`: every receive
    // borrows the bytes in the ring (read_lent, checked in place). C rstream (-T v) checks
    // every byte we send, we check every byte it sends. 20 KiB transfers: several per ring,
    // wrapping its end.
    let ip = test_ip().to_string();
    let port = &ports::RSTREAM_EXAMPLE_PAIR.to_string();
    let args = ["-p", port, "-T", "v", "-S", "20480", "-C", "40"];
    let mut c_args = vec!["-b", ip.as_str()];
    c_args.extend(args);
    let server = Tool::spawn("rstream", &c_args);
    let mut our_args = vec!["-s", ip.as_str(), "-T", "z", "-T", "l"];
    our_args.extend(args);
    client_until_success(&example("rstream"), &our_args, &["20k"]).await;
    server.expect_success(&["20k"]).await;
}

#[rdma_async::test]
async fn greeter_examples_over_rdma() {
    let addr = format!("{}:50071", test_ip());
    let mut server = Tool::spawn(&example("greeter_server"), &[&addr]);
    server.wait_for("greeter listening").await;
    let client = Tool::spawn(&example("greeter_client"), &[&format!("http://{addr}")]);
    client
        .expect_success(&[
            "unary: Hello RDMA!",
            "stream: Hello RDMA, #0",
            "stream: Hello RDMA, #2",
        ])
        .await;
    server.wait_for("greeting RDMA from Some(").await;
}

#[rdma_async::test]
async fn tls_echo_example_verifies_and_echoes() {
    let addr = test_addr(ports::TLS_ECHO_EXAMPLE).to_string();
    Tool::spawn(&example("tls_echo"), &[&addr])
        .expect_success(&[
            "server certificate verified: true",
            "echo: hello over TLS over RDMA",
            "echo: second line",
        ])
        .await;
}

/// The `key=value` field `key` of a `many_streams` report line.
fn field(report: &str, key: &str) -> f64 {
    report
        .split_whitespace()
        .find_map(|kv| kv.strip_prefix(key)?.strip_prefix('='))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {key}= in {report:?}"))
}

#[rdma_async::test]
async fn many_streams_example_echoes_every_connection_and_reports_its_cost() {
    // The short version of scripts/compare-many: 16 connections, 50 round trips of 256 B each.
    let addr = test_addr(ports::MANY_STREAMS_EXAMPLE).to_string();
    let mut server = Tool::spawn(
        &example("many_streams"),
        &["server", &addr, "16", "50", "256"],
    );
    server.wait_for("listening on").await;
    let client = Tool::spawn(
        &example("many_streams"),
        &["client", &addr, "16", "50", "256"],
    )
    .expect_success(&["client pairs=16 transfers=1600 "])
    .await;
    let (ok, server) = server.finish().await;
    assert!(ok, "the server failed:\n{server}");
    let server = server
        .lines()
        .find(|l| l.starts_with("server "))
        .unwrap_or_else(|| panic!("no server report:\n{server}"));
    assert_eq!(field(server, "transfers"), 1600.0, "{server}");
    let client = client
        .lines()
        .find(|l| l.starts_with("client "))
        .unwrap_or_else(|| panic!("no client report:\n{client}"));
    for report in [client, server] {
        // Every connection costs descriptors (2 per RStream, and on the client what its first
        // connection opens once, shared by all 16), and the work costs CPU.
        let fds = field(report, "fds_per_conn");
        assert!((1.0..=3.0).contains(&fds), "{report}");
        assert!(field(report, "transfers_per_s") > 0.0, "{report}");
    }
}

#[rdma_async::test]
async fn many_streams_example_holds_a_thousand_echoing_streams_in_one_process() {
    // The short version of scripts/many-streams: 1,000 streams (500 connections to a server in
    // the same process), 10 round trips of 64 B on each, sharing one completion channel. They
    // take about 1,000 descriptors (2,000 without sharing): near the default soft limit
    // (1024), so the example runs under a raised one.
    let addr = test_addr(ports::THOUSAND_STREAMS_EXAMPLE).to_string();
    let program = example("many_streams");
    let args = [
        "--nofile=65536",
        &program,
        "local",
        &addr,
        "1000",
        "10",
        "64",
        "4096",
        "--shared-channels",
    ];
    let report = Tool::spawn("prlimit", &args)
        .expect_success(&["local streams=1000 channels=shared "])
        .await;
    let report = report_line(&report, "local ");
    // 500 connections, each round trip 4 transfers (2 on each side).
    assert_eq!(field(report, "transfers"), 20_000.0, "{report}");
    let fds = field(report, "fds_per_stream");
    // 1 per stream (its rdma_cm channel); the shared completion channel, opened once, shows
    // as a thousandth.
    assert!(fds <= 1.01, "more than 1 descriptor per stream: {report}");
    assert!(field(report, "rss_kib_per_stream") > 0.0, "{report}");
    assert!(field(report, "cpu_us_per_transfer") > 0.0, "{report}");
}

/// Runs an example's server (until it prints "listening on") and then its client, each to a
/// successful end; returns their outputs (client, server).
async fn server_then_client(program: &str, server: &[&str], client: &[&str]) -> (String, String) {
    let mut server_run = Tool::spawn(&example(program), server);
    server_run.wait_for("listening on").await;
    let (ok, client_out) = Tool::spawn(&example(program), client).finish().await;
    assert!(ok, "the {program} client failed:\n{client_out}");
    let (ok, server_out) = server_run.finish().await;
    assert!(ok, "the {program} server failed:\n{server_out}");
    (client_out, server_out)
}

/// The line of `output` that starts with `prefix`.
fn report_line<'a>(output: &'a str, prefix: &str) -> &'a str {
    output
        .lines()
        .find(|l| l.starts_with(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} line in:\n{output}"))
}

/// The `fnv1a=` field of a report line.
fn checksum(line: &str) -> &str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix("fnv1a="))
        .unwrap_or_else(|| panic!("no checksum in {line:?}"))
}

#[rdma_async::test]
async fn serve_file_example_fetches_a_mapped_file_by_rdma_read_intact() {
    // /dev/shm: the guest's /tmp is a 9p share, which has no shared mappings.
    let dir = std::path::Path::new("/dev/shm");
    let src = dir.join(format!("serve-file-src-{}", std::process::id()));
    let out = dir.join(format!("serve-file-out-{}", std::process::id()));
    // Three and a bit chunks of 1 MiB, so the last read is a partial one.
    let data: Vec<u8> = (0..(3 << 20) + 12_345)
        .map(|i| (i * 31 % 256) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    let addr = test_addr(ports::SERVE_FILE_EXAMPLE).to_string();
    let (client, server) = server_then_client(
        "serve_file",
        &["server", &addr, src.to_str().unwrap()],
        &["client", &addr, out.to_str().unwrap()],
    )
    .await;
    let fetched = report_line(&client, "fetched ");
    let served = report_line(&server, "served ");
    assert!(
        fetched.starts_with(&format!("fetched {} bytes", data.len())),
        "{fetched}"
    );
    assert!(
        served.starts_with(&format!("served {} bytes", data.len())),
        "{served}"
    );
    assert_eq!(checksum(fetched), checksum(served));
    assert!(
        std::fs::read(&out).unwrap() == data,
        "the fetched file differs"
    );
    assert!(fetched.contains(", 4 reads,"), "{fetched}");
    std::fs::remove_file(&src).unwrap();
    std::fs::remove_file(&out).unwrap();
}

#[rdma_async::test]
async fn zero_copy_example_streams_pool_buffers_without_a_copy() {
    let addr = test_addr(ports::ZERO_COPY_EXAMPLE).to_string();
    // 3 MiB in 96 KiB regions: not a multiple of the ring size, so chunks straddle its end.
    let (client, server) = server_then_client(
        "zero_copy",
        &["server", &addr],
        &["client", &addr, "3", "98304"],
    )
    .await;
    let sent = report_line(&client, "sent ");
    let received = report_line(&server, "received ");
    assert!(sent.starts_with("sent 3145728 bytes"), "{sent}");
    assert!(received.starts_with("received 3145728 bytes"), "{received}");
    assert_eq!(checksum(sent), checksum(received));
    assert!(
        sent.contains("zero_copy_bytes=3145728 "),
        "every byte went by zero copy: {sent}"
    );
    // The server borrowed every piece but the last 8 bytes: the 8-byte length before the data
    // moved the stream 8 bytes into the ring, so they start a half the client never fills.
    assert!(
        received.ends_with("lent_bytes=3145720"),
        "every full half was lent: {received}"
    );
}

#[rdma_async::test]
async fn msg_rate_example_counts_every_message_of_both_kinds() {
    // The short version of scripts/compare-rate: 500 messages at depth 8, sends and writes.
    for (kind, port) in [
        ("send", ports::MSG_RATE_EXAMPLE),
        ("write", ports::MSG_RATE_EXAMPLE + 1),
    ] {
        let addr = format!("{}:{port}", test_ip());
        let (client, server) = server_then_client(
            "msg_rate",
            &["server", &addr, kind, "8", "64"],
            &["client", &addr, kind, "8", "64", "500"],
        )
        .await;
        for line in [
            report_line(&client, &format!("{kind} client ")),
            report_line(&server, &format!("{kind} server ")),
        ] {
            assert!(line.contains(" depth=8 size=64 msgs=500 "), "{line}");
        }
        assert!(
            field(report_line(&client, kind), "msgs_per_s") > 0.0,
            "{client}"
        );
    }
    // Writes in batches of 4 (`RdmaConnection::write_batch`): one doorbell per batch, and the
    // 2 writers (depth 8 / 4) make 250 writes each, 62 batches of 4 and one of 2.
    let addr = format!("{}:{}", test_ip(), ports::MSG_RATE_BATCH_EXAMPLE);
    let (client, server) = server_then_client(
        "msg_rate",
        &["server", &addr, "write", "8", "64"],
        &["client", &addr, "write", "8", "64", "500", "--batch", "4"],
    )
    .await;
    let line = report_line(&server, "write server ");
    assert!(line.contains(" depth=8 size=64 msgs=500 "), "{line}");
    let doorbells = field(report_line(&client, "write client "), "post_sends_per_msg");
    assert!(
        (doorbells * 500.0).round() <= 126.0,
        "batches of 4 took {doorbells} ibv_post_send calls a write: {client}"
    );
}

#[rdma_async::test]
async fn http_client_example_times_requests_over_rdma_and_over_tcp() {
    // The short version of scripts/compare-wire's HTTP rows, on one device.
    for (transport, flags) in [("RDMA", &[][..]), ("TCP", &["--tcp"][..])] {
        let (server, addr) = http_server(flags).await;
        let url = format!("http://{addr}/timed");
        let mut runs = vec![flags.to_vec()];
        for h2 in [false, true] {
            let mut timed = vec!["--requests", "25"];
            timed.extend_from_slice(flags);
            if h2 {
                timed.push("--h2");
            }
            runs.push(timed);
        }
        let mut outputs = Vec::new();
        for mut args in runs {
            args.push(&url);
            let (ok, out) = Tool::spawn(&example("http_client"), &args).finish().await;
            if !ok {
                let server_out = server.stop_with_output().await;
                panic!("http_client {args:?} failed:\n{out}\nhttp_server printed:\n{server_out}");
            }
            outputs.push(out);
        }
        let greeting = &outputs[0];
        assert!(
            greeting.contains(&format!("you asked for /timed over {transport}\n")),
            "{greeting}"
        );
        assert_eq!(greeting.matches("HTTP/1.1 200 OK").count(), 3, "{greeting}");
        for (out, h2) in outputs[1..].iter().zip([false, true]) {
            assert_percentiles(out, 25, &format!("{transport} h2={h2}"));
        }
    }
}

#[rdma_async::test]
async fn greeter_client_example_times_calls_over_rdma_and_over_tcp() {
    // The short version of scripts/compare-wire's gRPC row, on one device.
    for (transport, flags) in [("RDMA", &[][..]), ("TCP", &["--tcp"][..])] {
        let (mut server, addr) = greeter_server(flags).await;
        let uri = format!("http://{addr}");
        let mut args = vec!["--requests", "25"];
        args.extend_from_slice(flags);
        args.push(&uri);
        let (ok, out) = Tool::spawn(&example("greeter_client"), &args)
            .finish()
            .await;
        if !ok {
            let server_out = server.stop_with_output().await;
            panic!("greeter_client {args:?} failed:\n{out}\ngreeter_server printed:\n{server_out}");
        }
        assert_percentiles(&out, 25, transport);
        // The calls reached the service over the transport asked for.
        let greeting = server.wait_for("greeting RDMA from Some(").await;
        assert!(
            greeting.ends_with(&format!(" over {transport}")),
            "{greeting}"
        );
    }
}

/// Asserts that a timed client's `requests N p50 X us p90 Y us p99 Z us` line counts
/// `requests` and has positive percentiles in order.
fn assert_percentiles(out: &str, requests: usize, what: &str) {
    let line = report_line(out, &format!("requests {requests} "));
    let micros: Vec<f64> = ["p50", "p90", "p99"]
        .iter()
        .map(|p| {
            let after = line.split(&format!("{p} ")).nth(1).unwrap_or("");
            let value = after.split_whitespace().next().unwrap_or("");
            value
                .parse()
                .unwrap_or_else(|_| panic!("no {p} in {line:?}"))
        })
        .collect();
    assert!(
        micros[0] > 0.0 && micros[0] <= micros[1] && micros[1] <= micros[2],
        "{what}: percentiles out of order: {line}"
    );
}
