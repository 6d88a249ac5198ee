//! Fuzz target `private_data`: see `rdma_async::__fuzz::private_data` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::private_data(data);
    });
}
