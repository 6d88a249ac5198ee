//! Fuzz target `conn_data`: see `rdma_async::__fuzz::conn_data` for what it checks.

fn main() {
    afl::fuzz!(|data: &[u8]| {
        rdma_async::__fuzz::conn_data(data);
    });
}
