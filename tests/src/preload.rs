//! Unmodified programs run over rsockets: rdma-core's `librspreload.so` in `LD_PRELOAD` turns
//! their libc socket calls into rsocket calls, so they speak the wire protocol `RStream` speaks.

use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

use crate::{STEP, guard};

/// Where rdma-core installs the preload library, under a library directory (Debian puts it in
/// the multiarch one, `/usr/lib/x86_64-linux-gnu/rsocket/`; Fedora in `/usr/lib64/rsocket/`).
const RSOCKET_SUBPATH: &str = "rsocket/librspreload.so";

/// The library directories searched, each also one level down (the multiarch triplet of this
/// machine's architecture).
const LIB_DIRS: [&str; 5] = [
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/lib64",
    "/usr/local/lib",
    "/lib",
];

/// The path of `librspreload.so`: `RDMA_ASYNC_RSPRELOAD` if set, else the first found under
/// the usual library directories. A missing library fails the test.
pub fn rspreload() -> PathBuf {
    if let Some(path) = std::env::var_os("RDMA_ASYNC_RSPRELOAD") {
        let path = PathBuf::from(path);
        assert!(
            path.is_file(),
            "RDMA_ASYNC_RSPRELOAD={} is not a file",
            path.display()
        );
        return path;
    }
    find_rspreload().unwrap_or_else(|| {
        panic!(
            "librspreload.so not found under {LIB_DIRS:?} (*/{RSOCKET_SUBPATH}): install \
             rdma-core's librdmacm (Debian/Ubuntu: librdmacm1) or set RDMA_ASYNC_RSPRELOAD"
        )
    })
}

fn find_rspreload() -> Option<PathBuf> {
    LIB_DIRS.iter().map(Path::new).find_map(|dir| {
        let direct = dir.join(RSOCKET_SUBPATH);
        if direct.is_file() {
            return Some(direct);
        }
        // Only this machine's own triplets (`x86_64-linux-gnu`, ...): with cross-building
        // packages installed, `aarch64-linux-gnu` may hold one too, which cannot be preloaded
        // into a program of another architecture.
        let own_arch = format!("{}-", std::env::consts::ARCH);
        let mut subdirs: Vec<PathBuf> = std::fs::read_dir(dir)
            .ok()?
            .filter_map(|entry| entry.ok().map(|e| e.path()))
            .filter(|path| {
                path.file_name()
                    .and_then(|name| name.to_str())
                    .is_some_and(|name| name.starts_with(&own_arch))
            })
            .collect();
        // Deterministic choice if several triplets have one.
        subdirs.sort();
        subdirs
            .into_iter()
            .map(|sub| sub.join(RSOCKET_SUBPATH))
            .find(|path| path.is_file())
    })
}

/// `program` with `args`, its sockets rsockets through `LD_PRELOAD`, stdin, stdout and stderr
/// piped, killed if dropped.
pub fn preloaded(program: &str, args: &[String]) -> Child {
    Command::new(program)
        .args(args)
        .env("LD_PRELOAD", rspreload())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

/// Feeds `input` to a child's stdin if piped (then closes it) while collecting its output
/// (stdout if piped, and stderr, which must be); asserts
/// that it exits successfully within the hang guard, else fails with what it printed to stderr
/// so far. Returns its output.
pub async fn finish_with_input(mut child: Child, program: &str, input: Vec<u8>) -> Output {
    let stdin = child.stdin.take();
    let stdout = child.stdout.take();
    let mut stderr = child.stderr.take().expect("stderr piped");
    // Tasks of their own: a program that writes while it reads would block on a full pipe if
    // its input were fed first.
    let feeding = tokio::spawn(async move {
        let Some(mut stdin) = stdin else {
            return Ok(());
        };
        let fed = stdin.write_all(&input).await;
        // Dropping stdin closes it: the program sees EOF.
        drop(stdin);
        fed
    });
    let reading = tokio::spawn(async move {
        let mut out = Vec::new();
        match stdout {
            Some(mut stdout) => stdout.read_to_end(&mut out).await.map(|_| out),
            None => Ok(out),
        }
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let errors_in = errors.clone();
    let reading_errors = tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = stderr.read(&mut buf).await {
            errors_in.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    });
    let status = match tokio::time::timeout(STEP, child.wait()).await {
        Ok(status) => status.expect("wait"),
        Err(_) => {
            let _ = child.kill().await;
            panic!(
                "{program} did not finish within {STEP:?}; its stderr:\n{}",
                String::from_utf8_lossy(&errors.lock().unwrap())
            );
        }
    };
    let stdout = guard("stdout", reading)
        .await
        .expect("stdout task")
        .expect("read stdout");
    guard("stderr", reading_errors).await.expect("stderr task");
    let stderr = std::mem::take(&mut *errors.lock().unwrap());
    assert!(
        status.success(),
        "{program} failed ({status}): {}",
        String::from_utf8_lossy(&stderr)
    );
    guard("feeding stdin", feeding)
        .await
        .expect("stdin task")
        .unwrap_or_else(|e| panic!("write {program}'s stdin: {e}"));
    Output {
        status,
        stdout,
        stderr,
    }
}

/// Runs `program` under librspreload with `input` on its stdin and its stdout, both regular
/// files (in the temporary directory, removed afterwards); asserts that it exits successfully
/// within the hang guard and returns what it wrote to stdout.
///
/// Files rather than pipes: socat under librspreload (rdma-core 44) ended its connection early
/// when its stdin and stdout were pipes, and never with files (see `docs/preload.md`).
pub async fn run_on_files(program: &str, args: &[String], input: &[u8]) -> Vec<u8> {
    let dir = std::env::temp_dir();
    let name = format!(
        "rdma-async-preload-{}-{}",
        std::process::id(),
        NEXT_FILE.fetch_add(1, Ordering::Relaxed)
    );
    let (input_path, output_path) = (
        dir.join(format!("{name}.in")),
        dir.join(format!("{name}.out")),
    );
    std::fs::write(&input_path, input).expect("write the input file");
    let child = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", rspreload())
        .stdin(std::fs::File::open(&input_path).expect("open the input file"))
        .stdout(std::fs::File::create(&output_path).expect("create the output file"))
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("run {program}: {e}"));
    let finished = finish_with_input(child, program, Vec::new()).await;
    drop(finished);
    let output = std::fs::read(&output_path).expect("read the output file");
    let _ = std::fs::remove_file(&input_path);
    let _ = std::fs::remove_file(&output_path);
    output
}

/// Numbers the temporary files of [`run_on_files`] within this process.
static NEXT_FILE: AtomicUsize = AtomicUsize::new(0);
