//! Fuzz target `remote_region`: see `rdma_async::__fuzz::remote_region` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::remote_region(data);
    });
}
