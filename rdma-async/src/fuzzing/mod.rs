//! The harnesses of the fuzz targets in `fuzz/`: one per decoder of peer input, one for the
//! stream driver over the fake device (`stream_driver`), one for the table of outstanding work
//! requests on caller memory (`in_flight`) and one for a datagram socket's sender tables
//! (`datagram_peers`), one for what rdma_cm events do to a handshake and a connection
//! (`cm_events`), each asserting its invariants (not
//! only that it does not panic). The fuzz targets reach them through the hidden `__fuzz`
//! module (`--cfg rdma_async_fuzzing`); the unit test below replays every file of
//! `fuzz/corpus/` through them, so the seeds and every regression input a fuzzing run found are
//! tests on every `cargo test`.

mod cm_events;
mod conn_data;
mod datagram_peers;
mod grh;
mod hello;
mod in_flight;
mod input;
mod private_data;
mod recv_path;
mod remote_region;
mod stream_driver;

use crate::proto::{Config, Connection, LocalLayout};

pub use cm_events::cm_events;
pub use conn_data::conn_data;
pub use datagram_peers::datagram_peers;
pub use grh::grh;
pub use hello::hello;
pub use in_flight::in_flight;
pub use private_data::private_data;
pub use recv_path::recv_path;
pub use remote_region::remote_region;
pub use stream_driver::stream_driver;

/// A fresh connection with `config` and a made-up local layout, for the harnesses that hand it
/// decoded connection data.
fn connection(config: Config) -> Connection {
    Connection::new(
        config,
        LocalLayout {
            rbuf_addr: 0x1000,
            rbuf_rkey: 1,
            target_sgl_addr: 0x10_0000,
            target_sgl_rkey: 2,
            ring_keys: None,
        },
    )
}

/// A harness: decodes one input, panics when an invariant breaks.
pub type Harness = fn(&[u8]);

/// Every target: its name (the binary in `fuzz/` and the folder under `fuzz/corpus/`) and its
/// harness.
pub const TARGETS: &[(&str, Harness)] = &[
    ("conn_data", conn_data),
    ("recv_path", recv_path),
    ("grh", grh),
    ("hello", hello),
    ("remote_region", remote_region),
    ("private_data", private_data),
    ("stream_driver", stream_driver),
    ("in_flight", in_flight),
    ("datagram_peers", datagram_peers),
    ("cm_events", cm_events),
];

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::TARGETS;

    #[test]
    fn every_corpus_file_passes_its_harness() {
        let repository = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        // The corpus is the repository's, not the published crate's: an unpacked crate has no
        // fuzz crate beside it. In the repository, a missing corpus is a failure below.
        if !repository.join("fuzz/Cargo.toml").exists() {
            eprintln!("no fuzz/ beside this crate (an unpacked package): no corpus to replay");
            return;
        }
        let corpus = repository.join("fuzz/corpus");
        for (name, harness) in TARGETS {
            let dir = corpus.join(name);
            let entries = std::fs::read_dir(&dir)
                .unwrap_or_else(|e| panic!("the corpus {} is missing: {e}", dir.display()));
            let mut files = 0;
            for entry in entries {
                let path = entry.unwrap().path();
                let bytes = std::fs::read(&path).unwrap();
                // Shown with a failure: which file broke its harness.
                eprintln!("replaying {}", path.display());
                harness(&bytes);
                files += 1;
            }
            assert!(files > 0, "the corpus {} is empty", dir.display());
        }
    }
}
