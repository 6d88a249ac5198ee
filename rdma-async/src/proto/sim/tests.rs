//! Scenario tests: two simulated peers running the protocol core end to end.

use super::{Pair, RBUF_ADDR, RBUF_RKEY, ReadOutcome, TSGL_ADDR, stream_bytes};
use crate::proto::{
    ByteOrder, Config, ControlKind, CtrlCode, Op, ProtoErrorKind, RecvEvent, RsSge, WriteBlocked,
    WriteError,
};

/// rstream `-B 4096`: SO_SNDBUF = SO_RCVBUF = 4096, doubled to 8 KiB rings.
pub(super) fn small() -> Config {
    Config::new()
        .with_sbuf_size(8192)
        .with_rbuf_size(8192)
        .with_sq_size(16)
        .with_rq_size(16)
}

/// Read everything readable at `side`.
fn read_all(pair: &mut Pair, side: usize) -> Vec<u8> {
    match pair.app_read(side, usize::MAX) {
        ReadOutcome::Data(d) => d,
        other => panic!("expected data, got {other:?}"),
    }
}

#[test]
fn first_sgl_update_grants_the_second_half_into_slot_1() {
    let mut pair = Pair::new(Config::new(), Config::new());
    // SimSide 1's first control poll publishes its second half (C: first rs_process_cq).
    assert_eq!(pair.pump_control(1), 1);
    let c = pair.sides[1].controls_posted[0];
    assert_eq!(
        c.kind,
        ControlKind::SglUpdate {
            slot: 1,
            limit: 384
        }
    );
    assert_eq!(c.imm, Some(Op::Sgl(384).encode()));
    assert_eq!(c.imm, Some(0x8000_0180));
    assert_eq!(c.remote_addr, TSGL_ADDR[0] + 16);
    assert!(c.inline);
    let expected = RsSge {
        addr: RBUF_ADDR[1] + 65536,
        key: RBUF_RKEY[1],
        length: 65536,
    };
    assert_eq!(c.payload, Some(expected.to_bytes(ByteOrder::native())));
    assert!(pair.deliver(1));
    pair.poll_cq(0, usize::MAX).unwrap();
    assert_eq!(
        pair.sides[0].recv_events,
        [RecvEvent::SglUpdate {
            slot: 1,
            limit: 384
        }]
    );
    assert_eq!(pair.tsgl_slot(0, 1), expected.to_bytes(ByteOrder::native()));
    assert_eq!(pair.sides[0].conn.target_slot(1), Some(expected));
    // Nothing else is due until the application reads.
    assert_eq!(pair.pump_control(1), 0);
}

#[test]
fn rsend_100000_chunk_sequence() {
    let mut pair = Pair::new(Config::new(), Config::new());
    let data = stream_bytes(0, 0, 100_000);

    // Without the peer's second half only slot 0 (64 KiB) is usable: the 6th chunk is clipped
    // to the 2048 bytes left in the SGE, then the write blocks on the target buffer.
    let out = pair.app_write(0, &data);
    let lens: Vec<usize> = pair.sides[0].data_posted.iter().map(|w| w.len).collect();
    assert_eq!(lens, [2048, 4096, 8192, 16384, 32768, 2048]);
    assert_eq!(out.written, 65536);
    assert_eq!(
        out.stopped,
        Some(WriteError::Blocked(WriteBlocked::TargetBuffer))
    );
    let addrs: Vec<u64> = pair.sides[0]
        .data_posted
        .iter()
        .map(|w| w.remote_addr - RBUF_ADDR[1])
        .collect();
    assert_eq!(addrs, [0, 2048, 6144, 14336, 30720, 63488]);
    assert!(
        pair.sides[0]
            .data_posted
            .iter()
            .all(|w| !w.inline && w.rkey == RBUF_RKEY[1])
    );
    assert!(pair.write_wakeup_pending(0));

    // Same call, but with slot 1 already granted: one more chunk with the rest (C's 34464).
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    let out = pair.app_write(0, &data);
    let lens: Vec<usize> = pair.sides[0].data_posted.iter().map(|w| w.len).collect();
    assert_eq!(lens, [2048, 4096, 8192, 16384, 32768, 2048, 34464]);
    assert_eq!(
        out,
        super::WriteOutcome {
            written: 100_000,
            stopped: None
        }
    );
    let last = pair.sides[0].data_posted[6];
    assert_eq!(last.remote_addr, RBUF_ADDR[1] + 65536);
    assert_eq!(last.imm, 34464);
    assert_eq!(pair.sides[0].conn.send_counters().0, 7);

    pair.settle().unwrap();
    assert_eq!(read_all(&mut pair, 1), data);
}

#[test]
fn ramp_restarts_per_write_call_and_small_chunks_go_inline() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.app_write(0, &stream_bytes(0, 0, 5000));
    pair.app_write(0, &stream_bytes(0, 5000, 64));
    pair.app_write(0, &stream_bytes(0, 5064, 65));
    let posted: Vec<(usize, bool)> = pair.sides[0]
        .data_posted
        .iter()
        .map(|w| (w.len, w.inline))
        .collect();
    assert_eq!(
        posted,
        [(2048, false), (2952, false), (64, true), (65, false)]
    );
    pair.settle().unwrap();
    assert_eq!(read_all(&mut pair, 1), stream_bytes(0, 0, 5129));
}

#[test]
fn half_close_peer_reads_eof_and_can_still_write_back() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    let a_data = stream_bytes(0, 0, 3000);
    assert_eq!(pair.app_write(0, &a_data).written, 3000);
    pair.sides[0].conn.shutdown_write();
    assert_eq!(pair.pump_control(0), 1);
    assert_eq!(
        pair.sides[0].controls_posted.last().unwrap().kind,
        ControlKind::Ctrl(CtrlCode::Shutdown)
    );
    assert_eq!(pair.app_write(0, b"late").stopped, Some(WriteError::Closed));
    pair.settle().unwrap();

    // B: data first, then EOF; still writable.
    assert_eq!(read_all(&mut pair, 1), a_data);
    assert_eq!(pair.app_read(1, 100), ReadOutcome::Eof);
    assert!(pair.sides[1].conn.is_eof());
    assert!(pair.sides[1].conn.is_writable() && !pair.sides[1].conn.is_readable());
    let b_data = stream_bytes(1, 0, 70_000);
    let (mut sent, mut got) = (0, Vec::new());
    while got.len() < b_data.len() {
        sent += pair.app_write(1, &b_data[sent..]).written;
        pair.settle().unwrap();
        if let ReadOutcome::Data(d) = pair.app_read(0, usize::MAX) {
            got.extend_from_slice(&d);
        }
        pair.settle().unwrap();
    }
    assert_eq!(got, b_data);
    // A is still readable after its own SHUTDOWN.
    assert!(pair.sides[0].conn.is_readable());

    // B closes its side too: it is no longer readable, so that is a DISCONNECT.
    pair.sides[1].conn.shutdown_write();
    pair.pump_control(1);
    assert_eq!(
        pair.sides[1].controls_posted.last().unwrap().kind,
        ControlKind::Ctrl(CtrlCode::Disconnect)
    );
    pair.settle().unwrap();
    assert!(pair.sides[0].conn.is_disconnected());
    assert!(pair.sides[1].conn.is_disconnected());
    assert_eq!(pair.app_read(0, 10), ReadOutcome::Eof);
    assert!(pair.sides[0].conn.all_sends_done() && pair.sides[1].conn.all_sends_done());
    assert_eq!(pair.sides[0].conn.sends_in_flight(), 0);
}

#[test]
fn half_close_both_ways_at_once() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.app_write(0, b"from a");
    pair.app_write(1, b"from b");
    pair.sides[0].conn.shutdown_write();
    pair.sides[1].conn.shutdown_write();
    pair.pump_control(0);
    pair.pump_control(1);
    pair.settle().unwrap();
    // Each got SHUTDOWN while no longer writable: disconnected (C: rs_disconnected), but the
    // data that arrived before is still read, then EOF.
    for side in 0..2 {
        assert!(pair.sides[side].conn.is_disconnected());
        assert!(pair.sides[side].conn.all_sends_done());
    }
    assert_eq!(read_all(&mut pair, 0), b"from b");
    assert_eq!(read_all(&mut pair, 1), b"from a");
    assert_eq!(pair.app_read(0, 1), ReadOutcome::Eof);
    assert_eq!(pair.app_read(1, 1), ReadOutcome::Eof);
}

#[test]
fn disconnect_stops_reposting() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.app_write(0, b"last words");
    pair.sides[0].conn.close();
    assert!(!pair.sides[0].conn.all_sends_done());
    pair.pump_control(0);
    let posted_before = pair.sides[1].recv_posted;
    pair.deliver_all(0);
    // Two receives consumed: the data and the DISCONNECT.
    assert_eq!(pair.sides[1].recv_posted, posted_before - 2);
    pair.poll_cq(1, usize::MAX).unwrap();
    // The data completion was reposted (still connected then); the DISCONNECT was not.
    assert_eq!(pair.sides[1].recv_posted, posted_before - 1);
    assert_eq!(
        pair.sides[1].recv_events.last(),
        Some(&RecvEvent::Ctrl(CtrlCode::Disconnect))
    );
    let b = &pair.sides[1].conn;
    assert!(b.is_disconnected() && !b.is_connected());
    assert_eq!(pair.app_write(1, b"x").stopped, Some(WriteError::Closed));
    assert_eq!(read_all(&mut pair, 1), b"last words");
    assert_eq!(pair.app_read(1, 1), ReadOutcome::Eof);
    // Nothing more goes out from a disconnected side.
    assert_eq!(pair.pump_control(1), 0);

    // A becomes disconnected when its DISCONNECT completes.
    assert!(pair.sides[0].conn.is_connected());
    pair.poll_cq(0, usize::MAX).unwrap();
    assert!(pair.sides[0].conn.is_disconnected());
    assert!(pair.sides[0].conn.all_sends_done());
}

/// Whether `outcome` is the reset of a peer that disconnected without closing.
fn is_reset(outcome: &ReadOutcome) -> bool {
    matches!(outcome, ReadOutcome::Failed(e) if e.kind() == ProtoErrorKind::Reset)
}

#[test]
fn cm_disconnected_event() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.sides[0].conn.handle_disconnected();
    assert!(pair.sides[0].conn.is_disconnected());
    // The peer never closed: a reset, never a clean end-of-stream.
    match pair.app_write(0, b"x").stopped {
        Some(WriteError::Failed(e)) => assert_eq!(e.kind(), ProtoErrorKind::Reset, "{e}"),
        other => panic!("a write after a bare disconnect: {other:?}"),
    }
    let read = pair.app_read(0, 1);
    assert!(is_reset(&read), "{read:?}");
    // close() after a disconnect sends nothing.
    pair.sides[0].conn.close();
    assert_eq!(pair.pump_control(0), 0);
}

#[test]
fn cm_disconnected_event_after_a_local_close_is_end_of_stream() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.sides[0].conn.close();
    pair.sides[0].conn.handle_disconnected();
    assert!(pair.sides[0].conn.is_disconnected());
    assert_eq!(pair.app_read(0, 1), ReadOutcome::Eof);
}

/// Side 1 writes `data`, ends as `end` says (its control message is sent), and then the CM
/// reports the disconnect to side 0: side 0 reads `data`, then end-of-stream.
fn orderly_end_then_cm_disconnect(data: &[u8], end: fn(&mut crate::proto::Connection)) {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    assert_eq!(pair.app_write(1, data).written, data.len());
    end(&mut pair.sides[1].conn);
    pair.pump_control(1);
    // The data and the control message are handled before the CM's event, as the driver does.
    pair.deliver_all(1);
    pair.poll_cq(0, usize::MAX).unwrap();
    pair.sides[0].conn.handle_disconnected();
    assert_eq!(pair.app_read(0, 100), ReadOutcome::Data(data.to_vec()));
    assert_eq!(pair.app_read(0, 1), ReadOutcome::Eof);
}

#[test]
fn cm_disconnected_event_after_the_peers_shutdown_is_end_of_stream_after_the_data() {
    orderly_end_then_cm_disconnect(b"all of it", |conn| conn.shutdown_write());
}

#[test]
fn cm_disconnected_event_after_an_orderly_close_is_end_of_stream_after_the_data() {
    orderly_end_then_cm_disconnect(b"last words", |conn| conn.close());
}

#[test]
fn cm_disconnected_event_without_a_close_reads_the_data_then_a_reset() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    assert_eq!(pair.app_write(1, b"partial").written, 7);
    pair.deliver_all(1);
    pair.poll_cq(0, usize::MAX).unwrap();
    // Side 1 vanishes: no SHUTDOWN or DISCONNECT, only the CM's event. More it wrote may be
    // lost, so the reader gets what arrived, then an error: never a clean end-of-stream.
    pair.sides[0].conn.handle_disconnected();
    assert_eq!(
        pair.app_read(0, 100),
        ReadOutcome::Data(b"partial".to_vec())
    );
    let read = pair.app_read(0, 1);
    assert!(is_reset(&read), "{read:?}");
}

#[test]
fn ring_wraps_many_times_with_8k_rings() {
    let mut pair = Pair::new(small(), small());
    let total = 1_000_000usize;
    let data = stream_bytes(0, 0, total);
    let back = stream_bytes(1, 0, total);
    let (mut sent, mut got, mut sent_b, mut got_b) = (0, Vec::new(), 0, Vec::new());
    let mut rounds = 0;
    while got.len() < total || got_b.len() < total {
        rounds += 1;
        assert!(rounds < 100_000, "no progress");
        if sent < total {
            let out = pair.app_write(0, &data[sent..(sent + 7000).min(total)]);
            sent += out.written;
            if out.written == 0 {
                assert!(pair.write_wakeup_pending(0));
            }
        }
        if sent_b < total {
            sent_b += pair
                .app_write(1, &back[sent_b..(sent_b + 3000).min(total)])
                .written;
        }
        pair.deliver(0);
        pair.deliver(1);
        pair.poll_cq(0, 3).unwrap();
        pair.poll_cq(1, 2).unwrap();
        if let ReadOutcome::Data(d) = pair.app_read(1, 5000) {
            got.extend_from_slice(&d);
        }
        if let ReadOutcome::Data(d) = pair.app_read(0, 1500) {
            got_b.extend_from_slice(&d);
        }
    }
    assert_eq!(got, data);
    assert_eq!(got_b, back);
    // 1 MB through 4 KiB halves: hundreds of SGL updates each way.
    for side in 0..2 {
        let sgl = pair.sides[side]
            .controls_posted
            .iter()
            .filter(|c| matches!(c.kind, ControlKind::SglUpdate { .. }))
            .count();
        assert!(sgl >= total / 4096, "side {side}: {sgl} SGL updates");
        // The 2 KiB low-water mark keeps every chunk within what the ring can hold.
        assert!(pair.sides[side].data_posted.iter().all(|w| w.len <= 4096));
    }
}

#[test]
fn chunks_wrapping_the_send_ring_use_two_sges() {
    // A 3000-byte receive half against an 8 KiB send ring: chunk boundaries drift against the
    // ring end, so some chunks wrap it.
    let mut pair = Pair::new(small(), small().with_rbuf_size(6000));
    let data = stream_bytes(0, 0, 100_000);
    let (mut sent, mut got) = (0, Vec::new());
    while got.len() < data.len() {
        sent += pair.app_write(0, &data[sent..]).written;
        pair.settle().unwrap();
        if let ReadOutcome::Data(d) = pair.app_read(1, usize::MAX) {
            got.extend_from_slice(&d);
        }
        pair.settle().unwrap();
    }
    assert_eq!(got, data);
    let wrapped: Vec<_> = pair.sides[0]
        .data_posted
        .iter()
        .filter(|w| w.sbuf.as_slice().len() == 2)
        .collect();
    assert!(!wrapped.is_empty());
    for w in wrapped {
        let segs = w.sbuf.as_slice();
        assert_eq!(segs[0].offset + segs[0].len, 8192);
        assert_eq!(segs[1].offset, 0);
        assert_eq!(segs[0].len + segs[1].len, w.len);
    }
}

#[test]
fn credit_only_updates_return_message_credits() {
    // A big ring but few credits: credits, not buffer space, limit the sender.
    let cfg = Config::new().with_rq_size(16).with_sq_size(64);
    let mut pair = Pair::new(cfg, cfg);
    pair.settle().unwrap();
    for i in 0..16u64 {
        assert_eq!(pair.app_write(0, &stream_bytes(0, i * 10, 10)).written, 10);
    }
    let out = pair.app_write(0, &stream_bytes(0, 160, 10));
    assert_eq!(
        out.stopped,
        Some(WriteError::Blocked(WriteBlocked::Credits))
    );
    assert!(pair.write_wakeup_pending(0));
    pair.settle().unwrap();
    // The peer has not read: still no credits.
    assert_eq!(
        pair.app_write(0, &stream_bytes(0, 160, 10)).stopped,
        Some(WriteError::Blocked(WriteBlocked::Credits))
    );
    // Reading 8 messages (rq_size / 2) triggers a credit-only update.
    match pair.app_read(1, 80) {
        ReadOutcome::Data(d) => assert_eq!(d, stream_bytes(0, 0, 80)),
        other => panic!("{other:?}"),
    }
    let c = *pair.sides[1].controls_posted.last().unwrap();
    assert_eq!(c.kind, ControlKind::Credits { limit: 24 });
    assert_eq!((c.payload, c.remote_addr, c.rkey), (None, 0, 0));
    pair.settle().unwrap();
    assert_eq!(pair.sides[0].conn.send_counters().1, 24);
    assert_eq!(pair.app_write(0, &stream_bytes(0, 160, 10)).written, 10);
}

#[test]
fn sequence_numbers_wrap() {
    let cfg = Config::new().with_rq_size(16).with_sq_size(16);
    let mut pair = Pair::new(cfg, cfg);
    pair.settle().unwrap();
    let mut k = 0u64;
    let mut read = 0u64;
    while k < 0x10000 + 100 {
        if pair.app_write(0, &stream_bytes(0, k, 1)).written == 1 {
            k += 1;
            continue;
        }
        pair.settle().unwrap();
        let got = read_all(&mut pair, 1);
        assert_eq!(got, stream_bytes(0, read, got.len()));
        read += got.len() as u64;
        pair.settle().unwrap();
    }
    pair.settle().unwrap();
    if let ReadOutcome::Data(d) = pair.app_read(1, usize::MAX) {
        read += d.len() as u64;
    }
    assert_eq!(read, k);
    assert!(k > 0x10000, "{k}");
    assert_eq!(pair.sides[0].conn.send_counters().0, k as u16);
    assert_eq!(pair.sides[1].conn.recv_counters().0, k as u16);
}

#[test]
fn peer_data_longer_than_granted_is_an_error() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.inject_recv(1, Some(Op::Data(65537).encode()), 65537);
    let err = pair.poll_cq(1, usize::MAX).unwrap_err();
    assert_eq!(err.kind(), ProtoErrorKind::PeerViolation);
    assert!(
        err.to_string().contains("overruns the granted buffer"),
        "{err}"
    );
    assert_eq!(pair.sides[1].conn.error(), Some(&err));
    assert_eq!(pair.app_read(1, 10), ReadOutcome::Failed(err.clone()));
    assert_eq!(
        pair.app_write(1, b"x").stopped,
        Some(WriteError::Failed(err))
    );
    // A failed connection posts nothing and ignores further completions.
    assert_eq!(pair.pump_control(1), 0);
    pair.inject_recv(1, Some(Op::Data(1).encode()), 1);
    pair.poll_cq(1, usize::MAX).unwrap();
}

#[test]
fn unknown_ctrl_code_is_an_error() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.inject_recv(0, Some(0xE000_0007), 0);
    let err = pair.poll_cq(0, usize::MAX).unwrap_err();
    assert!(err.to_string().contains("unknown CTRL code 7"), "{err}");
    assert!(pair.sides[0].conn.error().is_some());
}

#[test]
fn tiny_keepalive_does_nothing() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    let before = pair.sides[1].recv_posted;
    let events = pair.sides[1].recv_events.len();
    pair.sides[0].conn.queue_keepalive();
    // The first credit update, unsignaled, is still in flight: the keepalive completes it.
    let in_flight = pair.sides[0].conn.control_in_flight();
    assert_eq!(pair.pump_control(0), 1);
    let k = *pair.sides[0].controls_posted.last().unwrap();
    assert_eq!(k.kind, ControlKind::Ctrl(CtrlCode::Keepalive));
    assert_eq!(
        (k.imm, k.payload, k.remote_addr, k.rkey),
        (None, None, 0, 0)
    );
    assert_eq!(pair.sides[0].conn.control_in_flight(), in_flight + 1);
    pair.settle().unwrap();
    // The peer saw nothing: no receive consumed, no event; ours completed.
    assert_eq!(pair.sides[1].recv_posted, before);
    assert_eq!(pair.sides[1].recv_events.len(), events);
    assert_eq!(pair.sides[0].conn.control_in_flight(), 0);
    assert!(pair.sides[0].conn.all_sends_done());

    // A KEEPALIVE that does arrive as an immediate (C never sends one) is ignored too.
    pair.inject_recv(1, Some(Op::Ctrl(CtrlCode::Keepalive).encode()), 0);
    pair.poll_cq(1, usize::MAX).unwrap();
    assert_eq!(
        pair.sides[1].recv_events.last(),
        Some(&RecvEvent::Ctrl(CtrlCode::Keepalive))
    );
    assert!(pair.sides[1].conn.is_connected() && pair.sides[1].conn.is_readable());
    assert_eq!(pair.sides[1].recv_posted, before + 1);
}

#[test]
fn failed_send_completion_is_an_error() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    pair.app_write(0, b"doomed");
    let wr_id = pair.sides[0].data_posted[0].wr_id;
    // Posted unsignaled: the device still reports its failure (an error always completes).
    assert!(!pair.sides[0].data_posted[0].signaled);
    pair.fail_next_send(0, wr_id);
    let err = pair.poll_cq(0, 1).unwrap_err();
    assert_eq!(err.kind(), ProtoErrorKind::SendFailed);
    assert!(pair.sides[0].conn.error().is_some());
    assert!(pair.sides[0].conn.all_sends_done());
}

#[test]
fn control_slots_limit_control_messages() {
    let mut pair = Pair::new(Config::new(), Config::new());
    // Five keepalives queued: four fill the control slots, the fifth waits for a completion,
    // and the credit update that is also due waits behind it.
    for _ in 0..5 {
        pair.sides[0].conn.queue_keepalive();
    }
    assert_eq!(pair.pump_control(0), 4);
    assert_eq!(pair.sides[0].conn.control_in_flight(), 4);
    let slots: Vec<usize> = pair.sides[0]
        .controls_posted
        .iter()
        .map(|c| c.ctrl_slot)
        .collect();
    assert_eq!(slots, [0, 1, 2, 3]);
    assert!(!pair.sides[0].conn.all_sends_done());
    pair.deliver(0);
    pair.poll_cq(0, usize::MAX).unwrap();
    assert_eq!(pair.sides[0].controls_posted.len(), 5);
    let fifth = pair.sides[0].controls_posted[4];
    assert_eq!(fifth.kind, ControlKind::Ctrl(CtrlCode::Keepalive));
    assert_eq!(fifth.ctrl_slot, 0);
    pair.settle().unwrap();
    let posted = &pair.sides[0].controls_posted;
    let kinds: Vec<ControlKind> = posted.iter().map(|c| c.kind).collect();
    assert_eq!(kinds.len(), 6);
    assert_eq!(
        kinds[5],
        ControlKind::SglUpdate {
            slot: 1,
            limit: 384
        }
    );
    // Keepalives are signaled; the credit update, which took a slot with others free, is not:
    // it stays outstanding until a later signaled send completes it.
    let signaled: Vec<bool> = posted.iter().map(|c| c.signaled).collect();
    assert_eq!(signaled, [true, true, true, true, true, false]);
    assert_eq!(pair.sides[0].conn.control_in_flight(), 1);
    assert!(!pair.sides[0].conn.all_sends_done());
    pair.sides[0].conn.shutdown_write();
    pair.settle().unwrap();
    assert!(pair.sides[0].conn.all_sends_done());
    assert_eq!(pair.sides[0].conn.control_in_flight(), 0);
}

#[test]
fn credit_updates_are_signaled_only_on_the_last_control_slot() {
    let mut pair = Pair::new(Config::new(), Config::new());
    pair.settle().unwrap();
    // Side 1 only reads: its credit and buffer updates are its only sends. It reads 64 KiB at
    // a time: each read of half its 128 KiB ring is due a buffer update.
    let data = stream_bytes(0, 0, 64 << 10);
    let mut updates = 0;
    while pair.sides[1].conn.control_in_flight() < 4 {
        assert_eq!(pair.app_write(0, &data).written, data.len());
        pair.deliver_all(0);
        pair.poll_cq(0, usize::MAX).unwrap();
        pair.poll_cq(1, usize::MAX).unwrap();
        assert_eq!(read_all(&mut pair, 1), data);
        pair.deliver_all(1);
        pair.poll_cq(0, usize::MAX).unwrap();
        updates += 1;
        assert!(updates < 16, "side 1 never filled its control slots");
    }
    let signaled: Vec<bool> = pair.sides[1]
        .controls_posted
        .iter()
        .map(|c| c.signaled)
        .collect();
    assert_eq!(signaled, [false, false, false, true]);
    // The signaled one's completion frees all four.
    pair.settle().unwrap();
    assert_eq!(pair.sides[1].conn.control_in_flight(), 0);
    assert!(pair.sides[1].conn.all_sends_done());
}
