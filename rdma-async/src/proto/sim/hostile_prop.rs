//! Property test: a hostile peer (`proto::hostile`) sends arbitrary sequences of immediates,
//! data writes at any offset and length of the granted ring, SGL updates and connection data;
//! the model panics when the core panics, changes its error, reads outside what the peer's
//! accepted DATA covers, or writes outside what the peer granted.

use proptest::prelude::*;
use proptest::strategy::ValueTree;

use crate::proto::hostile;

/// One step of the run as the bytes `hostile::run` reads (see its `step`): mostly what a peer
/// may do, sometimes anything, so runs last long enough to reach deep states.
fn step() -> impl Strategy<Value = Vec<u8>> {
    let le = |op: u8, n: u16| vec![op, n as u8, (n >> 8) as u8];
    prop_oneof![
        // A DATA write where it belongs (an odd second byte keeps it within the grant).
        8 => (any::<u8>(), any::<u16>()).prop_map(|(b, n)| vec![0, b | 1, n as u8, (n >> 8) as u8]),
        4 => any::<u16>().prop_map(move |n| le(27, n)),
        3 => any::<u16>().prop_map(move |n| le(20, n)),
        3 => (0u8..16).prop_map(|n| vec![33, n, 1]),
        2 => Just(vec![13, 0]),
        1 => any::<u16>().prop_map(|n| vec![16, 0, n as u8, (n >> 8) as u8]),
        1 => Just(vec![39]),
        1 => proptest::collection::vec(any::<u8>(), 1..12),
    ]
}

/// A run: the configuration and connection-data bytes, then the steps.
fn run_bytes() -> impl Strategy<Value = Vec<u8>> {
    (
        proptest::collection::vec(any::<u8>(), 2..4),
        proptest::collection::vec(step(), 0..400),
    )
        .prop_map(|(head, steps)| {
            head.into_iter()
                .chain(steps.into_iter().flatten())
                .collect()
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn hostile_peer_cannot_break_the_invariants(bytes in run_bytes()) {
        hostile::run(&bytes);
    }

    #[test]
    fn hostile_peer_with_random_bytes(
        bytes in proptest::collection::vec(any::<u8>(), 0..3000),
    ) {
        hostile::run(&bytes);
    }
}

/// The driver reaches the deep paths: connected, data read, SGL and credit updates taken,
/// control messages, and the error state.
#[test]
fn hostile_runs_reach_every_path() {
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let strategy = run_bytes();
    let mut totals = hostile::Outcome::default();
    let (mut failed, mut connected) = (0, 0);
    for _ in 0..300 {
        let bytes = strategy.new_tree(&mut runner).unwrap().current();
        let o = hostile::run(&bytes);
        totals.data_events += o.data_events;
        totals.sgl_events += o.sgl_events;
        totals.credit_events += o.credit_events;
        totals.ctrl_events += o.ctrl_events;
        totals.bytes_read += o.bytes_read;
        totals.bytes_lent += o.bytes_lent;
        totals.data_writes += o.data_writes;
        failed += usize::from(o.error.is_some());
        connected += usize::from(o.connected);
    }
    assert!(totals.data_events > 100, "{totals:?}");
    assert!(totals.sgl_events > 10, "{totals:?}");
    assert!(totals.credit_events > 10, "{totals:?}");
    assert!(totals.ctrl_events > 0, "{totals:?}");
    assert!(totals.bytes_read > 10_000, "{totals:?}");
    assert!(totals.bytes_lent > 1_000, "{totals:?}");
    assert!(totals.data_writes > 100, "{totals:?}");
    assert!(
        failed > 0 && connected > 200,
        "failed {failed}, connected {connected}"
    );
    eprintln!("{totals:?}");
}

/// A lending ring under an honest peer, scripted: each half is lent after its first key is
/// deregistered, half 0 is granted again through its window, filled, and lent once the
/// window's invalidation completed; the model checks every lend against the keys.
#[test]
fn a_lending_ring_lends_through_both_kinds_of_key() {
    let fill_half: &[u8] = &[0, 1, 0xff, 0x0f]; // a 4096-byte DATA write where it belongs
    let lend: &[u8] = &[27, 0xff, 0x0f, 0]; // a zero-copy read of up to 4096 bytes
    let complete: &[u8] = &[39]; // the peer completes our sends
    let mut bytes = vec![0x81, 7]; // 8 KiB rings that lend; valid peer connection data
    for part in [
        fill_half, lend, complete, // half 0: first key deregistered, lent
        fill_half, lend, complete, // half 1 likewise; half 0 granted through its window
        fill_half, lend, complete, // half 0 full: its window invalidated (completed here)
        lend,     // and lent
    ] {
        bytes.extend_from_slice(part);
    }
    let o = hostile::run(&bytes);
    assert!(o.error.is_none(), "{o:?}");
    assert_eq!((o.bytes_lent, o.invalidations), (3 * 4096, 1), "{o:?}");
}

/// A scripted honest exchange (the `honest-exchange` seed of the fuzz corpus): data both ways,
/// a credit update, a buffer granted by an SGL update, the peer's SHUTDOWN and ours; no error.
#[test]
fn honest_exchange_passes_without_error() {
    let bytes: &[u8] = &[
        1, 7, // 8 KiB rings; valid peer connection data
        20, 0x00, 0x10, // the application writes 4096 bytes
        39,   // the peer completes our sends
        0, 1, 0xe8, 0x03, // a DATA write where it belongs
        27, 0xff, 0x0f, // the application reads
        13, 0, // credits with an honest limit
        16, 0, 0xff, 0x0f, // an SGL update granting a 4096-byte buffer in the next slot
        20, 0x00, 0x40, // the application writes 16384 bytes
        33, 8, 1, // 8 of our sends complete
        0, 1, 0xff, 0xff, // another DATA write
        37, 7, // the application reads everything
        12, 2, // the peer shuts down writing
        37, 0, // we shut down writing
        39,
    ];
    let o = hostile::run(bytes);
    eprintln!("{o:?}");
    assert!(o.connected);
    assert_eq!(o.error, None);
    assert_eq!((o.data_events, o.sgl_events, o.ctrl_events), (2, 1, 1));
    assert!(o.bytes_read > 1000 && o.data_writes >= 3, "{o:?}");
}
