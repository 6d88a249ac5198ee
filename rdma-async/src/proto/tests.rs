//! Connection-level tests with hand-made completions: hostile or broken peers, byte order,
//! driver misuse. End-to-end scenarios live in `super::sim`.

use super::*;

const LAYOUT: LocalLayout = LocalLayout {
    rbuf_addr: 0x1000_0000,
    rbuf_rkey: 0x11,
    target_sgl_addr: 0x2000_0000,
    target_sgl_rkey: 0x22,
    ring_keys: None,
};

fn peer_data(flags: u8) -> ConnData {
    ConnData {
        version: 1,
        flags,
        credits: 16,
        target_iomap_size: 0,
        target_sgl: RsSge {
            addr: 0x9000_0000,
            key: 0x99,
            length: 2,
        },
        data_buf: RsSge {
            addr: 0x8000_0000,
            key: 0x88,
            length: 4096,
        },
    }
}

fn connected(flags: u8) -> Connection {
    let mut c = Connection::new(Config::new().with_rbuf_size(8192), LAYOUT);
    c.handle_peer_conn_data(&peer_data(flags)).unwrap();
    c
}

fn no_slot(_: usize) -> [u8; 16] {
    panic!("the target SGL must not be read here")
}

fn sgl_bytes(addr: u64, length: u32) -> [u8; 16] {
    RsSge {
        addr,
        key: 0x88,
        length,
    }
    .to_bytes(ByteOrder::native())
}

#[test]
fn local_conn_data_describes_the_layout() {
    let c = Connection::new(Config::new(), LAYOUT);
    let d = c.local_conn_data();
    assert_eq!(d.credits, 384);
    assert_eq!(
        d.target_sgl,
        RsSge {
            addr: 0x2000_0000,
            key: 0x22,
            length: 2
        }
    );
    assert_eq!(
        d.data_buf,
        RsSge {
            addr: 0x1000_0000,
            key: 0x11,
            length: 65536
        }
    );
    assert_eq!(CONN_DATA_LEN, 40);
    assert_eq!(TARGET_SGL_BYTES, 32);
    assert_eq!(iomap_code_to_size(iomap_size_to_code(1024)), 1024);
}

#[test]
fn sgl_payload_follows_the_peers_byte_order() {
    use crate::proto::conn_data::RS_CONN_FLAG_NET;
    let expected = RsSge {
        addr: 0x1000_0000 + 4096,
        key: 0x11,
        length: 4096,
    };
    // A big-endian peer (NET set) gets big-endian SGL entries, a little-endian one LE.
    for (flags, order) in [(RS_CONN_FLAG_NET, ByteOrder::Big), (0, ByteOrder::Little)] {
        let mut c = connected(flags);
        let w = c.poll_control().unwrap();
        assert_eq!(
            w.kind,
            ControlKind::SglUpdate {
                slot: 1,
                limit: 384
            }
        );
        assert_eq!(w.payload, Some(expected.to_bytes(order)));
        assert_eq!(w.remote_addr, 0x9000_0010);
        assert_eq!(w.rkey, 0x99);
    }
}

#[test]
fn peer_sgl_update_fills_our_slots_1_then_0() {
    let mut c = connected(0);
    let a = c
        .handle_recv_completion(Some(Op::Sgl(16).encode()), 16, |slot| {
            assert_eq!(slot, 1);
            sgl_bytes(0x8000_1000, 4096)
        })
        .unwrap();
    assert_eq!(
        a,
        RecvAction {
            repost: true,
            event: RecvEvent::SglUpdate { slot: 1, limit: 16 }
        }
    );
    // Slot 0 still holds the unused conn-data buffer: rewriting it is a violation.
    let err = c
        .handle_recv_completion(Some(Op::Sgl(16).encode()), 16, |slot| {
            assert_eq!(slot, 0);
            sgl_bytes(0x8000_0000, 4096)
        })
        .unwrap_err();
    assert!(err.to_string().contains("slot 0"), "{err}");
    assert!(c.error().is_some());
}

#[test]
fn the_drivers_receive_entry_matches_the_full_handling() {
    // Plain DATA (taken inline), a reserved op that C reads as data, a DATA word whose byte
    // count disagrees, and a credit update: each leaves both connections alike.
    let cases: &[(u32, u32)] = &[
        (Op::Data(100).encode(), 100),
        (1 << 29 | 50, 50),
        (Op::Data(0).encode(), 0),
        (Op::Sgl(16).encode(), 0),
        (Op::Data(10).encode(), 11),
        (Op::Data(10).encode(), 10),
    ];
    let mut full = connected(0);
    let mut driver = connected(0);
    for &(word, byte_len) in cases {
        let expected = full
            .handle_recv_completion(Some(word), byte_len, no_slot)
            .map(|a| a.repost);
        let got = driver.recv_completed(Some(word), byte_len, no_slot);
        assert_eq!(got, expected, "{word:#010x} with {byte_len} bytes");
        assert_eq!(format!("{driver:?}"), format!("{full:?}"), "{word:#010x}");
    }
    // Only the mismatched DATA failed the connection: what came before it is still readable.
    assert!(driver.error().is_some());
    assert_eq!(driver.read_status_len(), 150);
}

#[test]
fn hostile_values_are_errors_not_panics() {
    type Case = (Option<u32>, u32, &'static str);
    let cases: &[Case] = &[
        (None, 0, "without immediate data"),
        (Some(Op::Data(100).encode()), 99, "completion reports 99"),
        (Some(Op::Sgl(20).encode()), 7, "7-byte payload"),
        (Some(Op::Sgl(17).encode()), 0, "outside [0, 16]"),
        (Some(Op::IomapSgl(0).encode()), 24, "no iomap entries"),
        (Some(0xE000_0005), 0, "unknown CTRL code 5"),
        (Some(Op::Data(4097).encode()), 4097, "overruns"),
    ];
    for &(imm, byte_len, msg) in cases {
        let mut c = connected(0);
        let err = c
            .handle_recv_completion(imm, byte_len, no_slot)
            .unwrap_err();
        assert!(err.to_string().contains(msg), "{msg}: {err}");
        assert_eq!(c.error(), Some(&err));
        // Sticky: later completions are ignored, nothing is posted.
        let a = c
            .handle_recv_completion(Some(Op::Data(1).encode()), 1, no_slot)
            .unwrap();
        assert_eq!(
            a,
            RecvAction {
                repost: false,
                event: RecvEvent::Ignored
            }
        );
        assert_eq!(c.poll_control(), None);
    }
    // A zero-length or overflowing SGL entry.
    for (addr, len, msg) in [(0x8000_1000, 0, "0-byte"), (u64::MAX, 10, "overflows")] {
        let mut c = connected(0);
        let err = c
            .handle_recv_completion(Some(Op::Sgl(16).encode()), 16, |_| sgl_bytes(addr, len))
            .unwrap_err();
        assert!(err.to_string().contains(msg), "{msg}: {err}");
    }
}

#[test]
fn reserved_ops_are_data_and_rs_op_write_is_ignored() {
    let mut c = connected(0);
    let a = c
        .handle_recv_completion(Some(0x2000_0010), 16, no_slot)
        .unwrap();
    assert_eq!(a.event, RecvEvent::Data { offset: 0, len: 16 });
    let a = c
        .handle_recv_completion(Some(0x4000_0010), 0, no_slot)
        .unwrap();
    assert_eq!(
        a,
        RecvAction {
            repost: true,
            event: RecvEvent::Ignored
        }
    );
    assert_eq!(c.read_status(), ReadStatus::Data(16));
}

#[test]
fn zero_length_data_returns_its_credit_at_once() {
    let mut c = connected(0);
    let a = c
        .handle_recv_completion(Some(Op::Data(0).encode()), 0, no_slot)
        .unwrap();
    assert_eq!(a.event, RecvEvent::Data { offset: 0, len: 0 });
    assert_eq!(c.read_status(), ReadStatus::Blocked);
    assert_eq!(c.recv_counters().0, 1);
}

#[test]
fn driver_misuse_is_reported() {
    let mut c = Connection::new(Config::new(), LAYOUT);
    assert!(matches!(
        c.prepare_write(&mut WriteCall::new(), 10),
        Err(WriteError::Failed(e)) if e.kind() == ProtoErrorKind::Usage
    ));
    assert_eq!(c.read_status(), ReadStatus::Blocked);
    assert_eq!(c.poll_control(), None);
    let err = c.handle_recv_completion(Some(0), 0, no_slot).unwrap_err();
    assert_eq!(err.kind(), ProtoErrorKind::Usage);

    let mut c = connected(0);
    assert!(c.handle_peer_conn_data(&peer_data(0)).is_err());
    assert!(matches!(
        c.prepare_write(&mut WriteCall::new(), 0),
        Err(WriteError::Failed(e)) if e.kind() == ProtoErrorKind::Usage
    ));
    assert!(
        c.error().is_none(),
        "a 0-byte write does not break the connection"
    );
    assert!(c.consume(1).is_err());
    let w = c.prepare_write(&mut WriteCall::new(), 10).unwrap();
    assert_eq!(w.wr_id & WR_ID_RECV_FLAG, 0);
    let err = c.handle_send_completion(w.wr_id + 1, true).unwrap_err();
    assert!(err.to_string().contains("oldest outstanding"), "{err}");
    assert!(c.error().is_some());

    let mut c = Connection::new(Config::new(), LAYOUT);
    let mut bad = peer_data(0);
    bad.version = 3;
    assert_eq!(
        c.handle_peer_conn_data(&bad).unwrap_err().kind(),
        ProtoErrorKind::InvalidConnData
    );
    let fatal = c.handle_fatal(ProtoError::usage("ibv_post_send failed"));
    assert_eq!(fatal.message(), "ibv_post_send failed");
    assert_eq!(c.error(), Some(&fatal));
    assert_eq!(
        std::io::Error::from(fatal).kind(),
        std::io::ErrorKind::Other
    );
}

#[test]
fn write_readiness_follows_rs_can_send() {
    let mut c = connected(0);
    assert!(c.can_write());
    // 16 credits: the 17th message must wait for a credit update.
    for _ in 0..16 {
        c.prepare_write(&mut WriteCall::new(), 1).unwrap();
    }
    assert_eq!(
        c.write_readiness(),
        Err(WriteError::Blocked(WriteBlocked::Credits))
    );
    assert!(!c.can_write());
    let (sseq_no, sseq_comp, sbuf, sqe) = c.send_counters();
    assert_eq!(
        (sseq_no, sseq_comp, sbuf, sqe),
        (16, 16, 131072 - 16, 380 - 16)
    );
    c.handle_recv_completion(Some(Op::Sgl(30).encode()), 0, no_slot)
        .unwrap();
    assert!(c.can_write());
    assert!(c.is_writable() && c.is_readable() && c.is_connected() && !c.is_eof());
    assert_eq!(RS_SGL_SIZE, 2);
    assert_eq!(RS_QP_CTRL_SIZE, 4);
    assert_eq!(
        (RS_MAX_TRANSFER, RS_OLAP_START_SIZE, RS_SNDLOWAT),
        (65536, 2048, 2048)
    );
}

#[test]
fn segments_and_sizes_are_exposed() {
    let s = Segments::in_ring(6, 4, 8);
    let v: Vec<RingSegment> = s.as_slice().to_vec();
    assert_eq!(
        v,
        [
            RingSegment { offset: 6, len: 2 },
            RingSegment { offset: 0, len: 2 }
        ]
    );
    assert_eq!(
        Op::decode(Op::Ctrl(CtrlCode::Shutdown).encode()).unwrap(),
        Op::Ctrl(CtrlCode::Shutdown)
    );
    assert_eq!(
        ConnData::decode(&peer_data(0).encode()).unwrap(),
        peer_data(0)
    );
    let c = Connection::new(Config::new(), LAYOUT);
    assert_eq!(c.config().rq_size(), 384);
}

/// A connection whose 8 KiB ring lends its bytes: each half with its own keys.
fn lending_connection() -> Connection {
    let layout = LocalLayout {
        ring_keys: Some(RingKeys {
            initial: [0x1100, 0x2200],
            window: [0x3300, 0x4400],
        }),
        ..LAYOUT
    };
    Connection::new(Config::new().with_rbuf_size(8192), layout)
}

#[test]
fn a_lending_ring_revokes_before_it_lends_and_binds_before_it_grants() {
    let mut c = lending_connection();
    assert_eq!(c.local_conn_data().data_buf.key, 0x1100, "half 0's own key");
    c.handle_peer_conn_data(&peer_data(0)).unwrap();
    let order = ByteOrder::Little;
    // Half 1 goes out under its own first key, with no bind.
    let cw = c.poll_control().expect("the first grant");
    assert_eq!(cw.bind, None);
    assert_eq!(RsSge::from_bytes(cw.payload.unwrap(), order).key, 0x2200);
    assert_eq!(c.lend(), LendStep::Empty);
    // Half 0 filled: its first registration goes, then it is lent.
    let data = |len: u32| Some(Op::Data(len).encode());
    c.handle_recv_completion(data(4096), 4096, no_slot).unwrap();
    assert_eq!(
        c.lend(),
        LendStep::Deregister {
            half: 0,
            key: 0x1100
        }
    );
    assert_eq!(c.lend(), LendStep::Wait, "one revocation at a time");
    c.deregistered(0, 0x1100);
    assert_eq!(
        c.lend(),
        LendStep::Ready {
            offset: 0,
            len: 4096
        }
    );
    // Given back: half 0 is granted again through its window, bound first (earlier in the
    // send queue, so under a smaller work-request serial).
    c.consume(4096).unwrap();
    let cw = c.poll_control().expect("half 0 again");
    let bind = cw.bind.expect("a bind before the grant");
    assert_eq!((bind.half, bind.rkey), (0, 0x3301));
    assert!((bind.wr_id as u32) < (cw.wr_id as u32));
    assert_eq!(RsSge::from_bytes(cw.payload.unwrap(), order).key, 0x3301);
    // Half 1 then half 0 fill; half 1 is lent after its first key goes, half 0 after its
    // window's invalidation completes.
    c.handle_recv_completion(data(4096), 4096, no_slot).unwrap();
    assert!(matches!(c.lend(), LendStep::Deregister { half: 1, .. }));
    c.deregistered(1, 0x2200);
    assert!(matches!(c.lend(), LendStep::Ready { offset: 4096, .. }));
    c.consume(4096).unwrap();
    while c.poll_control().is_some() {}
    c.handle_recv_completion(data(4096), 4096, no_slot).unwrap();
    let LendStep::Invalidate { wr_id, half, key } = c.lend() else {
        panic!("half 0 is reachable through its window");
    };
    assert_eq!((half, key), (0, 0x3301));
    assert_eq!(c.lend(), LendStep::Wait);
    c.handle_send_completion(wr_id, true).unwrap();
    assert!(matches!(c.lend(), LendStep::Ready { offset: 0, .. }));
}

#[test]
fn a_failed_connection_copies_what_it_cannot_lend() {
    let mut c = lending_connection();
    c.handle_peer_conn_data(&peer_data(0)).unwrap();
    c.handle_recv_completion(Some(Op::Data(4096).encode()), 4096, no_slot)
        .unwrap();
    c.handle_fatal(ProtoError::new(ProtoErrorKind::SendFailed, "gone"));
    assert_eq!(c.lend(), LendStep::Copy);
}
