//! Sizes and timeouts of an [`RStream`](super::RStream), with rsockets' defaults.

use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use crate::cm::handshake::{DialOptions, dial_setters};
use crate::cm::queue_setters::QueueOptions;
use crate::proto::Config;

/// How long a dropped stream waits by default for its data to be acknowledged (see
/// [`RStreamOptions::linger`]).
const DEFAULT_LINGER: Duration = Duration::from_secs(10);

/// Where rsockets reads its per-host defaults (one integer per file).
const RSOCKET_CONFIG_DIR: &str = "/etc/rdma/rsocket";

/// Ring sizes, queue depths, inline size and busy-poll time of a stream.
///
/// The defaults are rsockets' (128 KiB rings, 384-deep queues, 64 bytes inline, 10 µs
/// busy-poll), overridden by the files rsockets itself reads under `/etc/rdma/rsocket`
/// (`mem_default`, `wmem_default`, `sqsize_default`, `rqsize_default`, `inline_default`,
/// `polling_time`) when they exist; they are read once per process, the first time defaults
/// are asked for (a later change to them is not seen, as in rsockets). Sizes are those of the
/// rings: rsockets' `SO_SNDBUF`/`SO_RCVBUF` of `n` give rings of `2n` bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RStreamOptions {
    pub(crate) send_buffer_size: u32,
    pub(crate) recv_buffer_size: u32,
    /// Queue depths, inline size, busy-poll and keepalive, as every transport's: `send_depth`
    /// and `recv_depth` are rsockets' `sq_size` and `rq_size`, `max_inline` its `inline_size`.
    pub(crate) queue: QueueOptions,
    pub(crate) dial: DialOptions,
    pub(crate) zero_copy_reads: bool,
    pub(crate) linger: Duration,
    /// A listener's bound on handshakes in progress from one address; `None`: its default.
    pub(crate) handshakes_per_source: Option<usize>,
    /// Whether the stream's completion queue reports to the completion channel shared by the
    /// streams of its device and runtime.
    pub(crate) shared_channels: bool,
}

impl Default for RStreamOptions {
    /// rsockets' defaults with this host's overrides, read from `/etc/rdma/rsocket` once per
    /// process (as rsockets reads them once), so no later call blocks on the filesystem: a
    /// `connect` inside async code does not.
    fn default() -> Self {
        static HOST_DEFAULTS: OnceLock<RStreamOptions> = OnceLock::new();
        HOST_DEFAULTS
            .get_or_init(|| Self::from_config_dir(Path::new(RSOCKET_CONFIG_DIR)))
            .clone()
    }
}

fn read_number(dir: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(dir.join(name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// Off, except in this workspace's device tests run with `RDMA_ASYNC_TEST_SHARED_CHANNELS=1`:
/// every stream test then runs on shared completion channels.
fn shared_channels_by_default() -> bool {
    #[cfg(rdma_async_hooks)]
    if std::env::var_os("RDMA_ASYNC_TEST_SHARED_CHANNELS").is_some_and(|v| v == "1") {
        return true;
    }
    false
}

impl RStreamOptions {
    /// rsockets' defaults, with this host's `/etc/rdma/rsocket` overrides.
    pub fn new() -> Self {
        Self::default()
    }

    /// rsockets' built-in defaults, overridden by the files in `dir`.
    fn from_config_dir(dir: &Path) -> Self {
        let base = Config::new();
        let num = |name, default: u32| {
            read_number(dir, name).map_or(default, |v| u32::try_from(v).unwrap_or(u32::MAX))
        };
        RStreamOptions {
            send_buffer_size: num("wmem_default", base.sbuf_size()),
            recv_buffer_size: num("mem_default", base.rbuf_size()),
            queue: QueueOptions {
                send_depth: num("sqsize_default", base.sq_size()),
                recv_depth: num("rqsize_default", base.rq_size()),
                max_inline: num("inline_default", base.inline_size()),
                busy_poll: Duration::from_micros(read_number(dir, "polling_time").unwrap_or(10)),
                keepalive: None,
            },
            dial: DialOptions::default(),
            zero_copy_reads: false,
            linger: DEFAULT_LINGER,
            handshakes_per_source: None,
            shared_channels: shared_channels_by_default(),
        }
    }

    /// Size of the send ring (bytes copied out of writes wait here until the peer has them).
    pub fn send_buffer_size(mut self, bytes: u32) -> Self {
        self.send_buffer_size = bytes;
        self
    }

    /// Size of the receive ring the peer writes into.
    pub fn recv_buffer_size(mut self, bytes: u32) -> Self {
        self.recv_buffer_size = bytes;
        self
    }

    /// Send queue depth (rsockets' `RDMA_SQSIZE`).
    pub fn sq_size(mut self, depth: u32) -> Self {
        self.queue.send_depth = depth;
        self
    }

    /// Receive queue depth, which is also the credits granted to the peer (`RDMA_RQSIZE`). The
    /// queue pair's receive queue holds up to 8 receives more, as many as the device's
    /// `max_qp_wr` allows, so that consumed ones go back to it in batches.
    pub fn rq_size(mut self, depth: u32) -> Self {
        self.queue.recv_depth = depth;
        self
    }

    /// Writes up to this size go inline in the work request (`RDMA_INLINE`).
    pub fn inline_size(mut self, bytes: u32) -> Self {
        self.queue.max_inline = bytes;
        self
    }

    /// How long an empty completion queue is polled before the task sleeps.
    ///
    /// Adaptive, between `time` and 8 × `time`: a completion that arrives soon after a window
    /// ended empty stretches the window to catch the next one like it (a round trip longer than
    /// `time` is spun through, not slept through), and one later than 8 × `time` sets it back.
    /// After two or more windows in a row ended empty, the next waits skip it (1, 3, 7, ... up
    /// to 63 of them), so many connections that each wait longer than the window do not spin
    /// the thread for nothing; a window that finds a completion restores it. A window also
    /// ends as soon as another thread waits for the stream (its other half, used from another
    /// worker): the spinning task holds the stream's lock, so it sleeps until its completion
    /// instead of keeping that thread blocked (`StreamStats::busy_polls_yielded` counts these).
    ///
    /// After the window (or with none) a wait yields to the runtime's other tasks up to 8
    /// times, looking again each time its turn comes, before it arms the queue and sleeps:
    /// with many connections on a thread their turns last about as long as a peer takes to
    /// answer, and the arm, the wake-up and their system calls are saved
    /// (`StreamStats::waits_yielded`). With no other task to run the yields come back at once;
    /// waits whose yields keep finding nothing make the following waits sleep at once.
    pub fn busy_poll(mut self, time: Duration) -> Self {
        self.queue.busy_poll = time;
        self
    }

    dial_setters!();

    /// Sends rsockets' keepalive (a 0-byte RDMA write the peer's application never sees) every
    /// `interval`, so a dead peer surfaces as an error on this side (rsockets' `SO_KEEPALIVE` with
    /// `TCP_KEEPIDLE`).
    pub fn keepalive(mut self, interval: Duration) -> Self {
        self.queue.keepalive = Some(interval);
        self
    }

    /// For an [`RListener`](super::RListener): how many handshakes one address may have in
    /// progress at once; its further requests are rejected at once (the client's connect fails
    /// with `ConnectionRefused`, saying why) until one ends. The default leaves an eighth of what the
    /// listener can run at once to other addresses: 56 of its 64 slots, fewer when the
    /// locked-memory limit holds fewer handshakes' rings (see [`RListener`](super::RListener)).
    /// Lower it to keep more room for other addresses; 0 counts as 1.
    pub fn handshakes_per_source(mut self, count: usize) -> Self {
        self.handshakes_per_source = Some(count);
        self
    }

    /// Sets the receive ring up for [`RStream::read_lent`](super::RStream::read_lent): each half
    /// of the ring is granted to the peer through keys of its own (a registration of that half
    /// at first, a memory window later), so that a half the peer has filled can be revoked and
    /// its bytes lent to the reader without a copy. Off by default: it takes four more
    /// registrations and two memory windows per stream, and a device with memory windows
    /// (connecting fails with `Unsupported` on one without). The peer cannot tell: grants carry
    /// their key, which rsockets reads for every write.
    pub fn zero_copy_reads(mut self, on: bool) -> Self {
        self.zero_copy_reads = on;
        self
    }

    /// Shares the completion channel (the descriptor that signals completions) between every
    /// stream made with this option on the same device and Tokio runtime, instead of giving
    /// each stream its own: a stream then holds one descriptor (its rdma_cm event channel)
    /// rather than two, and the streams together one more, registered once with the runtime's
    /// reactor. For a listener, it applies to the streams it accepts. Off by default.
    ///
    /// It helps a process with thousands of streams, which would otherwise need two
    /// descriptors (and two reactor registrations) each. It costs a dispatch per completion
    /// event: a task of the runtime reads the shared channel and wakes the stream's waiting
    /// task, where a stream's own channel wakes it directly. Completions found without
    /// sleeping (busy-polling, a queue that is never empty) cost the same in both modes.
    ///
    /// The channel belongs to the runtime current when the stream is created (connected or
    /// accepted); it is closed when that runtime shuts down, and from then on every wait of
    /// a stream on it fails with `ConnectionAborted`, as it does for a stream with a channel of
    /// its own whose runtime is gone.
    ///
    /// # Errors
    ///
    /// Connecting or accepting with it fails (`Other`) outside a Tokio runtime.
    pub fn shared_channels(mut self, on: bool) -> Self {
        self.shared_channels = on;
        self
    }

    /// How long a dropped stream (its last handle) keeps its connection so that the bytes
    /// written before the drop reach the peer: the close sends rsockets' DISCONNECT after them
    /// and tears the connection down once the peer acknowledged everything, or once `time`
    /// passed. 10 s by default. Past it the peer reads `ConnectionReset`, never a short clean
    /// end of stream, and this side logs a warning. rsockets' `rclose` waits without a bound;
    /// like `SO_LINGER`, this bounds the wait. A slow or lossy path (or an emulated device)
    /// may need longer.
    pub fn linger(mut self, time: Duration) -> Self {
        self.linger = time;
        self
    }

    /// The protocol configuration, clamped as rsockets clamps it.
    pub(crate) fn config(&self) -> Config {
        Config::new()
            .with_sbuf_size(self.send_buffer_size)
            .with_rbuf_size(self.recv_buffer_size)
            .with_sq_size(self.queue.send_depth)
            .with_rq_size(self.queue.recv_depth)
            .with_inline_size(self.queue.max_inline)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_rsockets_and_files_override_them() {
        let empty = std::env::temp_dir().join(format!("rdma-async-noconf-{}", std::process::id()));
        let d = RStreamOptions::from_config_dir(&empty);
        assert_eq!(
            (
                d.send_buffer_size,
                d.recv_buffer_size,
                d.queue.send_depth,
                d.queue.recv_depth,
                d.queue.max_inline
            ),
            (131072, 131072, 384, 384, 64)
        );
        assert_eq!(d.queue.busy_poll, Duration::from_micros(10));

        let dir = std::env::temp_dir().join(format!("rdma-async-conf-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, value) in [
            ("mem_default", "8192\n"),
            ("sqsize_default", "64"),
            ("polling_time", "0"),
            ("inline_default", "junk"),
        ] {
            std::fs::write(dir.join(name), value).unwrap();
        }
        let o = RStreamOptions::from_config_dir(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            (o.recv_buffer_size, o.queue.send_depth, o.queue.busy_poll),
            (8192, 64, Duration::ZERO)
        );
        assert_eq!(
            o.queue.max_inline, 64,
            "an unreadable value keeps the default"
        );
        assert_eq!(o.send_buffer_size, 131072);
    }
}
