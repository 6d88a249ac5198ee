//! The soak (`tests/tests/wire/soak.rs`, `scripts/soak`, and `wire-peer soak` on node 2): an
//! `RStream` moving a volume each way through split halves with random write and read sizes
//! (1 B to 1 MiB) and random drops of pending read and write futures, hashing both ends; and
//! `RdmaConnection` random reads and writes with canaries around the target. Everything random
//! comes from a printed seed.

use std::future::Future;
use std::io;
use std::pin::pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::Poll;
use std::time::Instant;

use rdma_async::rdma::{RdmaConnection, RemoteRegion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::guard;

/// Largest write, read or RDMA operation of the soak.
pub const MAX_OP: usize = 1 << 20;

/// xorshift64*: small, seeded, good enough to pick sizes and offsets.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed` (any value; zero is remapped).
    pub fn new(seed: u64) -> Rng {
        let mut rng = Rng(seed ^ 0x9e37_79b9_7f4a_7c15);
        if rng.0 == 0 {
            rng.0 = 1;
        }
        rng.next_u64();
        rng
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }

    /// True with probability `1/n`.
    pub fn one_in(&mut self, n: u64) -> bool {
        self.below(n) == 0
    }

    /// A size from 1 to `max`, log-uniform (as many 1-byte-ish sizes as megabyte ones).
    pub fn size(&mut self, max: usize) -> usize {
        let bits = usize::BITS - max.leading_zeros(); // max < 2^bits
        let e = self.below(u64::from(bits)) as u32;
        let lo = 1usize << e;
        let n = lo + self.below(lo as u64) as usize;
        n.clamp(1, max)
    }

    /// Fills `buf` with random bytes.
    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let w = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&w[..chunk.len()]);
        }
    }
}

/// A seed from `RDMA_ASYNC_SOAK_SEED` (decimal or 0x-hex), else from the clock.
pub fn seed() -> u64 {
    match std::env::var("RDMA_ASYNC_SOAK_SEED") {
        Ok(s) if !s.is_empty() => parse_u64(&s).unwrap_or_else(|| panic!("bad seed {s:?}")),
        _ => {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap();
            t.as_nanos() as u64 ^ (u64::from(std::process::id()) << 32)
        }
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => s.parse().ok(),
    }
}

/// A byte count such as `4096`, `64K`, `256M`, `4G` (binary units).
pub fn parse_bytes(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, shift) = match s.chars().last()? {
        'k' | 'K' => (&s[..s.len() - 1], 10),
        'm' | 'M' => (&s[..s.len() - 1], 20),
        'g' | 'G' => (&s[..s.len() - 1], 30),
        _ => (s, 0),
    };
    num.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// A byte count from the environment variable `name`, else `default`.
pub fn env_bytes(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(s) if !s.is_empty() => parse_bytes(&s).unwrap_or_else(|| panic!("{name}={s:?}")),
        _ => default,
    }
}

/// This process's resident set (`VmRSS` of /proc/self/status), in KiB.
pub fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("VmRSS in /proc/self/status")
}

/// A running hash of a byte stream that does not depend on how the stream is cut: FNV-1a over
/// its 64-bit little-endian words (a final partial word zero-padded, then the length), so a
/// debug build keeps up with the wire.
#[derive(Clone, Debug, Default)]
pub struct StreamHash {
    h: u64,
    len: u64,
    tail: [u8; 8],
}

impl StreamHash {
    /// A fresh hash.
    pub fn new() -> StreamHash {
        StreamHash {
            h: 0xcbf2_9ce4_8422_2325,
            len: 0,
            tail: [0; 8],
        }
    }

    fn word(&mut self, w: u64) {
        self.h = (self.h ^ w).wrapping_mul(0x0100_0000_01b3);
    }

    /// Adds `bytes`.
    pub fn update(&mut self, mut bytes: &[u8]) {
        let have = (self.len % 8) as usize;
        self.len += bytes.len() as u64;
        if have > 0 {
            let take = (8 - have).min(bytes.len());
            self.tail[have..have + take].copy_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if have + take < 8 {
                return;
            }
            let w = u64::from_le_bytes(self.tail);
            self.word(w);
        }
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().unwrap()));
        }
        let rest = words.remainder();
        self.tail[..rest.len()].copy_from_slice(rest);
    }

    /// The hash of everything added (and its length).
    pub fn finish(&self) -> u64 {
        let mut end = self.clone();
        let have = (self.len % 8) as usize;
        if have > 0 {
            let mut last = [0u8; 8];
            last[..have].copy_from_slice(&self.tail[..have]);
            end.word(u64::from_le_bytes(last));
        }
        end.word(self.len);
        end.h
    }
}

/// The bytes a stream soak sends: a random pool whose length is not a power of two, repeated,
/// so a lost, duplicated or misplaced piece shows in the hash and in the receiver's check.
#[derive(Debug)]
pub struct Pool(Vec<u8>);

impl Pool {
    /// The pool of the side that sends with `seed`.
    pub fn new(seed: u64) -> Pool {
        let mut bytes = vec![0u8; MAX_OP + 4099];
        Rng::new(seed ^ 0x5eed_b17e).fill(&mut bytes);
        Pool(bytes)
    }

    /// The stream's bytes from `pos`, at most `max` of them (contiguous in the pool).
    pub fn at(&self, pos: u64, max: usize) -> &[u8] {
        let off = (pos % self.0.len() as u64) as usize;
        &self.0[off..(off + max).min(self.0.len())]
    }
}

/// Progress lines: one at each 10 % of `total` bytes, with elapsed time, rate and RSS.
#[derive(Debug)]
pub struct Progress {
    label: String,
    total: u64,
    done: AtomicU64,
    start: Instant,
}

impl Progress {
    /// Progress of `label` towards `total` bytes, starting now.
    pub fn new(label: &str, total: u64) -> Arc<Progress> {
        println!("soak: {label}: start, {} MiB", total >> 20);
        Arc::new(Progress {
            label: label.into(),
            total: total.max(1),
            done: AtomicU64::new(0),
            start: Instant::now(),
        })
    }

    /// Counts `n` more bytes, printing a line when a tenth is crossed.
    pub fn add(&self, n: u64) {
        let before = self.done.fetch_add(n, Ordering::Relaxed);
        let after = before + n;
        let (d0, d1) = (before * 10 / self.total, after * 10 / self.total);
        if d1 > d0 {
            self.line(&format!("{}%", (d1 * 10).min(100)), after);
        }
    }

    /// Prints the closing line.
    pub fn end(&self) {
        self.line("done", self.done.load(Ordering::Relaxed));
    }

    fn line(&self, what: &str, done: u64) {
        let secs = self.start.elapsed().as_secs_f64();
        println!(
            "soak: {}: {what}: {} MiB in {secs:.1} s, {:.1} MiB/s, rss {} KiB",
            self.label,
            done >> 20,
            done as f64 / 1048576.0 / secs.max(1e-9),
            rss_kib()
        );
    }
}

/// Awaits `fut`, or with `Some(polls)` drops it if it is still pending after `polls` more
/// (self-woken) polls and returns `None`: a drop at a random point of a pending operation.
pub async fn or_drop<F: Future>(fut: F, polls: Option<u32>) -> Option<F::Output> {
    let Some(mut left) = polls else {
        return Some(fut.await);
    };
    let mut fut = pin!(fut);
    std::future::poll_fn(move |cx| match fut.as_mut().poll(cx) {
        Poll::Ready(v) => Poll::Ready(Some(v)),
        Poll::Pending if left == 0 => Poll::Ready(None),
        Poll::Pending => {
            left -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    })
    .await
}

/// One operation in about eight gets a drop point: `Some(polls)` with polls below `max`.
fn drop_point(rng: &mut Rng, max: u64) -> Option<u32> {
    rng.one_in(8).then(|| rng.below(max) as u32)
}

/// What one direction of a stream soak saw.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flow {
    /// Bytes.
    pub bytes: u64,
    /// Their [`StreamHash`].
    pub hash: u64,
    /// Operations.
    pub ops: u64,
    /// Pending operations dropped.
    pub drops: u64,
}

impl std::fmt::Display for Flow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} bytes hash {:016x} ({} ops, {} dropped)",
            self.bytes, self.hash, self.ops, self.drops
        )
    }
}

/// Writes `bytes` of [`Pool::new`]`(seed)` in random sizes, dropping one pending write in
/// about eight, then shuts down.
pub async fn soak_writer<W: AsyncWrite + Unpin>(
    mut wr: W,
    bytes: u64,
    seed: u64,
    progress: Option<Arc<Progress>>,
) -> io::Result<Flow> {
    let pool = Pool::new(seed);
    let mut rng = Rng::new(seed ^ 0x1111);
    let mut hash = StreamHash::new();
    let mut flow = Flow::default();
    while flow.bytes < bytes {
        let want = rng.size(MAX_OP).min((bytes - flow.bytes) as usize);
        let src = pool.at(flow.bytes, want);
        let polls = drop_point(&mut rng, 8);
        flow.ops += 1;
        match guard("a soak write", or_drop(wr.write(src), polls)).await {
            None => flow.drops += 1,
            Some(r) => {
                let n = r?;
                assert!(
                    n > 0 && n <= src.len(),
                    "write returned {n} of {}",
                    src.len()
                );
                hash.update(&src[..n]);
                flow.bytes += n as u64;
                if let Some(p) = &progress {
                    p.add(n as u64);
                }
            }
        }
    }
    guard("shutdown after the soak", wr.shutdown()).await?;
    flow.hash = hash.finish();
    Ok(flow)
}

/// Reads to EOF in random sizes, dropping one pending read in about eight, hashing and
/// checking every byte against [`Pool::new`]`(peer_seed)`, the sender's pool.
pub async fn soak_reader<R: AsyncRead + Unpin>(
    mut rd: R,
    seed: u64,
    peer_seed: u64,
    progress: Option<Arc<Progress>>,
) -> io::Result<Flow> {
    let pool = Pool::new(peer_seed);
    let mut rng = Rng::new(seed ^ 0x2222);
    let mut hash = StreamHash::new();
    let mut buf = vec![0u8; MAX_OP];
    let mut flow = Flow::default();
    loop {
        let want = rng.size(MAX_OP);
        let polls = drop_point(&mut rng, 8);
        flow.ops += 1;
        let n = match guard("a soak read", or_drop(rd.read(&mut buf[..want]), polls)).await {
            None => {
                flow.drops += 1;
                continue;
            }
            Some(r) => r?,
        };
        if n == 0 {
            break;
        }
        let got = &buf[..n];
        let mut at = 0;
        while at < n {
            let expect = pool.at(flow.bytes + at as u64, n - at);
            if got[at..at + expect.len()] != *expect {
                let i = (0..expect.len())
                    .find(|&i| got[at + i] != expect[i])
                    .unwrap();
                return Err(io::Error::other(format!(
                    "wrong byte at stream offset {}: got {:#04x}, sent {:#04x}",
                    flow.bytes + (at + i) as u64,
                    got[at + i],
                    expect[i]
                )));
            }
            at += expect.len();
        }
        hash.update(got);
        flow.bytes += n as u64;
        if let Some(p) = &progress {
            p.add(n as u64);
        }
    }
    flow.hash = hash.finish();
    Ok(flow)
}

/// Both directions of one end of a stream soak on split halves, each in a task of its own:
/// `(sent, received)`.
pub async fn soak_stream(
    stream: rdma_async::stream::RStream,
    bytes: u64,
    seed: u64,
    peer_seed: u64,
    progress: Option<Arc<Progress>>,
) -> io::Result<(Flow, Flow)> {
    let (rd, wr) = stream.into_split();
    let writer = tokio::spawn(soak_writer(wr, bytes, seed, progress.clone()));
    let reader = tokio::spawn(soak_reader(rd, seed, peer_seed, progress));
    let (sent, received) = (writer.await.unwrap(), reader.await.unwrap());
    Ok((sent?, received?))
}

/// Canary bytes at each end of the remote region and of local buffers.
pub const CANARY: usize = 64 << 10;

/// What an RDMA soak did.
#[derive(Clone, Copy, Debug, Default)]
pub struct RdmaSoak {
    /// RDMA writes.
    pub writes: u64,
    /// Bytes written.
    pub written: u64,
    /// RDMA reads completed.
    pub reads: u64,
    /// Bytes read.
    pub read: u64,
    /// Pending reads dropped.
    pub dropped_reads: u64,
}

fn canary(len: usize, seed: u64) -> Vec<u8> {
    let mut c = vec![0u8; len];
    Rng::new(seed ^ 0xca4a_4a11).fill(&mut c);
    c
}

/// Random RDMA writes and reads (1 B to 1 MiB, `volume` bytes in all) on `remote`, whose
/// first and last [`CANARY`] bytes are canaries: the target lies between them. The region is
/// first written whole (canaries included) and mirrored here; every read must match the
/// mirror, local buffers carry canaries around the range used, one pending read in about
/// eight is dropped, and a final whole read must equal the mirror. Returns the mirror (the
/// caller checks the region's own view of it) and the counts.
pub async fn soak_rdma(
    conn: &RdmaConnection,
    remote: &RemoteRegion,
    volume: u64,
    seed: u64,
    progress: &Progress,
) -> io::Result<(Vec<u8>, RdmaSoak)> {
    let len = remote.len() as usize;
    assert!(len > 2 * CANARY + MAX_OP, "region of {len} bytes too small");
    let mut rng = Rng::new(seed ^ 0x3333);
    let mut mirror = vec![0u8; len];
    rng.fill(&mut mirror);
    // The whole region, canaries included, in 1 MiB writes.
    let mut src = conn.reg_msgs(MAX_OP + 2 * CANARY)?;
    for off in (0..len).step_by(MAX_OP) {
        let n = MAX_OP.min(len - off);
        src[..n].copy_from_slice(&mirror[off..off + n]);
        let (r, back) = guard(
            "an RDMA write",
            conn.write(src, ..n, remote.slice(off as u32, n as u32)?),
        )
        .await;
        r?;
        src = back;
    }
    let local_canary = canary(CANARY, seed);
    let buf_len = MAX_OP + 2 * CANARY;
    let fresh = |conn: &RdmaConnection| -> io::Result<_> {
        let mut buf = conn.reg_msgs(buf_len)?;
        buf[..CANARY].copy_from_slice(&local_canary);
        buf[buf_len - CANARY..].copy_from_slice(&local_canary);
        Ok(buf)
    };
    src = fresh(conn)?;
    let mut dst = fresh(conn)?;
    let mut stats = RdmaSoak::default();
    let target = CANARY..len - CANARY;
    while stats.written + stats.read < volume {
        let n = rng.size(MAX_OP);
        let off = target.start + rng.below((target.len() - n + 1) as u64) as usize;
        let slice = remote.slice(off as u32, n as u32)?;
        if rng.one_in(2) {
            rng.fill(&mut src[CANARY..CANARY + n]);
            let (r, back) =
                guard("an RDMA write", conn.write(src, CANARY..CANARY + n, slice)).await;
            r?;
            src = back;
            mirror[off..off + n].copy_from_slice(&src[CANARY..CANARY + n]);
            stats.writes += 1;
            stats.written += n as u64;
        } else {
            dst[CANARY..CANARY + n].fill(0xee);
            let polls = drop_point(&mut rng, 4);
            let read = conn.read(dst, CANARY..CANARY + n, slice);
            match guard("an RDMA read", or_drop(read, polls)).await {
                None => {
                    // The buffer went with the dropped read; it is released once the read lands.
                    stats.dropped_reads += 1;
                    dst = fresh(conn)?;
                    continue;
                }
                Some((r, back)) => {
                    r?;
                    dst = back;
                }
            }
            if dst[CANARY..CANARY + n] != mirror[off..off + n] {
                return Err(io::Error::other(format!(
                    "RDMA read of {n} bytes at {off} differs from what was written"
                )));
            }
            stats.reads += 1;
            stats.read += n as u64;
        }
        for buf in [&src, &dst] {
            if buf[..CANARY] != local_canary[..] || buf[buf_len - CANARY..] != local_canary[..] {
                return Err(io::Error::other("a local canary was overwritten"));
            }
        }
        progress.add(n as u64);
    }
    // The whole region back, canaries included.
    let mut back = conn.reg_msgs(len)?;
    back.fill(0xee);
    let (r, back) = guard("the final RDMA read", conn.read(back, .., remote.whole())).await;
    r?;
    if back[..] != mirror[..] {
        let i = (0..len).find(|&i| back[i] != mirror[i]).unwrap();
        let part = if target.contains(&i) {
            "target"
        } else {
            "canary"
        };
        return Err(io::Error::other(format!(
            "the region differs from the mirror at {i} (a {part} byte)"
        )));
    }
    Ok((mirror, stats))
}
