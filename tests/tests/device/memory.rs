//! Memory the application already has, or of a special kind: caller-owned memory, huge pages,
//! mapped files, dma-bufs and on-demand paging. Contents are checked after real RDMA traffic;
//! misuse is a clear error.

use std::io::{self, Write};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rdma_async::device::{DeviceContext, ForeignMemory};
use rdma_async::rdma::{RdmaConnection, RdmaOptions, RemoteAccess};
use rdma_async_device_tests::{err_kind, guard, rdma_pair};

/// Sets its flag when dropped: shows when a region lets go of its memory's owner.
struct DropFlag(Arc<AtomicBool>);

impl Drop for DropFlag {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// `len` bytes of a vector's memory as [`ForeignMemory`] (at least one byte of allocation, so
/// even a zero-length claim points at live memory), and the flag its owner sets when dropped.
fn foreign_heap(len: usize) -> (ForeignMemory, Arc<AtomicBool>) {
    let mut vec = vec![0u8; len.max(1)];
    let ptr = NonNull::new(vec.as_mut_ptr()).expect("a vector's pointer is never null");
    let dropped = Arc::new(AtomicBool::new(false));
    // SAFETY: `ptr..ptr + len` is the vector's heap memory, which moving the vector into the
    // owner does not move; nothing else touches it, and the owner (dropped only after
    // deregistration) frees it.
    let memory = unsafe { ForeignMemory::new(ptr, len, (vec, DropFlag(dropped.clone()))) };
    (memory, dropped)
}

/// Sends `len` bytes of `region` (already filled) from `from` to `to`; returns what arrived.
async fn send_region(
    from: &RdmaConnection,
    to: &RdmaConnection,
    region: rdma_async::rdma::LocalRegion,
) -> (Vec<u8>, rdma_async::rdma::LocalRegion) {
    let inbox = to.reg_msgs(region.len()).unwrap();
    let ((got, inbox), (sent, region)) = guard("send", async {
        tokio::join!(to.recv(inbox, ..), from.send(region, ..))
    })
    .await;
    sent.unwrap();
    let n = got.unwrap().len();
    (inbox[..n].to_vec(), region)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn caller_owned_memory_carries_rdma_and_its_owner_is_dropped_after_deregistration() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let ctx = client.context();
    let (memory, dropped) = foreign_heap(5000);
    assert_eq!(memory.len(), 5000);
    let mut region = ctx.register_foreign(memory).unwrap();
    assert_eq!(region.len(), 5000);
    for (i, b) in region.iter_mut().enumerate() {
        *b = (i % 251) as u8;
    }
    let (got, region) = send_region(&client, &server, region).await;
    assert_eq!(got.len(), 5000);
    assert!(got.iter().enumerate().all(|(i, &b)| b == (i % 251) as u8));
    assert!(
        !dropped.load(Ordering::SeqCst),
        "the owner lives as long as the region"
    );
    drop(region);
    assert!(
        dropped.load(Ordering::SeqCst),
        "dropping the region drops the owner"
    );

    // Shared, and written by the peer.
    let (memory, dropped) = foreign_heap(64);
    let target = ctx
        .register_foreign_shared(memory, RemoteAccess::WRITE)
        .unwrap();
    let mut src = server.reg_msgs(64).unwrap();
    src.copy_from_slice(&[0x5a; 64]);
    let (wrote, _src) = server.write(src, .., target.remote().whole()).await;
    wrote.unwrap();
    assert_eq!(target.to_vec(), vec![0x5a; 64]);
    drop(target);
    assert!(dropped.load(Ordering::SeqCst));

    // A refused registration drops the owner too.
    let (empty, dropped) = foreign_heap(0);
    let (kind, msg) = err_kind(ctx.register_foreign(empty));
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("at least 1 byte"), "{msg}");
    assert!(
        dropped.load(Ordering::SeqCst),
        "a refused registration drops the owner"
    );
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_region_larger_than_4_gib_carries_rdma_at_its_far_end() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    // Past 4 GiB: offsets there need more than 32 bits (the guest has 6 GiB).
    let len = (4usize << 30) + (64 << 10);
    let mut big = client.reg_msgs(len).unwrap();
    assert_eq!(big.len(), len);
    let far = len - 10_000;
    for (i, b) in big[far..far + 5000].iter_mut().enumerate() {
        *b = (i % 241) as u8;
    }
    // A send from beyond 4 GiB.
    let inbox = server.reg_msgs(5000).unwrap();
    let ((got, inbox), (sent, big)) = guard("send from past 4 GiB", async {
        tokio::join!(server.recv(inbox, ..), client.send(big, far..far + 5000))
    })
    .await;
    sent.unwrap();
    assert_eq!(got.unwrap().len(), 5000);
    assert!(
        inbox[..] == big[far..far + 5000],
        "the bytes past 4 GiB arrived"
    );
    // An RDMA read into its last page.
    let mut src = server.reg_shared(4096, RemoteAccess::READ).unwrap();
    src.write_at(0, &[0xc3; 4096]).unwrap();
    let (read, big) = client.read(big, len - 4096.., src.remote().whole()).await;
    read.unwrap();
    assert!(big[len - 4096..].iter().all(|&b| b == 0xc3));
    // One work request covers at most u32::MAX bytes; a peer's descriptor as much.
    let (sent, _big) = client.send(big, ..).await;
    let (kind, msg) = err_kind(sent);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    let (kind, msg) = err_kind(client.reg_shared(len, RemoteAccess::READ));
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("32-bit"), "{msg}");
}

/// Huge pages of this guest in use (total minus free), from /proc/meminfo.
fn huge_pages_in_use() -> u64 {
    let info = std::fs::read_to_string("/proc/meminfo").unwrap();
    let field = |name: &str| -> u64 {
        info.lines()
            .find(|l| l.starts_with(name))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/meminfo"))
    };
    field("HugePages_Total:") - field("HugePages_Free:")
}

fn reserve_huge_pages(n: usize) {
    std::fs::write("/proc/sys/vm/nr_hugepages", n.to_string())
        .expect("reserving huge pages needs root in the guest");
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_pages_register_when_reserved_and_say_how_to_reserve_when_not() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let ctx = client.context();
    let page = DeviceContext::huge_page_size();
    assert!(page >= 2 << 20, "huge page size {page}");

    reserve_huge_pages(0);
    let (kind, msg) = err_kind(ctx.reg_msgs_huge(page));
    assert_eq!(kind, io::ErrorKind::OutOfMemory, "{msg}");
    assert!(msg.contains("/proc/sys/vm/nr_hugepages"), "{msg}");

    reserve_huge_pages(4);
    let before = huge_pages_in_use();
    // One and a half pages: two pages mapped, the region as long as asked.
    let mut local = ctx.reg_msgs_huge(page + page / 2).unwrap();
    assert_eq!(local.len(), page + page / 2);
    let target = server
        .context()
        .reg_shared_huge(page / 2, RemoteAccess::WRITE | RemoteAccess::READ)
        .unwrap();
    assert_eq!(
        huge_pages_in_use() - before,
        3,
        "the regions are backed by huge pages"
    );
    for (i, b) in local.iter_mut().enumerate() {
        *b = (i % 253) as u8;
    }
    // Write across the boundary between the two huge pages, then read it back.
    let span = page - 1000..page + 1000;
    let remote = target.remote().slice(0, 2000).unwrap();
    let (wrote, local) = client.write(local, span.clone(), remote).await;
    wrote.unwrap();
    let mut got = vec![0; 2000];
    target.read_at(0, &mut got).unwrap();
    assert!(
        got == local[span].to_vec(),
        "the huge page write arrived intact"
    );
    let back = ctx.reg_msgs_huge(4096).unwrap();
    let (read, back) = client.read(back, ..2000, remote).await;
    read.unwrap();
    assert_eq!(&back[..2000], &got[..]);

    drop((local, target, back));
    assert_eq!(
        huge_pages_in_use(),
        before,
        "dropping the regions unmaps them"
    );
    reserve_huge_pages(0);
}

/// A file in the guest's `/dev/shm` holding `len` bytes of a pattern (the guest's `/tmp` is a
/// 9p share, which has no shared mappings).
fn pattern_file(name: &str, len: usize) -> (std::path::PathBuf, Vec<u8>) {
    let path =
        std::path::Path::new("/dev/shm").join(format!("rdma-async-{name}-{}", std::process::id()));
    let data: Vec<u8> = (0..len).map(|i| (i * 7 % 256) as u8).collect();
    let mut file = std::fs::File::create(&path).unwrap();
    file.write_all(&data).unwrap();
    file.sync_all().unwrap();
    (path, data)
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mapped_file_is_served_by_rdma_read_and_is_never_written() {
    let (server, client) = rdma_pair(&RdmaOptions::new()).await;
    let (path, data) = pattern_file("served", 20_000);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let ctx = server.context();
    let mut served = ctx.map_file(&file, 4096, 12_000).unwrap();
    assert_eq!(served.access(), RemoteAccess::READ);
    let remote = served.remote();
    assert_eq!(remote.len(), 12_000);

    // The peer reads it, in two pieces and whole.
    let inbox = client.reg_msgs(12_000).unwrap();
    let (read, inbox) = client
        .read(inbox, ..5000, remote.slice(0, 5000).unwrap())
        .await;
    read.unwrap();
    let (read, inbox) = client
        .read(inbox, 5000.., remote.slice(5000, 7000).unwrap())
        .await;
    read.unwrap();
    assert!(inbox[..] == data[4096..16_096], "the file arrived intact");

    // Locally: reads copy through the file; nothing writes it.
    let mut head = [0; 16];
    served.read_at(0, &mut head).unwrap();
    assert_eq!(head, data[4096..4112]);
    let (kind, msg) = err_kind(served.write_at(0, b"no"));
    assert_eq!(kind, io::ErrorKind::PermissionDenied, "{msg}");
    let (result, served) = server.recv(served, ..).await;
    let (kind, msg) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    assert!(msg.contains("read-only"), "{msg}");
    let (result, served) = server.read(served, ..8, inbox_remote(&client).await).await;
    let (kind, msg) = err_kind(result);
    assert_eq!(kind, io::ErrorKind::InvalidInput, "{msg}");
    // The peer may not write it: its device refuses the key.
    let src = client.reg_msgs(8).unwrap();
    let (wrote, _src) = client.write(src, .., remote.slice(0, 8).unwrap()).await;
    let (kind, msg) = err_kind(wrote);
    assert_eq!(kind, io::ErrorKind::PermissionDenied, "{msg}");
    let mut again = [0; 8];
    served.read_at(0, &mut again).unwrap();
    assert_eq!(again, data[4096..4104], "the refused write changed nothing");

    // A file truncated under the mapping: local reads fail cleanly instead of SIGBUS.
    file.set_len(1000).unwrap();
    let (kind, msg) = err_kind(served.read_at(8000, &mut head));
    assert_eq!(kind, io::ErrorKind::UnexpectedEof, "{msg}");
    drop(served);

    // Bad ranges.
    for (offset, len, what) in [
        (0, 0, "empty"),
        (0, 5000, "past the end"),
        (100, 10, "unaligned"),
    ] {
        let (kind, msg) = err_kind(ctx.map_file(&file, offset, len));
        assert_eq!(kind, io::ErrorKind::InvalidInput, "{what}: {msg}");
    }
    std::fs::remove_file(&path).unwrap();
}

/// A descriptor of 8 writable bytes on `conn`'s side, kept alive by leaking the region (the test
/// only needs a valid target for a refused operation).
async fn inbox_remote(conn: &RdmaConnection) -> rdma_async::rdma::RemoteSlice {
    let region = conn.reg_write(8).unwrap();
    let slice = region.remote().whole();
    std::mem::forget(region);
    slice
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn dma_bufs_and_on_demand_paging_say_clearly_that_soft_roce_cannot() {
    let (_server, client) = rdma_pair(&RdmaOptions::new()).await;
    let ctx = client.context();
    let odp = ctx.on_demand_paging().unwrap();
    assert!(
        !odp.supported,
        "rxe in the test kernel reports no on-demand paging: {odp:?}"
    );
    let (kind, msg) = err_kind(ctx.reg_shared_on_demand(4096, RemoteAccess::READ));
    assert_eq!(kind, io::ErrorKind::Unsupported, "{msg}");
    assert!(msg.contains(ctx.device_name()), "{msg}");
    assert!(msg.contains("on-demand paging"), "{msg}");

    // rxe has no dma-buf registration; any descriptor shows it (the guest kernel has no
    // udmabuf to make a real dma-buf with).
    let fd: std::os::fd::OwnedFd = std::fs::File::open("/dev/null").unwrap().into();
    let (kind, msg) = err_kind(ctx.register_dmabuf(fd, 0, 4096, RemoteAccess::READ));
    assert_eq!(kind, io::ErrorKind::Unsupported, "{msg}");
    assert!(msg.contains(ctx.device_name()), "{msg}");
    assert!(msg.contains("dma-buf"), "{msg}");
}
