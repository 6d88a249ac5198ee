//! `RdmaConnection::write_batch`: a batch's writes land with one doorbell and every buffer comes
//! back in order; a member that fails fails the batch only once its last request completed,
//! with every buffer back and the writes before it landed; batches that cannot be posted are
//! refused before anything reaches the device, as one the provider refuses whole; one it takes
//! only in part ends the connection, which alone settles the part posted; a dropped batch gives
//! its send-queue places back once its last request completes.

use std::future::Future;
use std::io;
use std::task::Poll;

use rdma_async::rdma::hooks;
use rdma_async::rdma::{LocalRegion, RdmaConnection, RdmaOptions, RemoteRegion};
use rdma_async_device_tests::{completion_status, guard};

use super::rdma_doorbells::{assert_later_writes_refused, pair_with_target, slot_bytes};
use super::rdma_ops::sync;

/// `IBV_WC_REM_ACCESS_ERR`.
const REM_ACCESS_ERR: u32 = 10;

/// The 8 bytes written to `slot`, in round `round`.
fn value(slot: usize, round: u64) -> u64 {
    round << 32 | (slot as u64 * 7 + 5)
}

/// One 8-byte buffer per slot of `slots`, holding [`value`] of its slot and `round`, aimed at
/// that slot of `remote`.
fn writes(
    conn: &RdmaConnection,
    remote: RemoteRegion,
    slots: std::ops::Range<usize>,
    round: u64,
) -> Vec<(
    LocalRegion,
    std::ops::Range<usize>,
    rdma_async::rdma::RemoteSlice,
)> {
    slots
        .map(|slot| {
            let mut buf = conn.reg_msgs(8).unwrap();
            buf.copy_from_slice(&value(slot, round).to_be_bytes());
            (buf, 0..8, remote.slice(slot as u32 * 8, 8).unwrap())
        })
        .collect()
}

/// Every buffer came back, in the order given, as it was.
fn assert_buffers_back(back: &[LocalRegion], slots: std::ops::Range<usize>, round: u64) {
    assert_eq!(back.len(), slots.len(), "buffers lost");
    for (buf, slot) in back.iter().zip(slots) {
        assert_eq!(
            slot_bytes(buf, 0),
            value(slot, round),
            "buffer of slot {slot}"
        );
    }
}

/// 16 writes (some inline at 8 bytes, as the default allows) go to the device with one
/// `ibv_post_send`, land, and give their buffers back in order; a second batch reuses them;
/// an empty batch is done at once.
#[rdma_async::test(flavor = "current_thread")]
async fn a_batch_of_writes_lands_with_one_doorbell_and_gives_every_buffer_back() {
    const N: usize = 16;
    let opts = RdmaOptions::new().send_depth(N as u32);
    let (server, client, target, remote) = pair_with_target(&opts, N).await;

    let before = client.post_send_calls();
    let (r, back) = guard(
        "a batch of 16",
        client.write_batch(writes(&client, remote, 0..N, 1)),
    )
    .await;
    r.unwrap();
    assert_eq!(client.post_send_calls() - before, 1, "one doorbell for 16");
    assert_buffers_back(&back, 0..N, 1);
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..N {
        assert_eq!(slot_bytes(&bytes, slot), value(slot, 1), "slot {slot}");
    }

    let mut again = Vec::new();
    for (slot, mut buf) in back.into_iter().enumerate() {
        buf.copy_from_slice(&value(slot, 2).to_be_bytes());
        again.push((buf, 0..8, remote.slice(slot as u32 * 8, 8).unwrap()));
    }
    let (r, back) = guard("a second batch", client.write_batch(again)).await;
    r.unwrap();
    assert_buffers_back(&back, 0..N, 2);
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..N {
        assert_eq!(slot_bytes(&bytes, slot), value(slot, 2), "slot {slot}");
    }

    let (r, back) = guard(
        "an empty batch",
        client.write_batch(Vec::<(LocalRegion, _, _)>::new()),
    )
    .await;
    r.unwrap();
    assert!(back.is_empty());
}

/// The 4th of 8 writes goes past the end of the peer's region (a forged descriptor): the batch
/// fails with the remote access error, every buffer comes back as it was, the writes before
/// it landed, and later operations are refused with the cause.
#[rdma_async::test(flavor = "current_thread")]
async fn a_failed_member_fails_the_batch_with_its_error_and_every_buffer_back() {
    const N: usize = 8;
    const BAD: usize = 3;
    let (server, client, target, real) = pair_with_target(&RdmaOptions::new(), N).await;
    let forged = RemoteRegion::new(real.addr(), real.len() + 8, real.rkey()).unwrap();
    let mut batch = writes(&client, real, 0..N, 1);
    batch[BAD].2 = forged.slice(real.len(), 8).unwrap();

    let (r, back) = guard("a batch with a bad member", client.write_batch(batch)).await;
    let e = r.expect_err("a write went past the region");
    assert_eq!(e.kind(), io::ErrorKind::PermissionDenied, "{e}");
    assert!(e.to_string().contains("remote access error"), "{e}");
    assert!(e.to_string().contains("batch of 8 RDMA writes"), "{e}");
    assert_eq!(completion_status(&e), REM_ACCESS_ERR, "{e}");
    assert_buffers_back(&back, 0..N, 1);
    let bytes = target.to_vec();
    for slot in 0..BAD {
        assert_eq!(
            slot_bytes(&bytes, slot),
            value(slot, 1),
            "write {slot} did not land"
        );
    }

    let (later, _) = guard(
        "a write after the failed batch",
        client.write(client.reg_msgs(8).unwrap(), .., real.slice(0, 8).unwrap()),
    )
    .await;
    let later = later.expect_err("the connection failed");
    assert!(later.to_string().contains("failed earlier"), "{later}");
    assert_eq!(completion_status(&later), REM_ACCESS_ERR, "{later}");
    drop(server);
}

/// A batch larger than the send queue, or with a write that does not fit its region or its
/// remote slice, is refused with `InvalidInput` naming the problem, before anything is posted:
/// every buffer comes back and the connection goes on.
#[rdma_async::test(flavor = "current_thread")]
async fn batches_that_cannot_be_posted_are_refused_before_reaching_the_device() {
    const DEPTH: usize = 4;
    let opts = RdmaOptions::new().send_depth(DEPTH as u32);
    let (server, client, target, remote) = pair_with_target(&opts, 2 * DEPTH).await;
    let before = client.post_send_calls();

    let (r, back) = guard(
        "a batch deeper than the queue",
        client.write_batch(writes(&client, remote, 0..DEPTH + 1, 1)),
    )
    .await;
    let e = r.expect_err("5 writes on a queue of 4");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("depth of 4"), "{e}");
    assert_buffers_back(&back, 0..DEPTH + 1, 1);

    let mut outside = writes(&client, remote, 0..DEPTH, 1);
    outside[2].1 = 4..12;
    let (r, back) = guard("a range outside its region", client.write_batch(outside)).await;
    let e = r.expect_err("bytes 4..12 of an 8-byte region");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("write 2 of the batch"), "{e}");
    assert_buffers_back(&back, 0..DEPTH, 1);

    let mut too_long = writes(&client, remote, 0..DEPTH, 1);
    too_long[1].2 = remote.slice(8, 4).unwrap();
    let (r, back) = guard("a remote slice too short", client.write_batch(too_long)).await;
    let e = r.expect_err("8 bytes into a 4-byte slice");
    assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
    assert!(e.to_string().contains("write 1 of the batch"), "{e}");
    assert_buffers_back(&back, 0..DEPTH, 1);

    assert_eq!(
        client.post_send_calls(),
        before,
        "a refused batch reached the device"
    );
    let (r, _) = guard(
        "a batch after the refusals",
        client.write_batch(writes(&client, remote, DEPTH..2 * DEPTH, 1)),
    )
    .await;
    r.unwrap();
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..DEPTH {
        assert_eq!(slot_bytes(&bytes, slot), 0, "refused write {slot} landed");
    }
    for slot in DEPTH..2 * DEPTH {
        assert_eq!(slot_bytes(&bytes, slot), value(slot, 1), "slot {slot}");
    }
}

/// A batch that fills the send queue is dropped after its first poll: its writes still land,
/// and its places come back once its last request completes, so a second full batch runs
/// (it would wait forever for places otherwise).
#[rdma_async::test(flavor = "current_thread")]
async fn a_dropped_batch_gives_its_places_back_once_its_last_write_completes() {
    const DEPTH: usize = 8;
    let opts = RdmaOptions::new().send_depth(DEPTH as u32);
    let (server, client, target, remote) = pair_with_target(&opts, 2 * DEPTH).await;
    {
        let mut dropped = std::pin::pin!(client.write_batch(writes(&client, remote, 0..DEPTH, 1)));
        std::future::poll_fn(|cx| {
            let _ = dropped.as_mut().poll(cx);
            Poll::Ready(())
        })
        .await;
    }
    let (r, back) = guard(
        "a full batch after a dropped one",
        client.write_batch(writes(&client, remote, DEPTH..2 * DEPTH, 1)),
    )
    .await;
    r.unwrap();
    assert_buffers_back(&back, DEPTH..2 * DEPTH, 1);
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..2 * DEPTH {
        assert_eq!(slot_bytes(&bytes, slot), value(slot, 1), "slot {slot}");
    }
}

/// The provider refuses a batch's first request (a test hook): nothing was posted, so the batch
/// fails with the provider's error and its buffers back, and the connection goes on. Then it
/// refuses the last request after posting the others: those are on the device unsignaled and
/// no completion will free their slot, so the connection ends; the batch fails with that cause
/// once the destroyed queue pair's flush handed its buffers back, and later operations are
/// refused with it.
#[rdma_async::test(flavor = "current_thread")]
async fn a_batch_the_provider_refuses_goes_back_whole_and_one_posted_in_part_ends_the_connection() {
    const N: usize = 8;
    let (server, client, target, remote) = pair_with_target(&RdmaOptions::new(), 2 * N).await;

    hooks::fail_next_batch(&client, false);
    let (r, back) = guard(
        "a refused batch",
        client.write_batch(writes(&client, remote, 0..N, 1)),
    )
    .await;
    let e = r.expect_err("the provider refused it");
    assert!(e.to_string().contains("ibv_post_send"), "{e}");
    assert_buffers_back(&back, 0..N, 1);
    let (r, _) = guard(
        "a batch after the refusal",
        client.write_batch(writes(&client, remote, 0..N, 2)),
    )
    .await;
    r.unwrap();
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..N {
        assert_eq!(slot_bytes(&bytes, slot), value(slot, 2), "slot {slot}");
    }

    hooks::fail_next_batch(&client, true);
    let (r, back) = guard(
        "a batch posted in part",
        client.write_batch(writes(&client, remote, N..2 * N, 3)),
    )
    .await;
    let e = r.expect_err("its last request was refused");
    assert!(e.to_string().contains("after part of it was posted"), "{e}");
    assert_buffers_back(&back, N..2 * N, 3);
    assert_later_writes_refused(&client, remote, "after part of it was posted").await;
}
