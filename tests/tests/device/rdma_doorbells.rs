//! `RdmaConnection` operations that share doorbells: the writes of one scheduler pass go to the
//! device with one `ibv_post_send` beside the lone one before them, writes pipelined by many
//! tasks all land, and a chain that is never posted (the provider refuses it, or the connection
//! closed first) ends every operation in it with an error and its buffer back, untouched.
//!
//! The runtime is current-thread, so the order tasks run in (first spawned, first run; a yield
//! goes to the back) is what the doorbell counts follow.

use std::io;
use std::sync::Arc;

use rdma_async::rdma::hooks;
use rdma_async::rdma::{LocalRegion, RdmaConnection, RdmaOptions, RemoteRegion, SharedRegion};
use rdma_async_device_tests::{guard, rdma_pair};
use tokio::task::JoinSet;

use super::rdma_ops::{advertise, learn, sync};

/// The 8 bytes task `slot` writes.
fn value(slot: usize) -> u64 {
    slot as u64 * 7 + 5
}

/// One task per slot in `slots`, each writing [`value`] of its slot to that slot of `remote`
/// `each` times in a row; every task ends with (slot, result of its last write, its buffer).
fn spawn_writers(
    client: &Arc<RdmaConnection>,
    remote: RemoteRegion,
    slots: std::ops::Range<usize>,
    each: usize,
) -> JoinSet<(usize, io::Result<()>, LocalRegion)> {
    let mut tasks = JoinSet::new();
    for slot in slots {
        let client = client.clone();
        tasks.spawn(async move {
            let mut buf = client.reg_msgs(8).unwrap();
            buf.copy_from_slice(&value(slot).to_be_bytes());
            let mut result = Ok(());
            for _ in 0..each {
                let (r, back) = client
                    .write(buf, .., remote.slice(slot as u32 * 8, 8).unwrap())
                    .await;
                buf = back;
                result = r;
                if result.is_err() {
                    break;
                }
            }
            (slot, result, buf)
        });
    }
    tasks
}

async fn join_all(
    what: &str,
    mut tasks: JoinSet<(usize, io::Result<()>, LocalRegion)>,
) -> Vec<(usize, io::Result<()>, LocalRegion)> {
    let mut ended = guard(what, async {
        let mut ended = Vec::new();
        while let Some(t) = tasks.join_next().await {
            ended.push(t.unwrap());
        }
        ended
    })
    .await;
    ended.sort_by_key(|(slot, _, _)| *slot);
    ended
}

/// A connected pair with `opts`, and a region of `slots` 8-byte slots on the server that the
/// client learned the key of.
pub(super) async fn pair_with_target(
    opts: &RdmaOptions,
    slots: usize,
) -> (
    RdmaConnection,
    Arc<RdmaConnection>,
    SharedRegion,
    RemoteRegion,
) {
    let (server, client) = rdma_pair(opts).await;
    let client = Arc::new(client);
    let target = server.reg_write(slots * 8).unwrap();
    let ((), remote) = tokio::join!(advertise(&server, &target), learn(&client));
    (server, client, target, remote)
}

pub(super) fn slot_bytes(bytes: &[u8], slot: usize) -> u64 {
    u64::from_be_bytes(bytes[slot * 8..slot * 8 + 8].try_into().unwrap())
}

/// 32 tasks that each post one write in the same pass take two doorbells: the first task is
/// alone and posts its own; the next one is the first of a chain, lets the rest add theirs, and
/// posts all 31 at once. Then 32 tasks writing 16 times each, pipelined, all land.
#[rdma_async::test(flavor = "current_thread")]
async fn writes_of_one_pass_share_a_doorbell_and_pipelined_writes_all_land() {
    const TASKS: usize = 32;
    const EACH: usize = 16;
    let opts = RdmaOptions::new().send_depth(TASKS as u32);
    let (server, client, target, remote) = pair_with_target(&opts, 2 * TASKS).await;

    let before = client.post_send_calls();
    for (slot, r, _) in join_all(
        "one write each",
        spawn_writers(&client, remote, 0..TASKS, 1),
    )
    .await
    {
        r.unwrap_or_else(|e| panic!("write {slot}: {e}"));
    }
    assert_eq!(
        client.post_send_calls() - before,
        2,
        "32 writes of one pass: the lone first one's doorbell and one for the other 31"
    );

    let before = client.post_send_calls();
    let pipelined = spawn_writers(&client, remote, TASKS..2 * TASKS, EACH);
    for (slot, r, _) in join_all("16 writes each", pipelined).await {
        r.unwrap_or_else(|e| panic!("writes of slot {slot}: {e}"));
    }
    let doorbells = client.post_send_calls() - before;
    assert!(
        doorbells < (TASKS * EACH) as u64,
        "{} pipelined writes took {doorbells} ibv_post_send calls",
        TASKS * EACH
    );
    sync(&client, &server).await;
    let bytes = target.to_vec();
    for slot in 0..2 * TASKS {
        assert_eq!(slot_bytes(&bytes, slot), value(slot), "slot {slot}");
    }
}

/// The provider refuses the chain of 7 writes (a test hook): nobody knows which of them reached
/// the device, so the connection ends. Each of the 7 fails with the cause and gets its buffer
/// back as it was; none reached the peer; later operations are refused with the cause.
#[rdma_async::test(flavor = "current_thread")]
async fn a_refused_chained_post_ends_the_connection_and_returns_every_buffer() {
    const TASKS: usize = 8;
    let (_server, client, target, remote) = pair_with_target(&RdmaOptions::new(), TASKS).await;

    hooks::fail_next_chained_post(&client);
    let ended = join_all("writes", spawn_writers(&client, remote, 0..TASKS, 1)).await;
    for (slot, r, buf) in &ended[1..] {
        let e = r.as_ref().expect_err("its chain was refused");
        assert!(
            e.to_string().contains("posting queued work requests"),
            "write {slot}: {e}"
        );
        assert_eq!(slot_bytes(buf, 0), value(*slot), "write {slot}'s buffer");
    }
    // The lone first write was posted on its own: done, or flushed when the connection ended.
    let (_, first, _) = &ended[0];
    if let Err(e) = first {
        assert!(
            e.to_string().contains("posting queued work requests"),
            "{e}"
        );
    }
    let bytes = target.to_vec();
    for slot in 1..TASKS {
        assert_eq!(slot_bytes(&bytes, slot), 0, "write {slot} reached the peer");
    }
    assert_later_writes_refused(&client, remote, "posting queued work requests").await;
}

/// A write on `client`, whose connection ended, is refused with an error that says `cause`.
pub(super) async fn assert_later_writes_refused(
    client: &RdmaConnection,
    remote: RemoteRegion,
    cause: &str,
) {
    let (later, _) = guard(
        "a later write",
        client.write(client.reg_msgs(8).unwrap(), .., remote.slice(0, 8).unwrap()),
    )
    .await;
    let e = later.expect_err("the connection ended");
    assert!(e.to_string().contains(cause), "{e}");
}

/// The connection is closed (by a task that runs after the 7 writes left their requests, before
/// the first of them rings): the chain is never posted, and its writes end as flushed writes do
/// after a close, each with its buffer back as it was; none reached the peer.
#[rdma_async::test(flavor = "current_thread")]
async fn writes_left_for_a_doorbell_when_the_connection_closes_end_flushed() {
    const TASKS: usize = 8;
    let (_server, client, target, remote) = pair_with_target(&RdmaOptions::new(), TASKS).await;

    let writers = spawn_writers(&client, remote, 0..TASKS, 1);
    let closer = {
        let client = client.clone();
        tokio::spawn(async move { client.disconnect().await })
    };
    let ended = join_all("writes", writers).await;
    closer.await.unwrap().unwrap();
    for (slot, r, buf) in &ended[1..] {
        let e = r
            .as_ref()
            .expect_err("the connection closed before its chain was posted");
        assert!(
            matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset
            ),
            "write {slot}: {e}"
        );
        assert_eq!(slot_bytes(buf, 0), value(*slot), "write {slot}'s buffer");
    }
    let bytes = target.to_vec();
    for slot in 1..TASKS {
        assert_eq!(slot_bytes(&bytes, slot), 0, "write {slot} reached the peer");
    }
}
