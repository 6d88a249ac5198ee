//! Fuzz target `grh`: see `rdma_async::__fuzz::grh` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::grh(data);
    });
}
