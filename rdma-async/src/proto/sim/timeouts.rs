//! The protocol's deadlines in the simulator, on made-up instants: the write probe of a writer
//! whose peer never grants it credits, a probe the peer never answers, and the keepalive.

use std::time::{Duration, Instant};

use super::tests::small;
use super::{Pair, ReadOutcome};
use crate::proto::{ControlKind, CtrlCode, ProtoErrorKind, WriteBlocked, WriteError};

/// Side 0 writes until it is blocked on what only the peer can give back (credits or ring
/// space); side 1 takes every message in and never reads. Returns the bytes written.
fn write_until_blocked(pair: &mut Pair) -> usize {
    let chunk = vec![0x5a; 4096];
    let mut total = 0;
    for _ in 0..100 {
        let out = pair.app_write(0, &chunk);
        total += out.written;
        pair.deliver_all(0);
        pair.poll_cq(1, usize::MAX)
            .expect("the reader handles its receives");
        pair.deliver_all(1);
        pair.poll_cq(0, usize::MAX)
            .expect("the writer handles its completions");
        if out.written == 0 {
            match out.stopped {
                Some(WriteError::Blocked(WriteBlocked::SendQueue)) | None => {}
                Some(WriteError::Blocked(_)) => return total,
                Some(other) => panic!("the writer failed: {other:?}"),
            }
        }
    }
    panic!("the writer never blocked: {total} bytes written");
}

/// Whether the last control message side 0 posted is a keepalive (a plain 0-byte RDMA write).
fn last_control_is_keepalive(pair: &Pair) -> bool {
    pair.sides[0]
        .controls_posted
        .last()
        .is_some_and(|c| c.kind == ControlKind::Ctrl(CtrlCode::Keepalive) && c.imm.is_none())
}

#[test]
fn a_writer_the_peer_never_grants_credits_probes_it_every_interval_until_it_can_write() {
    let mut pair = Pair::new(small(), small());
    let written = write_until_blocked(&mut pair);
    assert!(written > 0);
    let conn = &mut pair.sides[0].conn;
    assert_eq!(conn.poll_timeout(), None, "no deadline before anyone waits");
    let t0 = Instant::now();
    assert!(conn.writer_blocked(t0), "a new wait");
    let second = Duration::from_secs(1);
    assert_eq!(conn.poll_timeout(), Some(t0 + second));
    assert!(!conn.handle_timeout(t0 + second / 2).any(), "not due yet");
    assert_eq!(
        pair.pump_control(0),
        0,
        "nothing to send before the probe is due"
    );
    for k in 1..=3 {
        let due = t0 + second * k;
        assert!(
            !pair.sides[0].conn.writer_blocked(due),
            "still the same wait"
        );
        assert!(pair.sides[0].conn.handle_timeout(due).probe, "probe {k}");
        assert_eq!(pair.pump_control(0), 1, "probe {k} goes out");
        assert!(last_control_is_keepalive(&pair));
        // The peer's device takes it; its application never sees it, so it grants nothing.
        pair.deliver_all(0);
        pair.poll_cq(0, usize::MAX).expect("the probe completes");
        assert_eq!(pair.app_write(0, b"more").written, 0, "still blocked");
        assert_eq!(pair.sides[0].conn.poll_timeout(), Some(due + second));
    }
    // The reader reads at last: its credits and ring space come back and the writer goes on.
    match pair.app_read(1, usize::MAX) {
        ReadOutcome::Data(d) => assert_eq!(d.len(), written),
        other => panic!("expected the written bytes, got {other:?}"),
    }
    pair.deliver_all(1);
    pair.poll_cq(0, usize::MAX)
        .expect("the writer handles the grants");
    assert_eq!(pair.app_write(0, b"more").written, 4);
    assert_eq!(
        pair.sides[0].conn.poll_timeout(),
        None,
        "progress stops the probe"
    );
}

#[test]
fn a_probe_the_peer_never_answers_fails_the_blocked_writer() {
    let mut pair = Pair::new(small(), small());
    write_until_blocked(&mut pair);
    let t0 = Instant::now();
    pair.sides[0].conn.writer_blocked(t0);
    assert!(
        pair.sides[0]
            .conn
            .handle_timeout(t0 + Duration::from_secs(1))
            .probe
    );
    assert_eq!(pair.pump_control(0), 1);
    let probe = *pair.sides[0].controls_posted.last().expect("the probe");
    // The peer is gone: the probe's transport retries run out.
    pair.fail_next_send(0, probe.wr_id);
    pair.poll_cq(0, usize::MAX)
        .expect_err("the failed probe ends the connection");
    match pair.sides[0].conn.write_readiness() {
        Err(WriteError::Failed(e)) => assert_eq!(e.kind(), ProtoErrorKind::SendFailed),
        other => panic!("the writer should fail, got {other:?}"),
    }
    assert_eq!(
        pair.sides[0].conn.poll_timeout(),
        None,
        "a failed connection has no deadlines"
    );
}

#[test]
fn the_keepalive_goes_out_every_interval_with_no_writer_waiting() {
    let mut pair = Pair::new(small(), small());
    // The first control messages (each side's grant of its second ring half) go out first.
    pair.settle().expect("the pair settles");
    let t0 = Instant::now();
    let interval = Duration::from_secs(5);
    pair.sides[1].conn.set_keepalive(interval, t0);
    for k in 1..=2 {
        let due = t0 + interval * k;
        assert_eq!(pair.sides[1].conn.poll_timeout(), Some(due));
        let fired = pair.sides[1].conn.handle_timeout(due);
        assert!(fired.keepalive && !fired.probe);
        assert_eq!(pair.pump_control(1), 1, "keepalive {k} goes out");
        assert!(pair.sides[1].controls_posted.last().is_some_and(|c| {
            c.kind == ControlKind::Ctrl(CtrlCode::Keepalive) && c.imm.is_none()
        }));
        pair.deliver_all(1);
        pair.poll_cq(1, usize::MAX)
            .expect("the keepalive completes");
    }
    // Side 0 never learns of them: nothing arrives for its application.
    assert_eq!(pair.app_read(0, usize::MAX), ReadOutcome::Blocked);
}
