//! Registered memory of every kind is deregistered exactly when its last owner goes: the buffer
//! pool registers once per slab (not per buffer) and deregisters its slabs when the pool and its
//! buffers are gone; huge pages, mapped files and caller-owned memory deregister on drop. One
//! test in its own binary: it counts this process's memory regions (`rdma resource show mr`).

use std::ptr::NonNull;

use rdma_async::device::{ForeignMemory, PoolOptions};
use rdma_async::rdma::{RdmaOptions, RemoteAccess};
use rdma_async_device_tests::{rdma_pair, rdma_resources};

fn regions() -> usize {
    rdma_resources("mr").unwrap()
}

#[rdma_async::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_kind_of_registered_memory_is_deregistered_with_its_last_owner() {
    let (_server, client) = rdma_pair(&RdmaOptions::new()).await;
    let ctx = client.context();
    let base = regions();

    // The pool: 10 buffers of two classes come from 3 slabs, so 3 registrations.
    let pool = ctx
        .buffer_pool(
            &PoolOptions::new()
                .size_classes([1024, 8192])
                .slab_bytes(4 * 8192),
        )
        .unwrap();
    assert_eq!(regions(), base, "an empty pool registers nothing");
    let small: Vec<_> = (0..6).map(|_| pool.try_get(1000).unwrap()).collect();
    let large: Vec<_> = (0..4).map(|_| pool.try_get(8192).unwrap()).collect();
    let slabs = pool.stats().slabs;
    assert_eq!(
        slabs, 2,
        "6 of 1 KiB fit one 32 KiB slab, 4 of 8 KiB another"
    );
    assert_eq!(regions(), base + slabs, "one registration per slab");
    let fifth = pool.try_get(8192).unwrap();
    assert_eq!(regions(), base + 3, "a full class registers one more slab");
    drop(small);
    drop(large);
    assert_eq!(regions(), base + 3, "returned buffers keep their slabs");
    // A buffer that outlives its pool keeps its slab, and only its slab.
    drop(pool);
    assert_eq!(regions(), base + 1, "the pool's free slabs go with it");
    drop(fifth);
    assert_eq!(regions(), base, "the last buffer takes its slab with it");

    // Mapped files, huge pages and caller-owned memory.
    let path = std::path::Path::new("/dev/shm").join(format!("memleaks-{}", std::process::id()));
    std::fs::write(&path, vec![1u8; 8192]).unwrap();
    let file = std::fs::File::open(&path).unwrap();
    let mapped = ctx.map_file(&file, 0, 8192).unwrap();
    std::fs::write("/proc/sys/vm/nr_hugepages", "1").unwrap();
    let huge = ctx.reg_shared_huge(4096, RemoteAccess::READ).unwrap();
    let mut vec = vec![0u8; 4096];
    let ptr = NonNull::new(vec.as_mut_ptr()).unwrap();
    // SAFETY: the vector's heap memory, moved (not reallocated) into the owner, untouched
    // elsewhere and freed only when the region drops the owner after deregistering.
    let foreign = ctx
        .register_foreign(unsafe { ForeignMemory::new(ptr, 4096, vec) })
        .unwrap();
    assert_eq!(regions(), base + 3);
    drop((mapped, huge, foreign));
    assert_eq!(regions(), base, "each deregistered on drop");
    std::fs::write("/proc/sys/vm/nr_hugepages", "0").unwrap();
    std::fs::remove_file(&path).unwrap();
}
