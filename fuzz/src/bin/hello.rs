//! Fuzz target `hello`: see `rdma_async::__fuzz::hello` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::hello(data);
    });
}
