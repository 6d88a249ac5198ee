//! Other programs: librdmacm's C tools (`ucmatose`, `rstream`, `rping`, `udaddy`, `mckey`, from
//! rdmacm-utils), the example programs and this package's own, run as child processes.

use std::ffi::OsStr;
use std::io;
use std::path::PathBuf;
use std::process::{Output, Stdio};

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader, Lines};
use tokio::process::{Child, ChildStdout, Command};

use crate::guard;

/// An argument vector for [`spawn_tool`] from anything `Display`:
/// `argv!["-b", test_ip(), "-p", port]`.
#[macro_export]
macro_rules! argv {
    ($($arg:expr),* $(,)?) => {
        ::std::vec![$(::std::string::ToString::to_string(&$arg)),*]
    };
}

/// What ucmatose, udaddy and mckey (and our examples of them) print after an exchange that
/// went well.
pub const EXCHANGE_DONE: [&str; 2] = ["data transfers complete", "return status 0"];

/// udaddy's port is fixed (7174; its `-p` selects the port space, not the port): every test
/// that runs a udaddy server, ours or the C one, holds this lock while it does.
pub static UDADDY_PORT: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Our example binary `name`, from the directory `scripts/test` exports as
/// `RDMA_ASYNC_EXAMPLES` after `cargo build --examples`; without it the test fails rather than
/// skips.
pub fn example(name: &str) -> String {
    let dir = std::env::var("RDMA_ASYNC_EXAMPLES").unwrap_or_else(|_| {
        panic!(
            "RDMA_ASYNC_EXAMPLES is not set: run through scripts/test, which builds the examples"
        )
    });
    let path = PathBuf::from(dir).join(name);
    assert!(path.is_file(), "example {} was not built", path.display());
    path.to_string_lossy().into_owned()
}

/// A program of this package (`src/bin/`: `wire-peer`, `limits-peer`), next to the test
/// binary's `deps/`.
pub fn package_program(name: &str) -> String {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "{} was not built (cargo test builds it)",
        path.display()
    );
    path.to_string_lossy().into_owned()
}

/// `limits-peer ARGS` under a locked-memory limit of `memlock` bytes and without
/// `CAP_IPC_LOCK` (which root has, and which lifts the limit), as an unprivileged process would
/// run; its standard input, output and error are piped.
pub fn spawn_limits_peer(memlock: u64, args: &[&str]) -> Child {
    Command::new("prlimit")
        .arg(format!("--memlock={memlock}:{memlock}"))
        .args([
            "setpriv",
            "--inh-caps=-ipc_lock",
            "--bounding-set=-ipc_lock",
            "--",
        ])
        .arg(package_program("limits-peer"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("run prlimit and setpriv (util-linux)")
}

/// The lines `child` prints on its standard output (taken from it).
pub fn stdout_lines(child: &mut Child) -> Lines<BufReader<ChildStdout>> {
    BufReader::new(child.stdout.take().expect("stdout")).lines()
}

/// What a finished program printed: its standard output, then its standard error.
pub fn output_text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// Runs `program` to completion and returns its standard output; panics, with its standard
/// error, when it cannot be run or fails.
pub async fn output_of(program: &str, args: &[&str]) -> String {
    let out = Command::new(program)
        .args(args)
        .output()
        .await
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    assert!(
        out.status.success(),
        "{program} {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Starts one of rdma-core's C tools (`ucmatose`, `rstream`, ...) with its output captured.
pub fn spawn_tool(program: &str, args: &[String]) -> Child {
    Command::new(program)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {program} (package rdmacm-utils): {e}"))
}

/// Waits for a C tool to exit successfully and returns what it printed.
pub async fn finish_tool(child: Child, program: &str) -> String {
    let out = guard(program, child.wait_with_output())
        .await
        .expect("tool output");
    let text = output_text(&out);
    assert!(
        out.status.success(),
        "{program} failed ({}):\n{text}",
        out.status
    );
    text
}

/// Waits for a C tool to exit successfully and asserts that it printed each of `expected`.
pub async fn finish_tool_printing(child: Child, program: &str, expected: &[&str]) -> String {
    let text = finish_tool(child, program).await;
    for e in expected {
        assert!(text.contains(e), "{program} did not print {e:?}:\n{text}");
    }
    text
}

/// Waits (under the hang guard) until port 1 of the RDMA device `device` shows `state`
/// (`ACTIVE`, `DOWN`) in `rdma link show`. A failed `rdma link show`, as for a device just
/// added and not yet listed, is polled again.
pub async fn wait_port_state(device: &str, state: &str) {
    let port = format!("{device}/1");
    let want = format!("state {state} ");
    guard(&format!("{port} {want}in rdma link"), async {
        let mut tick = tokio::time::interval(std::time::Duration::from_millis(100));
        loop {
            tick.tick().await;
            let out = Command::new("rdma")
                .args(["link", "show", &port])
                .output()
                .await
                .expect("run the rdma tool");
            if String::from_utf8_lossy(&out.stdout).contains(&want) {
                return;
            }
        }
    })
    .await;
}

/// Connects with `connect`, retrying (boundedly) while refused: a C server just started may not
/// listen yet, and there is no event to wait for from another process.
pub async fn connect_when_listening<T, F, Fut>(mut connect: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = io::Result<T>>,
{
    for _ in 0..500 {
        match connect().await {
            Ok(conn) => return conn,
            Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => {
                tokio::task::yield_now().await
            }
            Err(e) => panic!("connect to the C server: {e}"),
        }
    }
    panic!("the C server never started listening");
}

/// A running program whose output is read line by line, so that a test can wait for what it
/// prints (a server's "listening", a receiver's "joined").
pub struct Tool {
    name: String,
    child: Child,
    lines: Lines<BufReader<ChildStdout>>,
    seen: String,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}

impl Tool {
    /// Starts `program` (line-buffered through `stdbuf`, for the C tools' sake).
    pub fn spawn<S: AsRef<OsStr>>(program: &str, args: &[S]) -> Tool {
        let mut child = Command::new("stdbuf")
            .arg("-oL")
            .arg(program)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("run {program}: {e}"));
        let lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
        Tool {
            name: program.rsplit('/').next().unwrap_or(program).to_owned(),
            child,
            lines,
            seen: String::new(),
        }
    }

    /// Reads output until a line contains `marker`; returns that line.
    pub async fn wait_for(&mut self, marker: &str) -> String {
        let what = format!("{} prints {marker:?}", self.name);
        loop {
            match guard(&what, self.lines.next_line()).await.expect("output") {
                Some(line) => {
                    self.seen.push_str(&line);
                    self.seen.push('\n');
                    if line.contains(marker) {
                        return line;
                    }
                }
                None => panic!(
                    "{} ended before printing {marker:?}:\n{}",
                    self.name, self.seen
                ),
            }
        }
    }

    /// Stops the program (SIGKILL) and returns all it printed: what a server said, for the
    /// message of a failed client.
    pub async fn stop_with_output(mut self) -> String {
        let _ = self.child.start_kill();
        self.finish().await.1
    }

    /// Waits for the program to exit; returns whether it succeeded and all it printed.
    pub async fn finish(mut self) -> (bool, String) {
        let what = format!("{} exits", self.name);
        while let Some(line) = guard(&what, self.lines.next_line()).await.expect("output") {
            self.seen.push_str(&line);
            self.seen.push('\n');
        }
        let mut stderr = String::new();
        if let Some(mut err) = self.child.stderr.take() {
            let _ = err.read_to_string(&mut stderr).await;
        }
        let status = guard(&what, self.child.wait()).await.expect("wait");
        (status.success(), format!("{}{stderr}", self.seen))
    }

    /// As `finish`, asserting success and that the output contains each of `expected`.
    pub async fn expect_success(self, expected: &[&str]) -> String {
        let name = self.name.clone();
        let (ok, text) = self.finish().await;
        assert!(ok, "{name} failed:\n{text}");
        for e in expected {
            assert!(text.contains(e), "{name} did not print {e:?}:\n{text}");
        }
        text
    }
}

/// Starts `examples/http_server` with `args` (`--tcp` for TCP) on an ephemeral port of the test
/// address; returns it and the address it listens on, which it prints.
pub async fn http_server(args: &[&str]) -> (Tool, std::net::SocketAddr) {
    listening_example("http_server", args).await
}

/// Starts `examples/greeter_server` as [`http_server`] starts `examples/http_server`.
pub async fn greeter_server(args: &[&str]) -> (Tool, std::net::SocketAddr) {
    listening_example("greeter_server", args).await
}

/// Starts the server example `name` with `args` and an ephemeral port of the test address, and
/// waits for its "listening on [http://]ADDR" line.
async fn listening_example(name: &str, args: &[&str]) -> (Tool, std::net::SocketAddr) {
    let bind = format!("{}:0", crate::test_ip());
    let mut all = args.to_vec();
    all.push(&bind);
    let mut server = Tool::spawn(&example(name), &all);
    let line = server.wait_for("listening on ").await;
    let addr = line
        .rsplit("listening on ")
        .next()
        .map(|a| a.trim().trim_start_matches("http://"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {name}'s {line:?}"));
    (server, addr)
}
